//! The fast path for the daemon's data frames. acpd writes every one as `{"s":S,"a":A,"m":M}`
//! (`window::Window::next_frame`); splitting that form takes a look at its first bytes and its
//! last, and `M` is written to stdout as the bytes that came in. An update in acpd's own form
//! is read off its ends too (`acpd_protocol::update_form`); any other `M` is tokenized once, by the
//! one parse that reads what the shim needs from it (`editor::Tracker::note_daemon`).
//! Frames in any other form go through `window::parse`.

use std::ops::Range;

/// `(S, A, where M is)` of a data frame in acpd's own form; `None` for anything else. `M` is
/// not looked at: the caller parses it (and refuses it if it is not one JSON value).
pub fn split_data(text: &str) -> Option<(u64, u64, Range<usize>)> {
    let b = text.as_bytes();
    let rest = b.strip_prefix(b"{\"s\":")?;
    let (s, rest) = number(rest)?;
    let rest = rest.strip_prefix(b",\"a\":")?;
    let (a, rest) = number(rest)?;
    let rest = rest.strip_prefix(b",\"m\":")?;
    let start = b.len() - rest.len();
    let end = b.len() - 1;
    (rest.len() > 1 && b[end] == b'}').then_some((s, a, start..end))
}

/// A JSON unsigned integer at the start of `b`, and what follows it.
fn number(b: &[u8]) -> Option<(u64, &[u8])> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if n == 0 || (n > 1 && b[0] == b'0') {
        return None;
    }
    let v = std::str::from_utf8(&b[..n]).ok()?.parse().ok()?;
    Some((v, &b[n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_acpds_own_form_is_split() {
        let f = r#"{"s":12,"a":0,"m":{"jsonrpc":"2.0","method":"x"}}"#;
        let (s, a, m) = split_data(f).unwrap();
        assert_eq!((s, a, &f[m]), (12, 0, r#"{"jsonrpc":"2.0","method":"x"}"#));
        for other in [
            r#"{"a":1,"s":2,"m":{}}"#,
            r#"{"s":1,"m":{}}"#,
            r#"{"s":01,"a":0,"m":{}}"#,
            r#"{"s":1,"a":0,"m":}"#,
            r#"{"s":1,"a":0,"m":{} "#,
            r#"{ "s":1,"a":0,"m":{}}"#,
            r#"{"ping":3}"#,
        ] {
            assert_eq!(split_data(other), None, "{other}");
        }
    }
}

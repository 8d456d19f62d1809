//! The form in which acpd writes a journaled `session/update`, shared by the writer (the
//! daemon's splice) and the reader (acp-shim), so that the shim learns an update's session id
//! and seq from its first and last bytes and never tokenizes the update it relays.
//!
//! acpd writes every update it journals as
//! `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":SID,…,"_meta":META}}`:
//! exactly those three top-level members in that order, `sessionId` first in the params and
//! `_meta` last. When the agent sent no `_meta` of its own (the common case), META is
//! `{"acpd":{"seq":N}}` and the text ends with [`SEQ_TAIL_START`]`N}}}}`. Any other text
//! (an agent's own `_meta`, a session id with escapes, a message acpd did not splice) does not
//! match [`read`], and the reader parses it as before: the form is a shortcut, never a
//! requirement.

/// Everything before the session id's string value.
pub const UPDATE_HEAD: &str =
    r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"#;

/// What comes between the last member of the params and the seq, when `_meta` is acpd's alone.
pub const SEQ_TAIL_START: &str = r#","_meta":{"acpd":{"seq":"#;

/// What ends the text after the seq.
pub const SEQ_TAIL_END: &str = "}}}}";

/// Appends `_meta` holding only acpd's seq, and closes the params and the message.
pub fn push_seq_tail(out: &mut String, seq: i64) {
    use std::fmt::Write as _;
    let _ = write!(out, "{SEQ_TAIL_START}{seq}{SEQ_TAIL_END}");
}

/// `(session id, seq)` of an update in acpd's own form, read from its head and tail only.
/// `None` for any other text. For text that came from acpd (it is trusted to be one JSON
/// value): given that, the head fixes the top-level members and the tail can only be the
/// params' last member, so a match cannot be fooled by a string inside the update.
pub fn read(text: &str) -> Option<(&str, i64)> {
    let rest = text.strip_prefix(UPDATE_HEAD)?.strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    if rest.as_bytes()[end] != b'"' {
        return None;
    }
    let sid = &rest[..end];
    let body = rest[end..].strip_suffix(SEQ_TAIL_END)?;
    let digits = body.len() - body.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (before, n) = body.split_at(digits);
    if !before.ends_with(SEQ_TAIL_START) || n.is_empty() || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    Some((sid, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(sid: &str, body: &str, seq: i64) -> String {
        let mut t = format!(r#"{UPDATE_HEAD}"{sid}","update":{body}"#);
        push_seq_tail(&mut t, seq);
        t
    }

    #[test]
    fn what_the_writer_writes_the_reader_reads_and_it_is_one_json_value() {
        let body = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"}}}} \"_meta\""}}"#;
        let t = update("acpd-1", body, 42);
        assert_eq!(read(&t), Some(("acpd-1", 42)));
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        assert_eq!(v["params"]["sessionId"], "acpd-1");
        assert_eq!(v["params"]["_meta"]["acpd"]["seq"], 42);
        assert_eq!(v["params"]["update"]["content"]["text"], "}}}} \"_meta\"");
        assert_eq!(read(&update("s", "{}", 0)), Some(("s", 0)));
    }

    #[test]
    fn any_other_form_is_left_to_the_parse() {
        for other in [
            // The agent's own _meta was merged in.
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{},"_meta":{"x":1,"acpd":{"seq":3}}}}"#,
            // A session id with an escape.
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a\"b","update":{},"_meta":{"acpd":{"seq":3}}}}"#,
            // Not an update; an id; whitespace.
            r#"{"jsonrpc":"2.0","method":"session/request_permission","params":{"sessionId":"s","_meta":{"acpd":{"seq":3}}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":3}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":3}}}} "#,
            // Seqs that are not plain non-negative integers.
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":03}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":-3}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":}}}}"#,
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","_meta":{"acpd":{"seq":99999999999999999999}}}}"#,
            // Cut short.
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"#,
        ] {
            assert_eq!(read(other), None, "{other}");
        }
    }
}

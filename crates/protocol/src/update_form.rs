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
    out.push_str(SEQ_TAIL_START);
    out.push_str(itoa::Buffer::new().format(seq));
    out.push_str(SEQ_TAIL_END);
}

/// An update in acpd's own form, taken apart: `text` is
/// [`UPDATE_HEAD`]`"SESSION_ID"MEMBERS`[`SEQ_TAIL_START`]`SEQ`[`SEQ_TAIL_END`]. MEMBERS is
/// empty or starts with `,` (the params' members after `sessionId`, e.g. `,"update":{…}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts<'a> {
    pub session_id: &'a str,
    pub members: &'a str,
    pub seq: i64,
}

/// `text` taken apart, when it is in acpd's own form; `None` for any other text. For text
/// that came from acpd (it is trusted to be one JSON value): given that, the head fixes the
/// top-level members and the tail can only be the params' last member, so a match cannot be
/// fooled by a string inside the update. [`join`] gives `text` back byte for byte.
pub fn split(text: &str) -> Option<Parts<'_>> {
    let rest = text.strip_prefix(UPDATE_HEAD)?.strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    if rest.as_bytes()[end] != b'"' {
        return None;
    }
    let session_id = &rest[..end];
    let body = rest[end + 1..].strip_suffix(SEQ_TAIL_END)?;
    let digits = body.len() - body.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (before, n) = body.split_at(digits);
    let members = before.strip_suffix(SEQ_TAIL_START)?;
    if n.is_empty() || (n.len() > 1 && n.starts_with('0')) {
        return None;
    }
    Some(Parts {
        session_id,
        members,
        seq: n.parse().ok()?,
    })
}

/// Appends the text [`split`] took apart to `out`.
pub fn join(parts: Parts<'_>, out: &mut String) {
    out.reserve(UPDATE_HEAD.len() + parts.session_id.len() + parts.members.len() + 48);
    out.push_str(UPDATE_HEAD);
    out.push('"');
    out.push_str(parts.session_id);
    out.push('"');
    out.push_str(parts.members);
    push_seq_tail(out, parts.seq);
}

/// `(session id, seq)` of an update in acpd's own form, read from its head and tail only
/// ([`split`]); `None` for any other text.
pub fn read(text: &str) -> Option<(&str, i64)> {
    split(text).map(|p| (p.session_id, p.seq))
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
    fn split_and_join_give_the_text_back_byte_for_byte() {
        let body = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"é \\\" ,\"_meta\":{}"}}"#;
        for (sid, seq) in [("acpd-1", 42), ("s", 0), ("ünïcode", i64::MAX)] {
            let t = update(sid, body, seq);
            let parts = split(&t).expect("acpd's form");
            assert_eq!(parts.session_id, sid);
            assert_eq!(parts.seq, seq);
            assert_eq!(parts.members, format!(r#","update":{body}"#));
            let mut back = String::new();
            join(parts, &mut back);
            assert_eq!(back, t);
        }
        // Params holding nothing but the session id.
        let mut bare = format!(r#"{UPDATE_HEAD}"s""#);
        push_seq_tail(&mut bare, 7);
        let parts = split(&bare).expect("acpd's form");
        assert_eq!(parts.members, "");
        let mut back = String::new();
        join(parts, &mut back);
        assert_eq!(back, bare);
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
            assert_eq!(split(other), None, "{other}");
        }
    }
}

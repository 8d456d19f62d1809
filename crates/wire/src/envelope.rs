//! Notifications read by their envelope only, in one pass: `method` and the params' top-level
//! members are found as spans of the frame the peer sent, which is kept whole, so a stream of
//! updates is neither built into `serde_json::Value` trees nor copied nor scanned again.
//!
//! Anything that is not a plain notification (requests, responses, `$/cancel_request`,
//! malformed input) takes the full parse in `msg.rs`, which also decides the error reply.
//!
//! The one-pass read never reads a frame otherwise than the full parse: what
//! `RawNotification::read` accepts is the same notification (method, params) to
//! `Message::parse`, and its member spans are exactly the params' members; the one difference
//! is a number beyond f64, which only the raw read passes on as sent
//! (`tests::raw_and_full_parses_agree`, `fuzz/envelope`).

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::members::{Members, Pairs, member_spans, push_spans, span_in};
use super::msg::Notification;

/// A notification whose params are the peer's bytes, validated as JSON but not parsed.
#[derive(Debug, Clone)]
pub struct RawNotification {
    /// Holds the method and the params: the peer's whole frame, or (for a notification that
    /// took the full parse) the two laid end to end.
    text: Box<str>,
    /// `[method_start, method_end, params_start, params_end]` in `text` (an empty params span:
    /// no params), then the params' member spans (`Members`) when they are known. One box, so
    /// an `AgentEvent` stays small.
    spans: Box<[u32]>,
}

impl RawNotification {
    /// `text` as a plain notification, read by its envelope and kept whole; `Err(text)` when
    /// it is anything else or not readable this way (`Message::parse` then reads it exactly).
    pub fn read(text: String) -> Result<RawNotification, String> {
        match spans_of(&text) {
            Some(spans) => Ok(RawNotification {
                text: text.into_boxed_str(),
                spans: spans.into_boxed_slice(),
            }),
            None => Err(text),
        }
    }

    pub fn method(&self) -> &str {
        &self.text[self.spans[0] as usize..self.spans[1] as usize]
    }

    /// An object or an array, as sent (`null` and absent params are `None`).
    pub fn params(&self) -> Option<&str> {
        let (start, end) = (self.spans[2] as usize, self.spans[3] as usize);
        (start < end).then(|| &self.text[start..end])
    }

    /// The params' top-level members, found when the frame was read. `None` when they are not
    /// known: params that are absent, an array, an empty object, or that have a member name
    /// with escapes; the caller then reads `params()` its own exact way.
    pub fn members(&self) -> Option<Members<'_>> {
        (self.spans.len() > 4).then(|| Members::new(&self.text, &self.spans[4..]))
    }

    /// The params as a tree, for the rare notification that is interpreted member by member.
    pub fn params_value(&self) -> Option<Value> {
        match serde_json::from_str(self.params()?) {
            Ok(v) => Some(v),
            // Valid JSON serde_json cannot hold (a number beyond f64): read as absent.
            Err(e) => {
                tracing::debug!(error = %e, method = %self.method(), "params cannot be read");
                None
            }
        }
    }

    pub fn into_notification(self) -> Notification {
        Notification {
            params: self.params_value(),
            method: self.method().to_owned(),
        }
    }
}

impl From<Notification> for RawNotification {
    fn from(n: Notification) -> Self {
        let mut text = n.method;
        let method_end = text.len();
        if let Some(p) = &n.params {
            text.push_str(&p.to_string());
        }
        let fits = |n: usize| u32::try_from(n).ok();
        let (Some(m), Some(end)) = (fits(method_end), fits(text.len())) else {
            // Over 4 GiB: no transport carries such a message (`max_message_bytes` is far
            // below); kept as a notification without params rather than a panic.
            tracing::error!(
                len = text.len(),
                "notification too large to index; params dropped"
            );
            text.truncate(method_end);
            return RawNotification {
                text: text.into_boxed_str(),
                spans: Box::new([0, 0, 0, 0]),
            };
        };
        let mut spans = vec![0, m, m, end];
        if let Some(member) = member_spans(&text[method_end..]) {
            spans.extend(member.into_iter().map(|i| i + m));
        }
        RawNotification {
            text: text.into_boxed_str(),
            spans: spans.into_boxed_slice(),
        }
    }
}

/// The members of a frame that decide what it is. Borrowed: a method or params member name
/// with escapes fails this parse and takes the full one.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    /// Present even when `null`: `"id": null` makes a (refused) request, not a notification.
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a str>,
    /// `null` reads as absent; anything but an object with members fails the parse.
    #[serde(borrow, default)]
    params: Option<Pairs<'a>>,
}

/// A member that is there, whatever its value (`Option` alone reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The spans `RawNotification` keeps for `text`; `None` when it is not a plain notification
/// this pass can index.
fn spans_of(text: &str) -> Option<Vec<u32>> {
    let env: Envelope = serde_json::from_str(text).ok()?;
    if env.id.is_some() || env.jsonrpc.is_some_and(|v| v.get() != "\"2.0\"") {
        return None;
    }
    let method = env.method?;
    if method == "$/cancel_request" {
        return None;
    }
    let (m0, m1) = span_in(text, method)?;
    let Some(pairs) = env.params else {
        return Some(vec![m0, m1, 0, 0]);
    };
    let (p0, p1) = object_span(text, &pairs)?;
    let mut spans = Vec::with_capacity(4 + 4 * pairs.0.len());
    spans.extend_from_slice(&[m0, m1, p0, p1]);
    push_spans(&mut spans, text, &pairs)?;
    Some(spans)
}

/// The span of the object whose members are `pairs`, from its `{` to its `}`: the text was
/// just validated, so only whitespace stands between the braces and the first name's quote
/// and the last value. `None` (the full parse) for an empty object, which has neither.
fn object_span(text: &str, pairs: &Pairs) -> Option<(u32, u32)> {
    let (first, last) = (pairs.0.first()?.0, pairs.last_value()?.get());
    let (name, _) = span_in(text, first)?;
    let (_, value) = span_in(text, last)?;
    let bytes = text.as_bytes();
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let before = &bytes[..(name as usize).checked_sub(1)?];
    let open = before.iter().rposition(|b| !ws(b))?;
    let after = &bytes[value as usize..];
    let close = value as usize + after.iter().position(|b| !ws(b))?;
    (bytes[name as usize - 1] == b'"' && bytes[open] == b'{' && bytes[close] == b'}')
        .then_some(())?;
    Some((u32::try_from(open).ok()?, u32::try_from(close + 1).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Message;

    fn read(text: &str) -> Option<RawNotification> {
        RawNotification::read(text.to_owned()).ok()
    }

    #[test]
    fn plain_notifications_are_read_by_their_envelope() {
        let text = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{"x":[1,2]}}}"#;
        let n = read(text).unwrap();
        assert_eq!(n.method(), "session/update");
        assert_eq!(
            n.params(),
            Some(r#"{"sessionId":"a","update":{"x":[1,2]}}"#)
        );
        let m = n.members().unwrap();
        assert_eq!(m.get("sessionId"), Some(r#""a""#));
        assert_eq!(m.get("update"), Some(r#"{"x":[1,2]}"#));
        // Whitespace around the params and their members stays outside the spans.
        let n = read("{ \"params\" :\t{ \"b\" : [ ] ,\"a\":1\n}\r, \"method\":\"m\" }").unwrap();
        assert_eq!(n.params(), Some("{ \"b\" : [ ] ,\"a\":1\n}"));
        assert_eq!(
            n.members().unwrap().iter().collect::<Vec<_>>(),
            [("b", "[ ]"), ("a", "1")]
        );
        let n = read(r#"{"method":"a","params":null}"#).unwrap();
        assert_eq!((n.method(), n.params().is_none()), ("a", true));
        assert!(n.members().is_none());
    }

    #[test]
    fn everything_else_takes_the_full_parse() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"a"}"#,
            r#"{"jsonrpc":null,"method":"a"}"#,
            r#"{"jsonrpc":"1.0","method":"a"}"#,
            r#"{"jsonrpc":"2.0","method":"a","params":3}"#,
            r#"{"jsonrpc":"2.0","method":7}"#,
            r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1}}"#,
            r#"{"jsonrpc":"2.0","method":"a","method":"b"}"#,
            r#"{"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"2.0","method":"a","params":{"#,
            // Readable, but not by spans: the full parse reads them exactly.
            r#"{"method":"a\u002fb"}"#,
            r#"{"method":"a","params":{"s\u0041":1}}"#,
            r#"{"method":"a","params":[1]}"#,
            r#"{"method":"a","params":{}}"#,
            "[]",
            "nope",
        ] {
            assert!(read(text).is_none(), "{text}");
        }
    }

    /// What `peer` does: the envelope first, else the full parse made into the same form.
    fn either(text: &str) -> RawNotification {
        read(text).unwrap_or_else(|| match Message::parse(text) {
            Ok(Message::Notification(n)) => n.into(),
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn raw_and_full_parses_agree() {
        for text in [
            r#"{"jsonrpc":"2.0","method":"m","params":{"b":1,"a":[true,null,"\u00e9"]}}"#,
            r#"{"method":"a\u002fb","params":{"x":"y"}}"#,
            r#"{"method":"m","params":[1,{"a":2}]}"#,
            r#"{"method":"m","params":{}}"#,
            r#"{"method":"m"}"#,
        ] {
            let n = either(text);
            let Ok(Message::Notification(full)) = Message::parse(text) else {
                panic!()
            };
            assert_eq!(n.clone().into_notification(), full, "{text}");
            // Members, where known, are the params' own.
            if let (Some(m), Some(serde_json::Value::Object(o))) = (n.members(), &full.params) {
                assert_eq!(m.iter().count(), o.len(), "{text}");
                for (name, value) in m.iter() {
                    let v: serde_json::Value = serde_json::from_str(value).unwrap();
                    assert_eq!(o[name], v, "{text}");
                }
            }
        }
        let n = either(r#"{"method":"a\u002fb","params":{"x":"y"}}"#);
        assert_eq!((n.method(), n.params()), ("a/b", Some(r#"{"x":"y"}"#)));
        assert_eq!(n.members().unwrap().get("x"), Some(r#""y""#));
    }
}

//! Notifications read by their envelope only: `method` parsed, `params` kept as the raw JSON
//! the peer sent, so a stream of updates is never built into `serde_json::Value` trees.
//!
//! Anything that is not a plain notification (requests, responses, `$/cancel_request`,
//! malformed input) takes the full parse in `msg.rs`, which also decides the error reply.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::msg::Notification;

/// A notification whose params are the peer's bytes, validated as JSON but not parsed.
#[derive(Debug, Clone)]
pub struct RawNotification {
    pub method: String,
    /// An object or an array, as sent (`null` and absent params are `None`).
    pub params: Option<Box<RawValue>>,
}

impl RawNotification {
    /// The params as a tree, for the rare notification that is interpreted member by member.
    pub fn params_value(&self) -> Option<Value> {
        let raw = self.params.as_ref()?;
        match serde_json::from_str(raw.get()) {
            Ok(v) => Some(v),
            // Valid JSON serde_json cannot hold (a number beyond f64): read as absent.
            Err(e) => {
                tracing::debug!(error = %e, method = %self.method, "params cannot be read");
                None
            }
        }
    }

    pub fn into_notification(self) -> Notification {
        Notification {
            params: self.params_value(),
            method: self.method,
        }
    }
}

impl From<Notification> for RawNotification {
    fn from(n: Notification) -> Self {
        let params = n
            .params
            .and_then(|p| serde_json::value::to_raw_value(&p).ok());
        RawNotification {
            method: n.method,
            params,
        }
    }
}

/// The string member `name` at the top level of the JSON object `object`, read up to that
/// member only: what follows it is not scanned at all, so a caller that needs one leading
/// member of a long message (an update's `sessionId`, its `sessionUpdate`) does not read the
/// rest. For text already validated as JSON. `None` when absent, not a string, or not an object.
pub fn str_member(object: &str, name: &str) -> Option<String> {
    match leading_str_member(object, name) {
        Some(v) => Some(v.to_owned()),
        None => str_member_scan(object, name),
    }
}

/// The common case of `str_member`, without serde: `name` is the object's first member, written
/// without escapes, and its value is a string without escapes. `None` means "not this shape"
/// (the caller scans), never "absent". Only for text already validated as JSON, so a string
/// that ends at the first `"` holds no control characters.
fn leading_str_member<'t>(object: &'t str, name: &str) -> Option<&'t str> {
    let ws = |s: &'t str| s.trim_start_matches([' ', '\t', '\n', '\r']);
    let rest = ws(object).strip_prefix('{')?;
    let rest = ws(rest).strip_prefix('"')?.strip_prefix(name)?;
    let rest = ws(rest.strip_prefix('"')?).strip_prefix(':')?;
    let value = ws(rest).strip_prefix('"')?;
    let end = value.find(['"', '\\'])?;
    (value.as_bytes()[end] == b'"').then(|| &value[..end])
}

/// `str_member` through serde: any member order, escapes decoded.
fn str_member_scan(object: &str, name: &str) -> Option<String> {
    use serde::Deserializer as _;
    use serde::de::{Error, IgnoredAny, MapAccess, Visitor};

    struct Find<'n, 's>(&'n str, &'s mut Option<String>);
    impl<'de> Visitor<'de> for Find<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    *self.1 = Some(map.next_value::<String>()?);
                    // Not a failure: the only way to leave the object before its end.
                    return Err(A::Error::custom("found"));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut found = None;
    let mut de = serde_json::Deserializer::from_str(object);
    let _ = de.deserialize_map(Find(name, &mut found));
    found
}

/// The members of a frame that decide what it is. Borrowed where the text has no escapes;
/// unknown members are skipped (still validated as JSON).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    /// Present even when `null`: `"id": null` makes a (refused) request, not a notification.
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// A member that is there, whatever its value (`Option` alone reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// `text` as a plain notification, read by its envelope; `None` when it is anything else or
/// not valid as one (the full parse then answers it as it deserves).
pub(crate) fn notification(text: &str) -> Option<RawNotification> {
    let env: Envelope = serde_json::from_str(text).ok()?;
    if env.id.is_some() || env.jsonrpc.is_some_and(|v| v.get() != "\"2.0\"") {
        return None;
    }
    let method = env.method?;
    if method == "$/cancel_request" {
        return None;
    }
    let params = match env.params {
        None => None,
        Some(p) if p.get() == "null" => None,
        Some(p) if p.get().starts_with(['{', '[']) => Some(p.to_owned()),
        Some(_) => return None,
    };
    Some(RawNotification {
        method: method.into_owned(),
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::Message;

    #[test]
    fn plain_notifications_are_read_by_their_envelope() {
        let n = notification(
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{"x":[1,2]}}}"#,
        )
        .unwrap();
        assert_eq!(n.method, "session/update");
        assert_eq!(
            n.params.unwrap().get(),
            r#"{"sessionId":"a","update":{"x":[1,2]}}"#
        );
        let n = notification(r#"{"method":"a\u002fb","params":null}"#).unwrap();
        assert_eq!((n.method.as_str(), n.params.is_none()), ("a/b", true));
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
            "[]",
            "nope",
        ] {
            assert!(notification(text).is_none(), "{text}");
        }
    }

    #[test]
    fn raw_and_full_parses_agree() {
        let text = r#"{"jsonrpc":"2.0","method":"m","params":{"b":1,"a":[true,null,"\u00e9"]}}"#;
        let raw = notification(text).unwrap().into_notification();
        let Ok(Message::Notification(full)) = Message::parse(text) else {
            panic!()
        };
        assert_eq!(raw, full);
    }

    #[test]
    fn a_string_member_is_found_at_the_top_level_only() {
        let m = |t: &str, n: &str| str_member(t, n);
        assert_eq!(
            m(r#"{"sessionId":"a","update":{"x":[1,2]}}"#, "sessionId").as_deref(),
            Some("a")
        );
        assert_eq!(
            m(
                r#"{"update":{"sessionId":"no"},"sessionId":"b"}"#,
                "sessionId"
            )
            .as_deref(),
            Some("b")
        );
        assert_eq!(
            m(r#"{"s\u0041":"c\u0041\n"}"#, "sA").as_deref(),
            Some("cA\n")
        );
        assert_eq!(m(r#"{"update":{"sessionId":"nested"}}"#, "sessionId"), None);
        assert_eq!(m(r#"{"sessionId":7}"#, "sessionId"), None);
        assert_eq!(m("[1]", "sessionId"), None);
        // Stops at the member: what follows is not read.
        assert_eq!(
            m(r#"{"a":"x", this is not JSON"#, "a").as_deref(),
            Some("x")
        );
        // The leading-member shortcut agrees with the scan wherever it answers.
        for (text, name) in [
            (r#"{"sessionId":"a","update":{}}"#, "sessionId"),
            (r#" { "sessionId" : "a b" , "x":1}"#, "sessionId"),
            (r#"{"sessionId":"a\"b","x":1}"#, "sessionId"),
            (r#"{"sessionIdX":"a"}"#, "sessionId"),
            (r#"{"session\u0049d":"a"}"#, "sessionId"),
            (r#"{"sessionId":null,"sessionId":"b"}"#, "sessionId"),
            (r#"{"sessionUpdate":"plan","entries":[]}"#, "sessionUpdate"),
            (r#"{"sessionId":"","x":1}"#, "sessionId"),
        ] {
            assert_eq!(
                str_member(text, name),
                str_member_scan(text, name),
                "{text}"
            );
        }
        assert_eq!(leading_str_member(r#"{"a":"x\"y"}"#, "a"), None);
        assert_eq!(leading_str_member(r#"{"ab":"x"}"#, "a"), None);
        assert_eq!(leading_str_member("\n{\t\"a\" :\r\"x\"}", "a"), Some("x"));
    }
}

//! Answers for editor lines the shim cannot relay (overlong, not UTF-8, not JSON, JSON that is
//! not an object): a JSON-RPC error written to the editor in the daemon's place, with the
//! request's id when a cheap scan of the line's start finds one, else `null`. The shim lives
//! on; nothing is framed.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use acpd_wire::lines::Line;

/// The error line for an editor line that cannot be relayed; `None` for a relayable one.
pub fn answer(line: &Line, max_line: usize) -> Option<String> {
    let (code, message, id) = match line {
        Line::Text(_) => return None,
        Line::TooLarge { size, head } => (
            -32600,
            format!("message of at least {size} bytes is over acp-shim's limit of {max_line}"),
            find_id(head),
        ),
        Line::NotUtf8 => (-32700, "Parse error: invalid UTF-8".to_owned(), None),
    };
    Some(error(id.as_deref(), code, &message))
}

/// The -32600 answer for a line the daemon would refuse (over its `max_message_bytes`): sent,
/// it would cost the link (far over, the daemon closes the socket, and a resend after the
/// reconnect would do the same again, forever). `None` when it fits.
pub fn over_daemon_limit(line: &Line, daemon_max: usize) -> Option<String> {
    let Line::Text(text) = line else { return None };
    if text.len() <= daemon_max {
        return None;
    }
    let message = format!(
        "message of {} bytes is over acpd's limit of {daemon_max} (max_message_bytes); acp-shim did not send it",
        text.len()
    );
    Some(error(find_id(text.as_bytes()).as_deref(), -32600, &message))
}

/// The -32700 answer for a line that is not JSON.
pub fn parse_error(line: &str, e: &serde_json::Error) -> String {
    let id = find_id(line.as_bytes());
    error(id.as_deref(), -32700, &format!("Parse error: {e}"))
}

/// The -32600 answer (`id: null`) for a line that is JSON but not a JSON-RPC object: a scalar,
/// `null`, or an array (a batch, which ACP over acpd does not support; one answer for the
/// whole). `text` is known to be one JSON value, so its first byte tells. `None` for an
/// object, which is relayed (acpd answers an object that is not JSON-RPC on the link).
pub fn not_an_object(text: &str) -> Option<String> {
    let message = match text.trim_start().as_bytes().first() {
        Some(b'{') => return None,
        Some(b'[') => "batches are not supported; acp-shim did not send it",
        _ => "a JSON-RPC message is a JSON object; acp-shim did not send it",
    };
    Some(error(None, -32600, message))
}

fn error(raw_id: Option<&str>, code: i64, message: &str) -> String {
    let message = serde_json::Value::String(message.to_owned());
    let id = raw_id.unwrap_or("null");
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}}}}}"#)
}

/// The raw JSON of the top-level `"id"` member of what may be the start of a JSON object, if it
/// is a number or a string and comes before the text breaks off or goes wrong. One pass over
/// the members before it, nothing kept.
pub fn find_id(text: &[u8]) -> Option<String> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(text);
    // The scan stops at the id (or at the first error): the result is then an error by design.
    let _ = de.deserialize_map(IdScan(&mut found));
    found
}

struct IdScan<'a>(&'a mut Option<String>);

impl<'de> Visitor<'de> for IdScan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Key>()? {
            if key.0 {
                *self.0 = Some(map.next_value_seed(IdValue)?);
                return Ok(());
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// A member name: whether it is `id` (read without allocating).
struct Key(bool);

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(Key(s == "id"))
            }
        }
        d.deserialize_str(V)
    }
}

/// A JSON-RPC id as raw JSON: a number or a string, anything else refused.
struct IdValue;

impl<'de> DeserializeSeed<'de> for IdValue {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for IdValue {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or a string")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<String, E> {
        Ok(n.to_string())
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<String, E> {
        Ok(n.to_string())
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<String, E> {
        serde_json::Number::from_f64(n)
            .map(|n| n.to_string())
            .ok_or_else(|| E::custom("not a finite number"))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(serde_json::Value::String(s.to_owned()).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_found_before_the_text_breaks_off() {
        let id = |t: &str| find_id(t.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            id(r#"{"method":"x","params":{"n":[1,2,{"id":9}]},"id":"a\"b","#).as_deref(),
            Some(r#""a\"b""#)
        );
        assert_eq!(id(r#"{"method":"x","params":{"text":"lo"#), None);
        assert_eq!(id(r#"{"id":{"no":1}}"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0",,"id":3}"#), None);
        assert_eq!(id(r#"[1,2]"#), None);
        assert_eq!(id(r#"{"id":-2.5,"#).as_deref(), Some("-2.5"));
    }

    #[test]
    fn answers_are_json_rpc_errors() {
        let big = Line::TooLarge {
            size: 99,
            head: br#"{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"#.to_vec(),
        };
        let v: serde_json::Value = serde_json::from_str(&answer(&big, 10).unwrap()).unwrap();
        assert_eq!(v["id"], 4);
        assert_eq!(v["error"]["code"], -32600);
        let v: serde_json::Value =
            serde_json::from_str(&answer(&Line::NotUtf8, 10).unwrap()).unwrap();
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (serde_json::Value::Null, (-32700).into())
        );
        assert_eq!(answer(&Line::Text("{}".into()), 10), None);
    }

    #[test]
    fn json_that_is_not_an_object_is_answered_with_id_null() {
        for line in [
            "null",
            "42",
            r#""x""#,
            "true",
            "[]",
            " [1]",
            r#"[{"id":3}]"#,
        ] {
            let a = not_an_object(line).unwrap_or_else(|| panic!("{line} relayed"));
            let v: serde_json::Value = serde_json::from_str(&a).unwrap();
            assert_eq!(v["id"], serde_json::Value::Null, "{line}");
            assert_eq!(v["error"]["code"], -32600, "{line}");
        }
        assert!(not_an_object(r#" {"id":1}"#).is_none());
    }
}

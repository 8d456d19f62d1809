//! The top-level members of a JSON object, found in one pass and kept as spans of its text, so
//! that an update's `sessionId` is read and its params spliced without parsing them again.
//!
//! Also `str_member`: one string member of an object, read without scanning past it.

use std::borrow::Cow;

use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// The members of an object in the order they were sent, as spans of the text that holds it:
/// for member i, `spans[4i..4i + 4]` is `[name_start, name_end, value_start, value_end]`. Names
/// are free of escapes (so the span is the name itself); values are raw JSON. A repeated name
/// keeps its first place and its last value, as a map would.
#[derive(Debug, Clone, Copy)]
pub struct Members<'a> {
    text: &'a str,
    spans: &'a [u32],
}

impl<'a> Members<'a> {
    pub(crate) fn new(text: &'a str, spans: &'a [u32]) -> Members<'a> {
        Members { text, spans }
    }

    /// `(name, raw value)` in the order sent.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let text = self.text;
        self.spans.chunks_exact(4).map(move |s| {
            let [n0, n1, v0, v1] = [s[0], s[1], s[2], s[3]].map(|i| i as usize);
            (&text[n0..n1], &text[v0..v1])
        })
    }

    /// The raw value of member `name`.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The value of member `name` when it is a string; borrowed unless it carries escapes.
    pub fn string(&self, name: &str) -> Option<Cow<'a, str>> {
        let raw = self.get(name)?;
        let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
        if inner.contains('\\') {
            serde_json::from_str(raw).ok().map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(inner))
        }
    }
}

/// The member spans of `object`, a JSON object, relative to its first byte: `None` when it is
/// not valid JSON, not an object, or a member name carries escapes.
pub(crate) fn member_spans(object: &str) -> Option<Vec<u32>> {
    let pairs: Pairs = serde_json::from_str(object).ok()?;
    let mut spans = Vec::with_capacity(4 * pairs.0.len());
    push_spans(&mut spans, object, &pairs)?;
    Some(spans)
}

/// An object's members as borrowed slices of the text being parsed, in the order sent; a
/// repeated name keeps its first place and its last value. Fails (so the caller takes a slower
/// exact path) on anything but an object whose names are free of escapes.
pub(crate) struct Pairs<'a>(pub Vec<(&'a str, &'a RawValue)>);

impl<'a> Pairs<'a> {
    /// The value written last, wherever its member stands: it ends the object. Every name's
    /// last value is in the list, so it is the one furthest into the text.
    pub fn last_value(&self) -> Option<&'a RawValue> {
        self.0
            .iter()
            .map(|(_, v)| *v)
            .max_by_key(|v| v.get().as_ptr())
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Pairs<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs<'a>, A::Error> {
                let mut list: Vec<(&'a str, &'a RawValue)> = Vec::with_capacity(4);
                while let Some((name, value)) = map.next_entry::<&'a str, &'a RawValue>()? {
                    match list.iter_mut().find(|(n, _)| *n == name) {
                        Some(m) => m.1 = value,
                        None => list.push((name, value)),
                    }
                }
                Ok(Pairs(list))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Appends the spans of `pairs`, borrowed from `base`, relative to `base`. `None` when an
/// offset does not fit in a `u32` (the caller takes the exact path).
pub(crate) fn push_spans(out: &mut Vec<u32>, base: &str, pairs: &Pairs) -> Option<()> {
    for (name, value) in &pairs.0 {
        let (n0, n1) = span_in(base, name)?;
        let (v0, v1) = span_in(base, value.get())?;
        out.extend_from_slice(&[n0, n1, v0, v1]);
    }
    Some(())
}

/// Where `part`, a slice of `base`, sits in it.
pub(crate) fn span_in(base: &str, part: &str) -> Option<(u32, u32)> {
    let start = (part.as_ptr() as usize).checked_sub(base.as_ptr() as usize)?;
    let end = start + part.len();
    (end <= base.len()).then_some(())?;
    Some((u32::try_from(start).ok()?, u32::try_from(end).ok()?))
}

/// The string member `name` at the top level of the JSON object `object`, read up to that
/// member only: what follows it is not scanned at all, so a caller that needs one leading
/// member of a long message (an update's `sessionUpdate`) does not read the rest. For text
/// already validated as JSON. `None` when absent, not a string, or not an object.
pub fn str_member<'t>(object: &'t str, name: &str) -> Option<Cow<'t, str>> {
    match leading_str_member(object, name) {
        Some(v) => Some(Cow::Borrowed(v)),
        None => str_member_scan(object, name).map(Cow::Owned),
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
    use serde::de::{Error, IgnoredAny};

    struct Find<'n, 's>(&'n str, &'s mut Option<String>);
    impl<'de> Visitor<'de> for Find<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn members(text: &str) -> Option<Vec<(String, String)>> {
        let spans = member_spans(text)?;
        let m = Members::new(text, &spans);
        Some(m.iter().map(|(n, v)| (n.into(), v.into())).collect())
    }

    #[test]
    fn members_are_found_in_order_with_raw_values() {
        let m = members(r#" { "b" : 1 ,"a":[true, null,"\u00e9"], "c":{"x":{}} } "#).unwrap();
        let pairs: Vec<(&str, &str)> = m.iter().map(|(n, v)| (&**n, &**v)).collect();
        assert_eq!(
            pairs,
            [
                ("b", "1"),
                ("a", r#"[true, null,"\u00e9"]"#),
                ("c", r#"{"x":{}}"#)
            ]
        );
        // A repeated name keeps its first place and its last value.
        let m = members(r#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(m, [("a".into(), "3".into()), ("b".into(), "2".into())]);
        assert_eq!(members("{}").unwrap(), []);
    }

    #[test]
    fn escaped_names_and_non_objects_have_no_members() {
        for text in [
            r#"{"s\u0041":1}"#,
            "[1]",
            "3",
            "null",
            r#"{"a":1"#,
            r#"{"a":1}x"#,
        ] {
            assert!(members(text).is_none(), "{text}");
        }
    }

    #[test]
    fn a_string_value_is_borrowed_unless_it_has_escapes() {
        let text = r#"{"sessionId":"a b","n":7,"e":"x\"y"}"#;
        let spans = member_spans(text).unwrap();
        let m = Members::new(text, &spans);
        assert!(matches!(m.string("sessionId"), Some(Cow::Borrowed("a b"))));
        assert_eq!(m.string("n"), None);
        assert!(matches!(m.string("e"), Some(Cow::Owned(e)) if e == "x\"y"));
        assert_eq!(m.get("e"), Some(r#""x\"y""#));
        assert_eq!(m.string("absent"), None);
    }

    #[test]
    fn a_string_member_is_found_at_the_top_level_only() {
        let m = |t: &str, n: &str| str_member(t, n).map(Cow::into_owned);
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
            assert_eq!(m(text, name), str_member_scan(text, name), "{text}");
        }
        assert_eq!(leading_str_member(r#"{"a":"x\"y"}"#, "a"), None);
        assert_eq!(leading_str_member(r#"{"ab":"x"}"#, "a"), None);
        assert_eq!(leading_str_member("\n{\t\"a\" :\r\"x\"}", "a"), Some("x"));
    }
}

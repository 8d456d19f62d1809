//! The journal entry of one `session/update`, made from the agent's raw params by splicing:
//! the params' members are split as raw JSON, `sessionId` is replaced by acpd's, `_meta.acpd`
//! gets the seq, and the update body is copied through byte for byte, never parsed.
//!
//! Pure: no I/O, unit-tested below. Params whose member names carry escapes (no agent writes
//! them, but JSON allows it) take a slower exact path through `serde_json::Value`.

use acpd_wire::update_form;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// Kinds whose body changes the session row (`Session::observe`): only these are parsed.
const OBSERVED: [&str; 3] = [
    "session_info_update",
    "current_mode_update",
    "config_option_update",
];

pub(super) struct Spliced {
    /// The whole notification, as journaled and sent.
    pub text: String,
    /// `update.sessionUpdate`, or "unknown".
    pub kind: String,
    /// The raw update body, kept only for the kinds `observe` reads.
    update: Option<Box<RawValue>>,
}

impl Spliced {
    /// The update as a tree, for the kinds that change the session row.
    pub fn update_value(&self) -> Option<Value> {
        serde_json::from_str(self.update.as_ref()?.get()).ok()
    }
}

/// `None` when `params` is not a JSON object.
pub(super) fn splice(params: &RawValue, session_id: &str, seq: i64) -> Option<Spliced> {
    match serde_json::from_str::<Members>(params.get()) {
        Ok(members) => Some(fast(&members, session_id, seq)),
        Err(_) => slow(params, session_id, seq),
    }
}

/// The params' members in the agent's order, values as raw JSON; a repeated name keeps its
/// first place and its last value (as a map would). Names must be free of escapes (borrowed),
/// else deserializing fails and `slow` takes over.
struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'a> Members<'a> {
    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members<'de>, A::Error> {
                let mut members: Vec<(&'de str, &'de RawValue)> = Vec::with_capacity(4);
                while let Some((name, value)) = map.next_entry::<&'de str, &'de RawValue>()? {
                    match members.iter_mut().find(|(n, _)| *n == name) {
                        Some(m) => m.1 = value,
                        None => members.push((name, value)),
                    }
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

fn fast(members: &Members, session_id: &str, seq: i64) -> Spliced {
    let update = members.get("update");
    // Read up to `sessionUpdate` only (agents write it first): the body is not scanned again.
    let kind = update
        .and_then(|u| acpd_wire::str_member(u.get(), "sessionUpdate"))
        .unwrap_or_else(|| "unknown".to_owned());
    let mut text = String::with_capacity(params_len(members) + session_id.len() + 96);
    // `acpd_wire::update_form`: acp-shim reads the session id and seq off this head and tail.
    text.push_str(update_form::UPDATE_HEAD);
    push_json_str(&mut text, session_id);
    for (name, value) in &members.0 {
        if matches!(*name, "sessionId" | "_meta") {
            continue;
        }
        text.push(',');
        push_json_str(&mut text, name);
        text.push(':');
        text.push_str(value.get());
    }
    match members.get("_meta") {
        // The common case: nothing of the agent's to merge with.
        None => update_form::push_seq_tail(&mut text, seq),
        Some(meta) => {
            let theirs = serde_json::from_str::<Map<String, Value>>(meta.get()).ok();
            text.push_str(r#","_meta":"#);
            text.push_str(&merged_meta(theirs, seq).to_string());
            text.push_str("}}");
        }
    }
    Spliced {
        text,
        update: update
            .filter(|_| OBSERVED.contains(&kind.as_str()))
            .map(|u| u.to_owned()),
        kind,
    }
}

/// Member names with escapes: exact, through a tree.
fn slow(params: &RawValue, session_id: &str, seq: i64) -> Option<Spliced> {
    let Ok(Value::Object(mut params)) = serde_json::from_str::<Value>(params.get()) else {
        return None;
    };
    params.insert("sessionId".into(), Value::String(session_id.to_owned()));
    let theirs = match params.remove("_meta") {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    params.insert("_meta".into(), merged_meta(theirs, seq));
    let update = params.get("update");
    let kind = update
        .and_then(|u| u.get("sessionUpdate"))
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let update = update
        .filter(|_| OBSERVED.contains(&kind.as_str()))
        .and_then(|u| serde_json::value::to_raw_value(u).ok());
    let text =
        json!({ "jsonrpc": "2.0", "method": "session/update", "params": params }).to_string();
    Some(Spliced { text, kind, update })
}

/// The agent's `_meta` (an object, else replaced) with `acpd: {seq}` set.
fn merged_meta(theirs: Option<Map<String, Value>>, seq: i64) -> Value {
    let mut m = theirs.unwrap_or_default();
    m.insert("acpd".into(), json!({ "seq": seq }));
    Value::Object(m)
}

fn params_len(members: &Members) -> usize {
    members
        .0
        .iter()
        .map(|(k, v)| k.len() + v.get().len() + 4)
        .sum()
}

/// Writes `s` as a JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&Value::String(s.to_owned()).to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn params_of(text: &str) -> Value {
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["method"], "session/update");
        v["params"].clone()
    }

    #[test]
    fn the_session_id_and_seq_are_written_in_and_the_body_copied_verbatim() {
        let body = r#"{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"h\u00e9 \"x\""}}"#;
        let p = raw(&format!(r#"{{"sessionId":"agent-7","update":{body}}}"#));
        let s = splice(&p, "acpd-1", 42).unwrap();
        assert_eq!(s.kind, "agent_message_chunk");
        assert!(s.text.contains(body), "{}", s.text);
        assert!(s.update_value().is_none(), "chunks are never parsed");
        let params = params_of(&s.text);
        assert_eq!(params["sessionId"], "acpd-1");
        assert_eq!(params["_meta"], json!({"acpd": {"seq": 42}}));
        // acp-shim's shortcut reads the same off the text's ends.
        assert_eq!(update_form::read(&s.text), Some(("acpd-1", 42)));
    }

    #[test]
    fn the_agents_meta_and_other_members_are_kept() {
        let p = raw(
            r#"{"update":{"sessionUpdate":"session_info_update","title":"T"},"sessionId":"a","_meta":{"theirs":[1],"acpd":"spoofed"},"extra":true}"#,
        );
        let s = splice(&p, "b", 3).unwrap();
        let params = params_of(&s.text);
        assert_eq!(params["_meta"], json!({"theirs": [1], "acpd": {"seq": 3}}));
        assert_eq!(params["extra"], true);
        assert_eq!(s.update_value().unwrap()["title"], "T");
    }

    #[test]
    fn escaped_member_names_take_the_exact_path() {
        let p = raw(r#"{"sessionI\u0064":"a","upd\u0061te":{"sessionUpdate":"plan"},"_meta":7}"#);
        let s = splice(&p, "b\"q", 9).unwrap();
        let params = params_of(&s.text);
        assert_eq!(params["sessionId"], "b\"q");
        assert_eq!(params["update"]["sessionUpdate"], "plan");
        assert_eq!(s.kind, "plan");
        assert_eq!(params["_meta"], json!({"acpd": {"seq": 9}}));
    }

    #[test]
    fn params_that_are_not_an_object_are_refused() {
        assert!(splice(&raw("[1,2]"), "b", 1).is_none());
        let s = splice(&raw("{}"), "b", 1).unwrap();
        assert_eq!(s.kind, "unknown");
        assert_eq!(params_of(&s.text)["sessionId"], "b");
    }
}

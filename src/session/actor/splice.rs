//! The journal entry of one `session/update`, made from the agent's raw params by splicing:
//! the params' members are the spans the peer found when it read the frame, `sessionId` is
//! replaced by acpd's, `_meta.acpd` gets the seq, and the update body is copied through byte
//! for byte, never parsed or scanned again.
//!
//! Pure: no I/O, unit-tested below. Params the peer could not index (member names with
//! escapes: no agent writes them, but JSON allows it) were re-serialized by the full parse,
//! which writes names plainly where JSON lets it; a name that must stay escaped (a quote, a
//! backslash, a control character) and an empty object take an exact path through a tree.

use acpd_protocol::method;
use std::sync::{Arc, LazyLock};

use acpd_protocol::update_form;
use acpd_wire::{Members, RawNotification};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// Kinds whose body changes the session row (`Session::observe`) or counts against budgets
/// (`usage_update`'s cost, `usage.rs`): only these are parsed.
const OBSERVED: [&str; 4] = [
    "session_info_update",
    "current_mode_update",
    "config_option_update",
    "usage_update",
];

pub(super) struct Spliced {
    /// The whole notification, as journaled and sent.
    pub text: String,
    /// `update.sessionUpdate`, or "unknown"; shared for the kinds ACP names.
    pub kind: Arc<str>,
    /// The raw update body, kept only for the kinds `observe` reads.
    update: Option<Box<RawValue>>,
}

impl Spliced {
    /// The update as a tree, for the kinds that change the session row.
    pub fn update_value(&self) -> Option<Value> {
        serde_json::from_str(self.update.as_ref()?.get()).ok()
    }
}

/// `None` when the params are not a JSON object.
pub(super) fn splice(n: &RawNotification, session_id: &str, seq: i64) -> Option<Spliced> {
    let params = n.params()?;
    match n.members() {
        Some(members) => Some(fast(params, members, session_id, seq)),
        None => slow(params, session_id, seq),
    }
}

/// The members as the peer found them, in the agent's order: the body is copied, not read.
fn fast(params: &str, members: Members, session_id: &str, seq: i64) -> Spliced {
    let update = members.get("update");
    // Read up to `sessionUpdate` only (agents write it first): the body is not scanned again.
    let kind = update.and_then(|u| acpd_wire::str_member(u, "sessionUpdate"));
    let kind = kind_of(kind.as_deref());
    let mut text = String::with_capacity(params.len() + session_id.len() + 96);
    // `acpd_protocol::update_form`: acp-shim reads the session id and seq off this head and tail.
    text.push_str(update_form::UPDATE_HEAD);
    push_json_str(&mut text, session_id);
    for (name, value) in members.iter() {
        if matches!(name, "sessionId" | "_meta") {
            continue;
        }
        text.push(',');
        // Names in member spans are free of escapes: written back as they came.
        text.push('"');
        text.push_str(name);
        text.push_str("\":");
        text.push_str(value);
    }
    match members.get("_meta") {
        // The common case: nothing of the agent's to merge with.
        None => update_form::push_seq_tail(&mut text, seq),
        Some(meta) => {
            let theirs = serde_json::from_str::<Map<String, Value>>(meta).ok();
            text.push_str(r#","_meta":"#);
            text.push_str(&merged_meta(theirs, seq).to_string());
            text.push_str("}}");
        }
    }
    Spliced {
        text,
        update: update
            .filter(|_| OBSERVED.contains(&&*kind))
            .and_then(|u| RawValue::from_string(u.to_owned()).ok()),
        kind,
    }
}

/// The kinds ACP names, shared: a journal entry's kind costs no allocation.
static KINDS: LazyLock<Vec<Arc<str>>> = LazyLock::new(|| {
    [
        "agent_message_chunk",
        "agent_thought_chunk",
        "user_message_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
        "session_info_update",
        "usage_update",
        "unknown",
    ]
    .into_iter()
    .map(Arc::from)
    .collect()
});

/// `kind` as an `Arc`, shared when ACP names it; `None` is "unknown".
fn kind_of(kind: Option<&str>) -> Arc<str> {
    let kind = kind.unwrap_or("unknown");
    match KINDS.iter().find(|k| ***k == *kind) {
        Some(k) => k.clone(),
        None => kind.into(),
    }
}

/// Params without member spans (an empty object, a name that must stay escaped; an array is
/// refused here): exact, through a tree.
fn slow(params: &str, session_id: &str, seq: i64) -> Option<Spliced> {
    let Ok(Value::Object(mut params)) = serde_json::from_str::<Value>(params) else {
        return None;
    };
    params.insert("sessionId".into(), Value::String(session_id.to_owned()));
    let theirs = match params.remove("_meta") {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    params.insert("_meta".into(), merged_meta(theirs, seq));
    let update = params.get("update");
    let kind = kind_of(
        update
            .and_then(|u| u.get("sessionUpdate"))
            .and_then(Value::as_str),
    );
    let update = update
        .filter(|_| OBSERVED.contains(&&*kind))
        .and_then(|u| serde_json::value::to_raw_value(u).ok());
    let text =
        json!({ "jsonrpc": "2.0", "method": method::SESSION_UPDATE, "params": params }).to_string();
    Some(Spliced { text, kind, update })
}

/// The agent's `_meta` (an object, else replaced) with `acpd: {seq}` set.
fn merged_meta(theirs: Option<Map<String, Value>>, seq: i64) -> Value {
    let mut m = theirs.unwrap_or_default();
    m.insert("acpd".into(), json!({ "seq": seq }));
    Value::Object(m)
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

    /// An agent's notification as the peer reads it off the wire.
    fn raw(params: &str) -> RawNotification {
        let frame = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
        RawNotification::read(frame.clone()).unwrap_or_else(|_| {
            // What the peer does with a frame its envelope read cannot index.
            let Ok(acpd_wire::Message::Notification(n)) = acpd_wire::Message::parse(&frame) else {
                panic!("{frame}")
            };
            n.into()
        })
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
        assert!(p.members().is_some(), "read in one pass");
        let s = splice(&p, "acpd-1", 42).unwrap();
        assert_eq!(&*s.kind, "agent_message_chunk");
        assert!(
            Arc::ptr_eq(&s.kind, &kind_of(Some("agent_message_chunk"))),
            "shared"
        );
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
    fn escaped_member_names_are_read_exactly() {
        let p = raw(r#"{"sessionI\u0064":"a","upd\u0061te":{"sessionUpdate":"plan"},"_meta":7}"#);
        let s = splice(&p, "b\"q", 9).unwrap();
        let params = params_of(&s.text);
        assert_eq!(params["sessionId"], "b\"q");
        assert_eq!(params["update"]["sessionUpdate"], "plan");
        assert_eq!(&*s.kind, "plan");
        assert_eq!(params["_meta"], json!({"acpd": {"seq": 9}}));
    }

    #[test]
    fn params_without_member_spans_take_the_exact_path() {
        // An empty object has no spans to splice: the tree path writes the same members.
        let p = raw("{}");
        assert!(p.members().is_none());
        let s = splice(&p, "b", 4).unwrap();
        let params = params_of(&s.text);
        assert_eq!(params["sessionId"], "b");
        assert_eq!(params["_meta"], json!({"acpd": {"seq": 4}}));
    }

    #[test]
    fn params_that_are_not_an_object_are_refused() {
        assert!(splice(&raw("[1,2]"), "b", 1).is_none());
        let s = splice(&raw("{}"), "b", 1).unwrap();
        assert_eq!(&*s.kind, "unknown");
        assert_eq!(params_of(&s.text)["sessionId"], "b");
    }
}

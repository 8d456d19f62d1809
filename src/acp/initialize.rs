//! The `initialize` answer: what acpd tells a client it can do — the agent's own
//! capabilities, the session methods acpd answers from its journal for every agent, and
//! acpd's own extensions under `_meta.acpd`.

use serde_json::{Value, json};

use crate::agent::AgentHandle;

/// The protocol version acpd speaks.
const PROTOCOL_VERSION: u64 = 1;

/// What acpd tells the client it can do: the agent's own capabilities, plus the session
/// methods acpd answers from its journal for every agent.
pub(super) fn result(agent: &AgentHandle, conn_id: &str, busy_prompts: &str) -> Value {
    let theirs = agent
        .init
        .get("agentCapabilities")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut caps = match theirs.clone() {
        Value::Object(m) => Value::Object(m),
        _ => json!({}),
    };
    caps["loadSession"] = json!(true);
    let mut session_caps = json!({ "list": {}, "resume": {}, "close": {}, "delete": {} });
    for key in ["additionalDirectories", "systemPrompt"] {
        if let Some(v) = theirs
            .pointer(&format!("/sessionCapabilities/{key}"))
            .filter(|v| !v.is_null())
        {
            session_caps[key] = v.clone();
        }
    }
    // Forks are acpd sessions of their own (`actor/fork.rs`); only where the agent forks.
    if crate::session::agent_forks(agent) {
        session_caps["fork"] = json!({});
    }
    caps["sessionCapabilities"] = session_caps;
    let auth_methods: Vec<Value> = agent
        .init
        .get("authMethods")
        .and_then(Value::as_array)
        .map(|methods| {
            methods
                .iter()
                // A remote editor cannot run the agent's binary for a terminal login.
                .filter(|m| m.get("type").and_then(Value::as_str) != Some("terminal"))
                .map(|m| {
                    let mut m = m.clone();
                    if let Some(meta) = m.get_mut("_meta").and_then(Value::as_object_mut) {
                        meta.remove("terminal-auth");
                    }
                    m
                })
                .collect()
        })
        .unwrap_or_default();
    let mut result = json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": caps,
        "authMethods": auth_methods,
        "_meta": { "acpd": {
            "version": env!("CARGO_PKG_VERSION"),
            "connectionId": conn_id,
            "attach": true,
            // Shared sessions (README "Shared sessions"): the names of RFD #533 and the ACP
            // Remote drafts where they are clear, acpd's own otherwise.
            "sharedSessions": {
                "roles": ["controller", "observer"],
                "historyPolicy": ["full", "afterSeq"],
                "presence": true,
                "permissionResolved": true,
                "leasedControl": false,
                "busyPrompts": busy_prompts,
                "share": true,
            },
        } },
    });
    if let Some(info) = agent.init.get("agentInfo") {
        result["agentInfo"] = info.clone();
    }
    result
}

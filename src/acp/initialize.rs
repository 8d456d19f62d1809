//! The `initialize` answer: what acpd tells a client it can do — the agent's own
//! capabilities, the session methods acpd answers from its journal for every agent, and
//! acpd's own extensions under `_meta.acpd`.

use serde_json::{Value, json};

use crate::agent::AgentHandle;
use crate::config::AgentProfile;

/// The protocol version acpd speaks.
const PROTOCOL_VERSION: u64 = 1;

/// What acpd tells the client it can do: the agent's own capabilities, plus the session
/// methods acpd answers from its journal for every agent.
pub(super) fn result(
    agent: &AgentHandle,
    conn_id: &str,
    busy_prompts: &str,
    login: Option<&AgentProfile>,
) -> Value {
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
    let auth_methods = auth_methods(&agent.init, login);
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

/// The profile whose login a client may run through acp-shim (`--login NAME`): a hosted
/// agent's, when the client is acp-shim (`via_shim`: the method's `args` are its flags), runs
/// terminal logins (`clientCapabilities.auth.terminal`), and its principal is among the
/// profile's `login_principals`.
pub(super) fn login_offer<'a>(
    params: &Value,
    via_shim: bool,
    profile: Option<&'a AgentProfile>,
    principal_name: &str,
) -> Option<&'a AgentProfile> {
    let terminal = params.pointer("/clientCapabilities/auth/terminal") == Some(&json!(true));
    profile.filter(|p| via_shim && terminal && p.may_log_in(principal_name))
}

/// The agent's auth methods as a remote client sees them. Its terminal login cannot run on
/// the client's machine, so it is dropped — or, with `login`, offered as acp-shim's: the
/// editor re-runs its agent command (acp-shim with the daemon's URL) with `--login NAME`, and
/// the login runs on acpd's host (`crate::login`).
fn auth_methods(init: &Value, login: Option<&AgentProfile>) -> Vec<Value> {
    let methods = init
        .get("authMethods")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let is_terminal = |m: &Value| {
        m.get("type").and_then(Value::as_str) == Some("terminal")
            || m.pointer("/_meta/terminal-auth").is_some()
    };
    let mut out: Vec<Value> = methods
        .iter()
        .filter(|m| m.get("type").and_then(Value::as_str) != Some("terminal"))
        .map(|m| {
            let mut m = m.clone();
            if let Some(meta) = m.get_mut("_meta").and_then(Value::as_object_mut) {
                meta.remove("terminal-auth");
            }
            m
        })
        .filter(|m| !(login.is_some() && is_terminal_origin(&methods, m, &is_terminal)))
        .collect();
    let Some(profile) = login else {
        return out;
    };
    let theirs = methods.iter().find(|m| is_terminal(m));
    if theirs.is_none() && profile.login.is_empty() {
        return out;
    }
    let text = |key: &str, default: &str| {
        theirs
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    let mut method = json!({
        "id": text("id", "acpd-login"),
        "name": text("name", "Log in"),
        "description": format!("Runs the login of agent {:?} on the acpd host, in this terminal", profile.name),
        "type": "terminal",
        "args": ["--login", profile.name],
        "env": {},
    });
    method["_meta"] = json!({ "acpd": { "remoteLogin": profile.name } });
    out.push(method);
    out
}

/// Whether `m` (already without its `terminal-auth`) was a legacy terminal method, which the
/// acp-shim method replaces.
fn is_terminal_origin(methods: &[Value], m: &Value, is_terminal: &dyn Fn(&Value) -> bool) -> bool {
    methods
        .iter()
        .any(|orig| is_terminal(orig) && orig.get("id") == m.get("id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(login: &[&str]) -> AgentProfile {
        AgentProfile {
            name: "claude".into(),
            program: "agent".into(),
            args: vec![],
            env: vec![],
            pass_env: vec![],
            cwd: None,
            home: None,
            login: login.iter().map(|s| s.to_string()).collect(),
            login_principals: vec!["alice".into()],
            login_timeout: std::time::Duration::from_secs(60),
        }
    }

    #[test]
    fn a_terminal_login_is_hidden_or_offered_through_acp_shim() {
        let init = json!({ "authMethods": [
            { "id": "key", "name": "Key" },
            { "id": "t", "name": "Sign in", "type": "terminal", "args": ["--login"] },
        ]});
        let hidden = auth_methods(&init, None);
        assert_eq!(hidden, vec![json!({ "id": "key", "name": "Key" })]);
        let p = profile(&[]);
        let offered = auth_methods(&init, Some(&p));
        assert_eq!(offered.len(), 2, "{offered:?}");
        assert_eq!(offered[1]["id"], "t");
        assert_eq!(offered[1]["name"], "Sign in");
        assert_eq!(offered[1]["type"], "terminal");
        assert_eq!(offered[1]["args"], json!(["--login", "claude"]));
    }

    #[test]
    fn the_profiles_login_command_is_offered_when_the_agent_has_none() {
        let init = json!({ "authMethods": [] });
        assert!(auth_methods(&init, Some(&profile(&[]))).is_empty());
        let offered = auth_methods(&init, Some(&profile(&["agent", "login"])));
        assert_eq!(offered[0]["id"], "acpd-login");
        assert_eq!(offered[0]["args"], json!(["--login", "claude"]));
    }

    #[test]
    fn the_legacy_meta_method_is_replaced_not_doubled() {
        let init = json!({ "authMethods": [{ "id": "claude-login", "name": "Log in",
            "_meta": { "terminal-auth": { "command": "node", "args": ["cli.js"] } } }] });
        let offered = auth_methods(&init, Some(&profile(&[])));
        assert_eq!(offered.len(), 1, "{offered:?}");
        assert_eq!(offered[0]["type"], "terminal");
        let hidden = auth_methods(&init, None);
        assert_eq!(
            hidden,
            vec![json!({ "id": "claude-login", "name": "Log in", "_meta": {} })]
        );
    }

    #[test]
    fn only_clients_with_auth_terminal_and_their_principals_are_offered_the_login() {
        let p = profile(&[]);
        let yes = json!({ "clientCapabilities": { "auth": { "terminal": true } } });
        let no = json!({ "clientCapabilities": { "terminal": true } });
        assert!(login_offer(&yes, true, Some(&p), "alice").is_some());
        assert!(login_offer(&yes, false, Some(&p), "alice").is_none());
        assert!(login_offer(&yes, true, Some(&p), "bob").is_none());
        assert!(login_offer(&no, true, Some(&p), "alice").is_none());
        assert!(login_offer(&yes, true, None, "alice").is_none());
    }
}

//! The built-in agent's side of the stdio MCP policy: which of a session's `mcpServers` may
//! start, asking the client (`session/request_permission` with the exact command line) where
//! the policy says "ask". "Always" answers are kept in the session's `remembered` map under
//! `mcp_stdio <command line>`, so they last as long as the session (and its state file).

use acpd_protocol::method;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::client::{ClientError, ClientLink};
use crate::config::ToolPolicy;
use crate::mcp_policy::{McpDecision, McpPolicy, stdio_command_line};

fn key(line: &str) -> String {
    format!("mcp_stdio {line}")
}

/// The servers that may start now, what still needs the user, and why others are refused.
pub struct Plan {
    pub start: Vec<Value>,
    /// (server, its command line) to ask about.
    pub ask: Vec<(Value, String)>,
    pub refused: Vec<String>,
}

/// Policy first, then what the user answered "always" in this session.
pub fn plan(
    policy: &McpPolicy,
    servers: &[Value],
    remembered: &BTreeMap<String, ToolPolicy>,
) -> Plan {
    let consented: BTreeSet<String> = servers
        .iter()
        .filter_map(stdio_command_line)
        .filter(|l| remembered.get(&key(l)) == Some(&ToolPolicy::Allow))
        .collect();
    let mut plan = Plan {
        start: vec![],
        ask: vec![],
        refused: vec![],
    };
    for s in servers {
        match policy.decide(s, &consented) {
            McpDecision::Start => plan.start.push(s.clone()),
            McpDecision::Ask(line) if remembered.get(&key(&line)) == Some(&ToolPolicy::Deny) => {
                plan.refused.push(format!(
                    "the user rejected the stdio MCP server `{line}` for this session"
                ));
            }
            McpDecision::Ask(line) => plan.ask.push((s.clone(), line)),
            McpDecision::Refuse(why) => plan.refused.push(why),
        }
    }
    plan
}

/// Asks the user about each server of `plan.ask`; returns the servers to start and the
/// warnings for the user (servers not started).
pub async fn ask(
    client: &ClientLink,
    mut plan: Plan,
    remembered: &mut BTreeMap<String, ToolPolicy>,
) -> (Vec<Value>, Vec<String>) {
    // Not tied to a turn: the daemon answers "cancelled" if no client answers in time.
    let never = CancellationToken::new();
    for (n, (server, line)) in std::mem::take(&mut plan.ask).into_iter().enumerate() {
        let name = server.get("name").and_then(Value::as_str).unwrap_or("mcp");
        let params = json!({
            "toolCall": {
                "toolCallId": format!("mcp_stdio_{n}"),
                "title": format!("Start MCP server {name:?}: {line}"),
                "kind": "execute",
                "status": "pending",
                "rawInput": { "command": line, "server": server },
            },
            "options": [
                { "optionId": "allow_once", "name": "Start it", "kind": "allow_once" },
                { "optionId": "allow_always", "name": "Always start it in this session", "kind": "allow_always" },
                { "optionId": "reject_once", "name": "Do not start it", "kind": "reject_once" },
                { "optionId": "reject_always", "name": "Never in this session", "kind": "reject_always" },
            ],
        });
        let answer = client
            .request(method::SESSION_REQUEST_PERMISSION, params, &never)
            .await;
        let option = match &answer {
            Ok(a) if a.pointer("/outcome/outcome").and_then(Value::as_str) == Some("selected") => {
                a.pointer("/outcome/optionId").and_then(Value::as_str)
            }
            _ => None,
        };
        match option {
            Some("allow_once") => plan.start.push(server),
            Some("allow_always") => {
                remembered.insert(key(&line), ToolPolicy::Allow);
                plan.start.push(server);
            }
            Some("reject_always") => {
                remembered.insert(key(&line), ToolPolicy::Deny);
                plan.refused
                    .push(format!("the user rejected the stdio MCP server `{line}`"));
            }
            _ => {
                let why = match answer {
                    Err(ClientError::Remote(e)) => format!(": {}", e.message),
                    _ => String::new(),
                };
                plan.refused
                    .push(format!("stdio MCP server `{line}` not started{why}"));
            }
        }
    }
    (plan.start, plan.refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_answers_decide_without_asking() {
        let s = json!({ "name": "s", "command": "sh", "args": ["-c", "x"] });
        let mut remembered = BTreeMap::new();
        let p = plan(&McpPolicy::default(), std::slice::from_ref(&s), &remembered);
        assert_eq!(p.ask.len(), 1);
        remembered.insert(key("sh -c x"), ToolPolicy::Allow);
        let p = plan(&McpPolicy::default(), std::slice::from_ref(&s), &remembered);
        assert_eq!((p.start.len(), p.ask.len()), (1, 0));
        remembered.insert(key("sh -c x"), ToolPolicy::Deny);
        let p = plan(&McpPolicy::default(), std::slice::from_ref(&s), &remembered);
        assert_eq!((p.start.len(), p.ask.len(), p.refused.len()), (0, 0, 1));
    }
}

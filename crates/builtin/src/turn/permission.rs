//! Permission before a tool call: the configured policy, then what the user answered
//! "always" to in this session, then a `session/request_permission` to the client.

use acpd_protocol::method;
use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::TurnCtx;
use crate::client::ClientError;
use crate::config::ToolPolicy;

pub enum Permission {
    Allow,
    Reject(String),
    Cancelled,
}

/// The policy, then what the user said "always" to, then the user.
#[allow(clippy::too_many_arguments)]
pub async fn permission(
    ctx: &TurnCtx,
    remembered: &mut BTreeMap<String, ToolPolicy>,
    id: &str,
    name: &str,
    title: &str,
    kind: &str,
    input: &Value,
    mutating: bool,
) -> Permission {
    match ctx.config.policy(name, mutating) {
        ToolPolicy::Allow => return Permission::Allow,
        ToolPolicy::Deny => {
            return Permission::Reject(format!("{name} is denied by the acpd configuration"));
        }
        ToolPolicy::Ask => {}
    }
    match remembered.get(name) {
        Some(ToolPolicy::Allow) => return Permission::Allow,
        Some(ToolPolicy::Deny) => {
            return Permission::Reject(format!(
                "the user rejected all {name} calls in this session"
            ));
        }
        _ => {}
    }
    let params = json!({
        "toolCall": { "toolCallId": id, "title": title, "kind": kind, "status": "pending", "rawInput": input },
        "options": [
            { "optionId": "allow_once", "name": "Allow", "kind": "allow_once" },
            { "optionId": "allow_always", "name": format!("Always allow {name}"), "kind": "allow_always" },
            { "optionId": "reject_once", "name": "Reject", "kind": "reject_once" },
            { "optionId": "reject_always", "name": format!("Always reject {name}"), "kind": "reject_always" },
        ],
    });
    let answer = match ctx
        .client
        .request(method::SESSION_REQUEST_PERMISSION, params, &ctx.cancel)
        .await
    {
        Ok(a) => a,
        Err(ClientError::Cancelled) => return Permission::Cancelled,
        Err(e) => return Permission::Reject(format!("no permission: {e}")),
    };
    let outcome = answer.pointer("/outcome/outcome").and_then(Value::as_str);
    let option = answer.pointer("/outcome/optionId").and_then(Value::as_str);
    match (outcome, option) {
        (Some("selected"), Some("allow_once")) => Permission::Allow,
        (Some("selected"), Some("allow_always")) => {
            remembered.insert(name.to_owned(), ToolPolicy::Allow);
            Permission::Allow
        }
        (Some("selected"), Some("reject_always")) => {
            remembered.insert(name.to_owned(), ToolPolicy::Deny);
            Permission::Reject("the user rejected this tool call".into())
        }
        (Some("selected"), _) => Permission::Reject("the user rejected this tool call".into()),
        _ => Permission::Cancelled,
    }
}

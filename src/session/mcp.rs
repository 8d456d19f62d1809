//! Stdio MCP servers for hosted agents: the `mcpServers` of `session/new|load|resume` are
//! filtered under `mcp_stdio` / `mcp_stdio_allow` before they reach a hosted agent, which
//! would otherwise start each command on acpd's host without anyone's consent. "ask" cannot
//! be asked here (a `session/new` has no session for a permission request yet, and a hosted
//! agent starts its servers while answering it), so for hosted agents it means "not without
//! the allowlist": the server is dropped and the reason logged (`acpd::audit`) and reported in
//! the answer's `_meta.acpd.mcpServersRefused`. The built-in agent applies the policy itself
//! and asks the client at the first prompt, so its params pass unchanged.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::config::BUILTIN_AGENT;
use acpd_builtin::McpPolicy;
use acpd_builtin::mcp_policy::{McpServersError, filter_mcp_servers};

/// `params` as the agent of `profile` may see them, and why servers were dropped. An
/// `mcpServers` that is not an array of objects is the error (a -32602 message).
pub(crate) fn for_agent(
    profile: &str,
    params: &Value,
    policy: &McpPolicy,
    session: &str,
) -> Result<(Value, Vec<String>), McpServersError> {
    if profile == BUILTIN_AGENT {
        return Ok((params.clone(), vec![]));
    }
    let f = filter_mcp_servers(params, policy, &BTreeSet::new())?;
    let mut refused = f.refused;
    refused.extend(f.to_ask.into_iter().map(|line| {
        format!("stdio MCP server `{line}` needs consent, which acpd cannot ask for a hosted agent; add it to mcp_stdio_allow")
    }));
    for why in &refused {
        tracing::warn!(target: "acpd::audit", %profile, %session, reason = %why, "stdio MCP server dropped");
    }
    Ok((f.params, refused))
}

/// `mcpServers` of the stored session meta, filtered the same way (rows written before the
/// policy applied to hosted agents, or under a looser config, may hold any command).
pub(crate) fn stored_for_agent(
    profile: &str,
    servers: Option<&Value>,
    policy: &McpPolicy,
    session: &str,
) -> Value {
    let params = serde_json::json!({ "mcpServers": servers.cloned().unwrap_or_else(|| Value::Array(vec![])) });
    match for_agent(profile, &params, policy, session) {
        Ok((p, _)) => p["mcpServers"].clone(),
        Err(_) => Value::Array(vec![]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params() -> Value {
        json!({ "cwd": "/w", "mcpServers": [
            { "name": "a", "command": "touch", "args": ["/tmp/x"], "env": [] },
            { "name": "h", "type": "http", "url": "http://127.0.0.1:1/mcp", "headers": [] },
        ]})
    }

    #[test]
    fn hosted_agents_get_no_unconsented_stdio_server() {
        let (p, refused) = for_agent("claude", &params(), &McpPolicy::default(), "s").unwrap();
        assert_eq!(p["mcpServers"].as_array().unwrap().len(), 1);
        assert_eq!(p["mcpServers"][0]["name"], "h");
        assert!(refused[0].contains("touch /tmp/x"), "{refused:?}");
        let allow = McpPolicy::new("ask", vec!["touch".into()]).unwrap();
        let (p, refused) = for_agent("claude", &params(), &allow, "s").unwrap();
        assert_eq!(p["mcpServers"].as_array().unwrap().len(), 2);
        assert!(refused.is_empty());
        let deny = McpPolicy::new("deny", vec![]).unwrap();
        assert_eq!(
            for_agent("claude", &params(), &deny, "s").unwrap().1.len(),
            1
        );
    }

    #[test]
    fn the_builtin_agent_decides_itself_and_bad_shapes_are_errors() {
        let (p, refused) = for_agent(BUILTIN_AGENT, &params(), &McpPolicy::default(), "s").unwrap();
        assert_eq!(p, params());
        assert!(refused.is_empty());
        let bad = json!({ "cwd": "/w", "mcpServers": [5] });
        assert!(for_agent("claude", &bad, &McpPolicy::default(), "s").is_err());
        let stored = stored_for_agent(
            "claude",
            params().get("mcpServers"),
            &McpPolicy::default(),
            "s",
        );
        assert_eq!(stored.as_array().unwrap().len(), 1);
    }
}

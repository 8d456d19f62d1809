//! Which stdio MCP servers a client may have started on the acpd host. A stdio MCP server in
//! `session/new|load|resume` is a command line acpd runs as its own user, so it starts only
//! under the policy `mcp_stdio` ("ask" by default, "allow", "deny") plus the allowlist
//! `mcp_stdio_allow`. Pure decisions here; the built-in agent asks the client, and the
//! session layer filters what reaches a hosted agent with `filter_mcp_servers`.

use std::collections::BTreeSet;

use serde_json::Value;

/// The `mcp_stdio` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum McpStdio {
    /// A `session/request_permission` showing the command line ("always" kept per session).
    #[default]
    Ask,
    Allow,
    Deny,
}

/// `mcp_stdio` and `mcp_stdio_allow`, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McpPolicy {
    pub mode: McpStdio,
    /// An entry allows a server whose program, or whose whole command line, it equals.
    pub allow: Vec<String>,
}

/// What to do with one server of `mcpServers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpDecision {
    /// Not a stdio server, or allowed: start it.
    Start,
    /// Ask the client about this command line.
    Ask(String),
    /// Do not start it, for this reason.
    Refuse(String),
}

/// A policy that cannot be: its text names the setting's value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpPolicyError {
    #[error("{0:?}: expected \"ask\", \"allow\" or \"deny\"")]
    Mode(String),
    #[error("mcp_stdio_allow entry {0:?} is empty")]
    EmptyAllow(String),
}

/// `mcpServers` with only what may start, and the command lines still to ask about.
#[derive(Debug, Clone, PartialEq)]
pub struct Filtered {
    pub params: Value,
    pub to_ask: Vec<String>,
    pub refused: Vec<String>,
}

impl McpPolicy {
    /// The top-level keys, also written into the `[builtin]` table for the built-in agent.
    pub const KEYS: [&'static str; 2] = ["mcp_stdio", "mcp_stdio_allow"];

    pub fn new(mode: &str, allow: Vec<String>) -> Result<McpPolicy, McpPolicyError> {
        let mode = match mode {
            "ask" => McpStdio::Ask,
            "allow" => McpStdio::Allow,
            "deny" => McpStdio::Deny,
            other => return Err(McpPolicyError::Mode(other.to_owned())),
        };
        if let Some(bad) = allow.iter().find(|a| a.trim().is_empty()) {
            return Err(McpPolicyError::EmptyAllow(bad.clone()));
        }
        Ok(McpPolicy { mode, allow })
    }

    /// The policy where the host shell is `allowed` or not (`shell = "deny"`, `host_shell =
    /// false`): a stdio server is a command like any other, so without a shell "ask" — the
    /// client, the very party the operator restricted, deciding — becomes "deny" and only
    /// `mcp_stdio_allow` starts. An explicit "allow" is the operator's own word and stays.
    pub fn under_shell(mut self, allowed: bool) -> McpPolicy {
        if !allowed && self.mode == McpStdio::Ask {
            self.mode = McpStdio::Deny;
        }
        self
    }

    /// Writes the policy into a `[builtin]` table (read back by `BuiltinConfig::parse`).
    pub fn insert_into(&self, table: &mut toml::Table) {
        let mode = match self.mode {
            McpStdio::Ask => "ask",
            McpStdio::Allow => "allow",
            McpStdio::Deny => "deny",
        };
        table.insert(Self::KEYS[0].into(), toml::Value::String(mode.into()));
        let allow = self.allow.iter().cloned().map(toml::Value::String);
        table.insert(Self::KEYS[1].into(), toml::Value::Array(allow.collect()));
    }

    /// The decision for one `McpServer` object; `consented` holds the command lines the
    /// user allowed for the session ("always").
    pub fn decide(&self, server: &Value, consented: &BTreeSet<String>) -> McpDecision {
        let Some(line) = stdio_command_line(server) else {
            return McpDecision::Start;
        };
        let program = server.get("command").and_then(Value::as_str).unwrap_or("");
        if self.mode == McpStdio::Allow
            || self.allow.iter().any(|a| a == program || *a == line)
            // A consent given under "ask" does not outlive a switch to "deny".
            || (self.mode == McpStdio::Ask && consented.contains(&line))
        {
            return McpDecision::Start;
        }
        match self.mode {
            McpStdio::Ask => McpDecision::Ask(line),
            _ => McpDecision::Refuse(format!(
                "stdio MCP server `{line}` is not allowed by acpd's mcp_stdio policy"
            )),
        }
    }
}

/// The command line of a stdio server (`type` absent or `"stdio"`), words quoted where a
/// shell would need it; `None` for other transports.
pub fn stdio_command_line(server: &Value) -> Option<String> {
    if !matches!(
        server.get("type").and_then(Value::as_str),
        None | Some("stdio")
    ) {
        return None;
    }
    let command = server.get("command").and_then(Value::as_str).unwrap_or("");
    let args = server.get("args").and_then(Value::as_array);
    let words = std::iter::once(command)
        .chain(args.into_iter().flatten().filter_map(Value::as_str))
        .map(quote);
    Some(words.collect::<Vec<_>>().join(" "))
}

fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Why `mcpServers` was refused (the -32602 message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpServersError {
    #[error("mcpServers must be an array")]
    NotAnArray,
    #[error("each of mcpServers must be an object")]
    NotAnObject,
}

/// For hosted agents, before `session/new|load|resume` reaches them: `params` with the stdio
/// servers that may not start removed (`refused`, and `to_ask` until the user consents and
/// the call is made again with them in `consented`). An `mcpServers` that is not an array
/// is an error (the -32602 message).
pub fn filter_mcp_servers(
    params: &Value,
    policy: &McpPolicy,
    consented: &BTreeSet<String>,
) -> Result<Filtered, McpServersError> {
    let mut out = Filtered {
        params: params.clone(),
        to_ask: vec![],
        refused: vec![],
    };
    let Some(servers) = params.get("mcpServers") else {
        return Ok(out);
    };
    let Some(servers) = servers.as_array() else {
        return Err(McpServersError::NotAnArray);
    };
    let mut kept = vec![];
    for s in servers {
        if !s.is_object() {
            return Err(McpServersError::NotAnObject);
        }
        match policy.decide(s, consented) {
            McpDecision::Start => kept.push(s.clone()),
            McpDecision::Ask(line) => out.to_ask.push(line),
            McpDecision::Refuse(why) => out.refused.push(why),
        }
    }
    out.params["mcpServers"] = Value::Array(kept);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stdio(cmd: &str, args: &[&str]) -> Value {
        json!({ "name": "s", "command": cmd, "args": args, "env": [] })
    }

    fn policy(mode: &str, allow: &[&str]) -> McpPolicy {
        McpPolicy::new(mode, allow.iter().map(|s| s.to_string()).collect()).unwrap()
    }

    #[test]
    fn the_command_line_is_shown_quoted() {
        let s = stdio("sh", &["-c", "touch /tmp/x; echo 'hi'"]);
        assert_eq!(
            stdio_command_line(&s).unwrap(),
            r#"sh -c 'touch /tmp/x; echo '\''hi'\'''"#
        );
        let http = json!({ "type": "http", "name": "h", "url": "http://x" });
        assert_eq!(stdio_command_line(&http), None);
    }

    #[test]
    fn ask_is_the_default_and_the_allowlist_and_consent_start_servers() {
        let none = BTreeSet::new();
        let p = McpPolicy::default();
        let s = stdio("sh", &["-c", "true"]);
        assert_eq!(p.decide(&s, &none), McpDecision::Ask("sh -c true".into()));
        let consented = BTreeSet::from(["sh -c true".to_owned()]);
        assert_eq!(p.decide(&s, &consented), McpDecision::Start);
        assert_eq!(
            policy("deny", &["sh -c true"]).decide(&s, &none),
            McpDecision::Start
        );
        assert_eq!(policy("ask", &["sh"]).decide(&s, &none), McpDecision::Start);
        assert!(matches!(
            policy("deny", &["sh -c false"]).decide(&s, &none),
            McpDecision::Refuse(_)
        ));
        assert_eq!(policy("allow", &[]).decide(&s, &none), McpDecision::Start);
        let http = json!({ "type": "http", "name": "h", "url": "http://x" });
        assert_eq!(policy("deny", &[]).decide(&http, &none), McpDecision::Start);
        assert!(McpPolicy::new("maybe", vec![]).is_err());
        assert!(McpPolicy::new("ask", vec![" ".into()]).is_err());
    }

    #[test]
    fn without_a_shell_ask_becomes_deny_and_only_the_allowlist_starts() {
        let none = BTreeSet::new();
        let s = stdio("sh", &["-c", "true"]);
        let p = policy("ask", &["node"]).under_shell(false);
        assert_eq!(p.mode, McpStdio::Deny);
        assert!(matches!(p.decide(&s, &none), McpDecision::Refuse(_)));
        assert_eq!(p.decide(&stdio("node", &[]), &none), McpDecision::Start);
        // Consent from the client no longer counts.
        let consented = BTreeSet::from(["sh -c true".to_owned()]);
        assert!(matches!(p.decide(&s, &consented), McpDecision::Refuse(_)));
        assert_eq!(policy("ask", &[]).under_shell(true).mode, McpStdio::Ask);
        assert_eq!(
            policy("allow", &[]).under_shell(false).mode,
            McpStdio::Allow
        );
    }

    #[test]
    fn hosted_agents_get_only_what_may_start() {
        let params = json!({ "cwd": "/w", "mcpServers": [
            stdio("sh", &["-c", "evil"]),
            { "type": "http", "name": "h", "url": "http://x" },
            stdio("node", &["srv.js"]),
        ] });
        let f = filter_mcp_servers(&params, &policy("ask", &["node"]), &BTreeSet::new()).unwrap();
        assert_eq!(f.to_ask, ["sh -c evil"]);
        assert!(f.refused.is_empty());
        assert_eq!(f.params["cwd"], "/w");
        let kept = f.params["mcpServers"].as_array().unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1]["command"], "node");
        let f = filter_mcp_servers(&params, &policy("deny", &[]), &BTreeSet::new()).unwrap();
        assert_eq!(f.params["mcpServers"].as_array().unwrap().len(), 1);
        assert_eq!(f.refused.len(), 2);
        let none = json!({ "cwd": "/w" });
        assert_eq!(
            filter_mcp_servers(&none, &McpPolicy::default(), &BTreeSet::new())
                .unwrap()
                .params,
            none
        );
        let bad = json!({ "mcpServers": {} });
        assert!(filter_mcp_servers(&bad, &McpPolicy::default(), &BTreeSet::new()).is_err());
    }
}

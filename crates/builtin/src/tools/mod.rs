//! The tools the model can call: their specs (what is offered depends on the mode, the
//! client's capabilities and the config), how each call is presented to the client (title,
//! kind, locations), and their execution.

mod ask;
mod beneath;
mod files;
pub mod mcp;
pub mod paths;
mod sandbox;
mod shell;

use acpd_protocol::method;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::client::{ClientCaps, ClientError, ClientLink};
use super::config::BuiltinConfig;
use super::provider::ToolSpec;
use mcp::McpTool;
pub use paths::Roots;

/// Why a tool call failed; the text goes back to the model as the tool result.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("invalid input: {0}")]
    BadInput(String),
    #[error("{} is outside the session's directories", .0.display())]
    Outside(PathBuf),
    #[error("{} is in acpd's data directory, which no tool may use", .0.display())]
    DataDir(PathBuf),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0} is switched off in this acpd's configuration")]
    Unavailable(&'static str),
    #[error("the client answered: {0}")]
    Client(String),
    #[error("{0}")]
    Failed(String),
    #[error("cancelled by the user")]
    Cancelled,
}

impl From<ClientError> for ToolError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Cancelled => ToolError::Cancelled,
            other => ToolError::Client(other.to_string()),
        }
    }
}

/// What a finished call produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// For the model.
    pub text: String,
    pub is_error: bool,
    /// ACP `ToolCallContent` for the client (a diff, a terminal, text).
    pub content: Vec<Value>,
    pub raw_output: Value,
}

impl Outcome {
    pub fn text(text: String) -> Outcome {
        Outcome {
            raw_output: json!({ "output": text }),
            text,
            is_error: false,
            content: vec![],
        }
    }
    pub fn with_content(mut self, content: Vec<Value>) -> Outcome {
        self.content = content;
        self
    }
}

/// What a tool call runs with.
pub struct ToolEnv<'a> {
    pub client: &'a ClientLink,
    pub caps: ClientCaps,
    pub config: &'a BuiltinConfig,
    pub roots: &'a Roots,
    pub cancel: &'a CancellationToken,
    pub tool_call_id: &'a str,
}

impl ToolEnv<'_> {
    /// Cuts text to the configured output limit, on a character boundary.
    pub fn truncate(&self, mut s: String) -> String {
        let limit = self.config.output_limit;
        if s.len() > limit {
            let mut cut = limit;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            s.truncate(cut);
            s.push_str("\n[truncated]");
        }
        s
    }
}

/// A tool declared by the client in `_meta.acpd.clientTools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub mutating: bool,
}

pub const BUILTIN_TOOLS: [&str; 8] = [
    ask::NAME,
    "read_file",
    "write_file",
    "edit",
    "list_dir",
    "glob",
    "grep",
    "shell",
];

/// Why `_meta.acpd.clientTools` was refused (the -32602 message).
#[derive(Debug, thiserror::Error)]
pub enum ClientToolsError {
    #[error("_meta.acpd.clientTools must be an array")]
    NotAnArray,
    /// Tool `index` of the list is not one acpd can offer.
    #[error("_meta.acpd.clientTools[{index}]: {problem}")]
    Tool { index: usize, problem: ToolProblem },
    #[error("the tool-name pattern: {0}")]
    Pattern(#[from] regex::Error),
}

/// What is wrong with one declared client tool.
#[derive(Debug, thiserror::Error)]
pub enum ToolProblem {
    #[error("name is required")]
    NoName,
    #[error("name must match ^[a-z][\\w-]{{0,63}}$")]
    BadName,
    #[error("name {0:?} is already taken")]
    Taken(String),
    #[error("a non-empty description is required")]
    NoDescription,
    #[error("inputSchema must be a JSON Schema whose type is \"object\"")]
    BadSchema,
    #[error("mutating must be a boolean")]
    BadMutating,
}

/// Reads and validates `_meta.acpd.clientTools` of a session/new|load|resume.
pub fn parse_client_tools(params: &Value) -> Result<Option<Vec<ClientTool>>, ClientToolsError> {
    let Some(list) = params.pointer("/_meta/acpd/clientTools") else {
        return Ok(None);
    };
    let Some(list) = list.as_array() else {
        return Err(ClientToolsError::NotAnArray);
    };
    let name_re = regex::Regex::new(r"(?i)^[a-z][\w-]{0,63}$")?;
    let mut out: Vec<ClientTool> = vec![];
    for (i, t) in list.iter().enumerate() {
        let at = |problem| ClientToolsError::Tool { index: i, problem };
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| at(ToolProblem::NoName))?;
        if !name_re.is_match(name) {
            return Err(at(ToolProblem::BadName));
        }
        let lower = name.to_ascii_lowercase();
        if BUILTIN_TOOLS.contains(&lower.as_str())
            || out.iter().any(|o| o.name.eq_ignore_ascii_case(name))
        {
            return Err(at(ToolProblem::Taken(name.to_owned())));
        }
        let description = t
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| !d.trim().is_empty())
            .ok_or_else(|| at(ToolProblem::NoDescription))?;
        let schema = t
            .get("inputSchema")
            .filter(|s| s.get("type").and_then(Value::as_str) == Some("object"))
            .ok_or_else(|| at(ToolProblem::BadSchema))?;
        let mutating = match t.get("mutating") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(at(ToolProblem::BadMutating)),
        };
        out.push(ClientTool {
            name: name.to_owned(),
            description: description.to_owned(),
            input_schema: schema.clone(),
            mutating,
        });
    }
    Ok(Some(out))
}

/// Tools beyond the built-in ones: declared by the client, or from MCP servers.
#[derive(Clone, Copy)]
pub struct Extra<'a> {
    pub client: &'a [ClientTool],
    pub mcp: &'a [McpTool],
}

pub fn is_mutating(name: &str, extra: Extra<'_>) -> bool {
    match name {
        "write_file" | "edit" | "shell" => true,
        _ => {
            extra.client.iter().any(|t| t.name == name && t.mutating)
                || extra.mcp.iter().any(|t| t.name == name && !t.read_only)
        }
    }
}

/// The tools offered in this state. Plan mode hides every mutating tool.
pub fn specs(
    config: &BuiltinConfig,
    caps: ClientCaps,
    plan: bool,
    extra: Extra<'_>,
) -> Vec<ToolSpec> {
    let can_read = config.host_fs || (config.client_fs && caps.read_text_file);
    let can_write = config.host_fs || (config.client_fs && caps.write_text_file);
    let can_edit =
        config.host_fs || (config.client_fs && caps.read_text_file && caps.write_text_file);
    let can_shell = config.host_shell || (config.client_terminal && caps.terminal);
    let s = |name: &str, description: &str, schema: Value| ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: schema,
    };
    let mut out = vec![];
    if can_read {
        out.push(s("read_file", "Read a text file. Paths are relative to the working directory or absolute. Optional 1-based `offset` line and `limit` lines for large files.",
            json!({"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer","minimum":1},"limit":{"type":"integer","minimum":1}},"required":["path"]})));
    }
    if config.host_fs {
        out.push(s("list_dir", "List the entries of a directory (directories end with /).",
            json!({"type":"object","properties":{"path":{"type":"string","description":"defaults to the working directory"}}})));
        out.push(s("glob", "Find files whose path (relative to `path`, default the working directory) matches a glob such as `**/*.rs`.",
            json!({"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"}},"required":["pattern"]})));
        out.push(s("grep", "Search file contents with a regular expression; prints path:line: text. Optional `glob` filters files, `path` picks the directory.",
            json!({"type":"object","properties":{"pattern":{"type":"string"},"path":{"type":"string"},"glob":{"type":"string"},"case_insensitive":{"type":"boolean"}},"required":["pattern"]})));
    }
    if !plan {
        if can_write {
            out.push(s("write_file", "Create or overwrite a text file with the given content.",
                json!({"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"]})));
        }
        if can_edit {
            out.push(s("edit", "Replace one exact occurrence of `old_string` with `new_string` in a file. `old_string` must occur exactly once: include enough context.",
                json!({"type":"object","properties":{"path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"}},"required":["path","old_string","new_string"]})));
        }
        if can_shell {
            out.push(s("shell", "Run a shell command (sh -c) in the working directory; returns its output and exit code.",
                json!({"type":"object","properties":{"command":{"type":"string"},"timeout_secs":{"type":"integer","minimum":1}},"required":["command"]})));
        }
    }
    if caps.elicitation_form {
        out.push(s(ask::NAME, ask::description(), ask::schema()));
    }
    for t in extra.client {
        if plan && t.mutating {
            continue;
        }
        out.push(s(&t.name, &t.description, t.input_schema.clone()));
    }
    for t in extra.mcp {
        if plan && !t.read_only {
            continue;
        }
        out.push(s(&t.name, &t.description, t.schema.clone()));
    }
    out
}

/// How a call is shown: title, ACP kind, locations.
pub fn describe(name: &str, input: &Value, roots: &Roots) -> (String, &'static str, Vec<Value>) {
    let path = input.get("path").and_then(Value::as_str);
    let loc = |p: &str| {
        let mut l = json!({ "path": roots.absolute(p) });
        if let Some(line) = input.get("offset").and_then(Value::as_u64) {
            l["line"] = json!(line);
        }
        vec![l]
    };
    let q = |k: &str| input.get(k).and_then(Value::as_str).unwrap_or("");
    match name {
        "read_file" => (
            format!("Read {}", path.unwrap_or("?")),
            "read",
            path.map(loc).unwrap_or_default(),
        ),
        "write_file" => (
            format!("Write {}", path.unwrap_or("?")),
            "edit",
            path.map(loc).unwrap_or_default(),
        ),
        "edit" => (
            format!("Edit {}", path.unwrap_or("?")),
            "edit",
            path.map(loc).unwrap_or_default(),
        ),
        "list_dir" => (format!("List {}", path.unwrap_or(".")), "search", vec![]),
        "glob" => (format!("Find {}", q("pattern")), "search", vec![]),
        "grep" => (format!("Search for {}", q("pattern")), "search", vec![]),
        ask::NAME => (format!("Ask: {}", q("question")), "other", vec![]),
        "shell" => {
            let c = q("command");
            let short: String = c.chars().take(80).collect();
            (format!("`{short}`"), "execute", vec![])
        }
        other => match other.strip_prefix("mcp__") {
            Some(rest) => (rest.replacen("__", ": ", 1), "other", vec![]),
            None => (other.to_owned(), "other", vec![]),
        },
    }
}

/// Refuses a call before it is presented for permission: a file tool's path outside the
/// session's directories.
pub fn check(env: &ToolEnv<'_>, name: &str, input: &Value) -> Result<(), ToolError> {
    files::check(env, name, input)
}

/// Runs one call of a built-in or client-declared tool.
pub async fn execute(
    env: &ToolEnv<'_>,
    name: &str,
    input: &Value,
    extra: Extra<'_>,
) -> Result<Outcome, ToolError> {
    match name {
        "read_file" => files::read_file(env, input).await,
        "write_file" => files::write_file(env, input).await,
        "edit" => files::edit(env, input).await,
        "list_dir" => files::list_dir(env, input).await,
        "glob" => files::glob(env, input).await,
        "grep" => files::grep(env, input).await,
        "shell" => shell::shell(env, input).await,
        ask::NAME if env.caps.elicitation_form => ask::ask_user(env, input).await,
        other if extra.client.iter().any(|t| t.name == other) => {
            client_tool(env, other, input).await
        }
        other if let Some(t) = extra.mcp.iter().find(|t| t.name == other) => {
            mcp::call(t, input, env.cancel).await
        }
        other => Err(ToolError::Failed(format!(
            "there is no tool named {other:?}"
        ))),
    }
}

/// `_acpd/tool_call` to the client; `_acpd/tool_call_cancel` when the turn abandons it.
async fn client_tool(env: &ToolEnv<'_>, name: &str, input: &Value) -> Result<Outcome, ToolError> {
    let params = json!({ "toolCallId": env.tool_call_id, "name": name, "input": input });
    match env
        .client
        .request(method::ACPD_TOOL_CALL, params, env.cancel)
        .await
    {
        Ok(r) => {
            let is_error = r.get("isError").and_then(Value::as_bool).unwrap_or(false);
            let text = match r.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Ok(Outcome {
                text: env.truncate(text.clone()),
                is_error,
                content: vec![
                    json!({ "type": "content", "content": { "type": "text", "text": text } }),
                ],
                raw_output: r,
            })
        }
        Err(ClientError::Cancelled) => {
            env.client
                .notify(
                    method::ACPD_TOOL_CALL_CANCEL,
                    json!({ "toolCallId": env.tool_call_id }),
                )
                .await;
            Err(ToolError::Cancelled)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_tool_validation() {
        let ok = json!({"_meta":{"acpd":{"clientTools":[{"name":"Open-Url","description":"d","inputSchema":{"type":"object"},"mutating":true}]}}});
        let t = parse_client_tools(&ok).unwrap().unwrap();
        assert!(t[0].mutating);
        for bad in [
            json!([{"name":"9x","description":"d","inputSchema":{"type":"object"}}]),
            json!([{"name":"shell","description":"d","inputSchema":{"type":"object"}}]),
            json!([{"name":"x","description":" ","inputSchema":{"type":"object"}}]),
            json!([{"name":"x","description":"d","inputSchema":{"type":"array"}}]),
            json!([{"name":"x","description":"d","inputSchema":{"type":"object"},"mutating":"yes"}]),
            json!({"name":"x"}),
        ] {
            let p = json!({"_meta":{"acpd":{"clientTools": bad}}});
            assert!(parse_client_tools(&p).is_err(), "{p}");
        }
        assert_eq!(parse_client_tools(&json!({})).unwrap(), None);
    }
}

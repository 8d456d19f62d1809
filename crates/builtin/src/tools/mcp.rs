//! MCP servers given in session/new|load|resume (stdio and streamable HTTP), connected with
//! the official Rust MCP SDK (`rmcp`). Their tools are offered to the model as
//! `mcp__<server>__<tool>`; a tool not annotated read-only counts as mutating (asks
//! permission, hidden in plan mode). The session task owns the connections.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Outcome, ToolError};

/// One tool of a connected server.
#[derive(Clone)]
pub struct McpTool {
    /// As offered to the model.
    pub name: String,
    pub server: String,
    pub tool: String,
    pub description: String,
    pub schema: Value,
    pub read_only: bool,
    peer: Peer<RoleClient>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool").field("name", &self.name).finish()
    }
}

/// A session's MCP connections.
#[derive(Default)]
pub struct McpHub {
    services: Vec<RunningService<RoleClient, ()>>,
    pub tools: Arc<Vec<McpTool>>,
}

/// The model-facing name: provider tool names allow `[A-Za-z0-9_-]{1,64}`.
fn tool_name(server: &str, tool: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let mut n = format!("mcp__{}__{}", clean(server), clean(tool));
    n.truncate(64);
    n
}

impl McpHub {
    /// Connects every server in `servers` (ACP `McpServer[]`); one that fails is skipped
    /// with a warning, returned for the user.
    pub async fn connect(
        servers: &Value,
        cwd: &Path,
        http: &reqwest::Client,
        timeout: Duration,
    ) -> (McpHub, Vec<String>) {
        let mut hub = McpHub::default();
        let mut tools = vec![];
        let mut warnings = vec![];
        for s in servers.as_array().into_iter().flatten() {
            let name = s
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("mcp")
                .to_owned();
            let started = tokio::time::timeout(timeout, connect_one(s, cwd, http)).await;
            let service = match started {
                Ok(Ok(svc)) => svc,
                Ok(Err(e)) => {
                    warnings.push(format!("MCP server {name:?} is unavailable: {e}"));
                    continue;
                }
                Err(_) => {
                    warnings.push(format!(
                        "MCP server {name:?} did not start within {}s",
                        timeout.as_secs()
                    ));
                    continue;
                }
            };
            let listed = tokio::time::timeout(timeout, service.peer().list_all_tools()).await;
            match listed {
                Ok(Ok(list)) => {
                    for t in list {
                        let schema = Value::Object((*t.input_schema).clone());
                        tools.push(McpTool {
                            name: tool_name(&name, &t.name),
                            server: name.clone(),
                            tool: t.name.to_string(),
                            description: t.description.as_deref().unwrap_or(&t.name).to_owned(),
                            schema,
                            read_only: t
                                .annotations
                                .as_ref()
                                .and_then(|a| a.read_only_hint)
                                .unwrap_or(false),
                            peer: service.peer().clone(),
                        });
                    }
                }
                _ => warnings.push(format!("MCP server {name:?} did not list its tools")),
            }
            hub.services.push(service);
        }
        hub.tools = Arc::new(tools);
        (hub, warnings)
    }

    /// Disconnects (stdio servers are stopped).
    pub async fn shutdown(self) {
        for s in self.services {
            let _ = s.cancel().await;
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("{0}")]
    Config(String),
    #[error("cannot start it: {0}")]
    Spawn(std::io::Error),
    #[error("{0}")]
    Init(String),
}

async fn connect_one(
    s: &Value,
    cwd: &Path,
    http: &reqwest::Client,
) -> Result<RunningService<RoleClient, ()>, ConnectError> {
    let pairs = |k: &str| -> Vec<(String, String)> {
        s.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| {
                Some((
                    h.get("name")?.as_str()?.to_owned(),
                    h.get("value")?.as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    match s.get("type").and_then(Value::as_str) {
        None | Some("stdio") => {
            let command = s
                .get("command")
                .and_then(Value::as_str)
                .ok_or_else(|| ConnectError::Config("a stdio server needs a command".into()))?;
            let mut cmd = tokio::process::Command::new(command);
            crate::child_env::clean(cmd.as_std_mut());
            cmd.args(
                s.get("args")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str),
            )
            .envs(pairs("env"))
            .current_dir(cwd);
            let (proc, _) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::null())
                .spawn()
                .map_err(ConnectError::Spawn)?;
            ().serve(proc)
                .await
                .map_err(|e| ConnectError::Init(e.to_string()))
        }
        Some("http") => {
            let url = s
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| ConnectError::Config("an http server needs a url".into()))?;
            let mut headers = HashMap::new();
            for (k, v) in pairs("headers") {
                let k = reqwest::header::HeaderName::try_from(k.as_str())
                    .map_err(|e| ConnectError::Config(format!("header {k:?}: {e}")))?;
                let v = reqwest::header::HeaderValue::try_from(v.as_str())
                    .map_err(|e| ConnectError::Config(format!("header {k}: {e}")))?;
                headers.insert(k, v);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
            let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
            ().serve(transport)
                .await
                .map_err(|e| ConnectError::Init(e.to_string()))
        }
        Some(other) => Err(ConnectError::Config(format!(
            "{other} MCP servers are not supported"
        ))),
    }
}

/// Calls an MCP tool; a cancel abandons the call.
pub async fn call(
    tool: &McpTool,
    input: &Value,
    cancel: &CancellationToken,
) -> Result<Outcome, ToolError> {
    let mut params = CallToolRequestParams::new(tool.tool.clone());
    params.arguments = input.as_object().cloned();
    let result = tokio::select! {
        _ = cancel.cancelled() => return Err(ToolError::Cancelled),
        r = tool.peer.call_tool(params) => r.map_err(|e| ToolError::Failed(format!("MCP server {:?}: {e}", tool.server)))?,
    };
    let mut text = vec![];
    for c in &result.content {
        match c {
            ContentBlock::Text(t) => text.push(t.text.clone()),
            ContentBlock::Image(_) => text.push("[image]".into()),
            ContentBlock::Audio(_) => text.push("[audio]".into()),
            other => text.push(serde_json::to_string(other).unwrap_or_default()),
        }
    }
    if text.is_empty()
        && let Some(s) = &result.structured_content
    {
        text.push(s.to_string());
    }
    let text = text.join("\n");
    Ok(Outcome {
        is_error: result.is_error.unwrap_or(false),
        content: vec![json!({ "type": "content", "content": { "type": "text", "text": text } })],
        raw_output: serde_json::to_value(&result).unwrap_or(Value::Null),
        text,
    })
}

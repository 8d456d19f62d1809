//! Tiny MCP servers with one tool, `add` (read-only) and one, `note` (mutating):
//! over streamable HTTP (JSON responses, an axum route), and over stdio (a POSIX shell
//! script, so no extra binary is needed). Calls are recorded.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

pub struct McpHttpServer {
    pub url: String,
    calls: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for McpHttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tools() -> Value {
    json!([
        { "name": "add", "description": "Adds two numbers", "annotations": { "readOnlyHint": true },
          "inputSchema": { "type": "object", "properties": { "a": { "type": "number" }, "b": { "type": "number" } }, "required": ["a", "b"] } },
        { "name": "note", "description": "Stores a note",
          "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } } } },
    ])
}

impl McpHttpServer {
    pub async fn start() -> McpHttpServer {
        let calls: Arc<Mutex<Vec<Value>>> = Default::default();
        let app = Router::new()
            .route(
                "/mcp",
                post(handle)
                    .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                    .delete(|| async { StatusCode::OK }),
            )
            .with_state(calls.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind mcp");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        McpHttpServer {
            url: format!("http://{addr}/mcp"),
            calls,
            task,
        }
    }

    /// `tools/call` params received so far.
    pub fn calls(&self) -> Vec<Value> {
        self.calls.lock().unwrap().clone()
    }
}

async fn handle(State(calls): State<Arc<Mutex<Vec<Value>>>>, body: String) -> Response {
    let Ok(msg) = serde_json::from_str::<Value>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let Some(id) = msg.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match msg["method"].as_str().unwrap_or("") {
        "initialize" => json!({
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": { "tools": {} },
            "serverInfo": { "name": "test-mcp", "version": "1" },
        }),
        "tools/list" => json!({ "tools": tools() }),
        "tools/call" => {
            calls.lock().unwrap().push(msg["params"].clone());
            let a = &msg["params"]["arguments"];
            let text = match msg["params"]["name"].as_str() {
                Some("add") => format!(
                    "sum={}",
                    a["a"].as_f64().unwrap_or(0.0) + a["b"].as_f64().unwrap_or(0.0)
                ),
                _ => "noted".to_owned(),
            };
            json!({ "content": [{ "type": "text", "text": text }], "isError": false })
        }
        "ping" => json!({}),
        _ => {
            let e = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32601, "message": "no such method" } });
            return ([("content-type", "application/json")], e.to_string()).into_response();
        }
    };
    let r = json!({ "jsonrpc": "2.0", "id": id, "result": result });
    (
        [
            ("content-type", "application/json"),
            ("mcp-session-id", "test-session"),
        ],
        r.to_string(),
    )
        .into_response()
}

/// Writes a stdio MCP server script into `dir`; it appends each `tools/call` line to
/// `calls.log` beside it. Returns the script's path.
pub fn stdio_server(dir: &Path) -> PathBuf {
    let path = dir.join("mcp-server.sh");
    let tools = tools().to_string();
    let script = format!(
        r#"#!/bin/sh
# One JSON-RPC message per line; the id and method are cut out with sed.
log="$(dirname "$0")/calls.log"
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
  method=$(printf '%s' "$line" | sed -n 's/.*"method":"\([^"]*\)".*/\1/p')
  [ -z "$id" ] && continue
  case "$method" in
    initialize) result='{{"protocolVersion":"2025-03-26","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"stdio-test","version":"1"}}}}' ;;
    tools/list) result='{{"tools":{tools}}}' ;;
    tools/call) printf '%s\n' "$line" >> "$log"; result='{{"content":[{{"type":"text","text":"stdio says hi"}}],"isError":false}}' ;;
    *) result='{{}}' ;;
  esac
  printf '{{"jsonrpc":"2.0","id":%s,"result":%s}}\n' "$id" "$result"
done
"#
    );
    std::fs::write(&path, script).expect("write the MCP script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

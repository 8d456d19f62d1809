//! The editor's MCP servers, tunnelled: an agent on this box reaches a stdio MCP server that
//! runs on the editor's machine (under acp-shim) through a loopback Streamable HTTP endpoint.
//!
//! acp-shim replaces each stdio server it runs locally by an `http` entry whose `url` is
//! `acpd-mcp:NAME`; `rewrite` turns that into `http://127.0.0.1:PORT/mcp/SECRET` (a loopback
//! listener of its own, bound on first use so a daemon nobody tunnels through holds no extra
//! port; TLS, bearer tokens and the origin check of the main listener do not apply; the
//! unguessable path is the capability) and remembers which connection it belongs to.
//! A POST there is one MCP JSON-RPC message: a request becomes `_acpd/mcp/message {server,
//! message}` to that connection's client, and the `message` of its answer is the HTTP answer
//! (`application/json`); a notification or response becomes `_acpd/mcp/notify` and is answered
//! 202. The connection's `PeerHandle` outlives socket drops (resumable links), so a call made
//! during a drop is answered when the link is back. No answer within `CALL_TIMEOUT`, a closed
//! connection or an error from the shim is a JSON-RPC error under the MCP request's id, never a
//! hang. GET (a server-initiated stream) is 405: the tunnel carries requests and their answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use acpd_wire::{PeerError, PeerHandle};

/// What acp-shim puts in `url` for a server it runs on the editor's machine.
pub const SCHEME: &str = "acpd-mcp:";
/// How long one MCP request may take on the editor's machine (a tool call may be slow).
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The tunnel endpoint and its routes; cheap to clone.
#[derive(Clone)]
pub struct McpTunnels {
    /// `http://127.0.0.1:PORT/mcp/` once the listener is bound.
    base: Arc<tokio::sync::OnceCell<Arc<str>>>,
    tasks: TaskTracker,
    stop: CancellationToken,
    /// A std Mutex: held only to insert, remove or clone one route, never across an await.
    routes: Arc<Mutex<HashMap<String, Route>>>,
}

struct Route {
    conn: Arc<str>,
    /// The shim's token for the server, on `conn`.
    server: String,
    /// The entry's `name`: what a later load of the same session names it by.
    name: String,
    /// The acpd session it was given to, once known.
    session: Option<String>,
    peer: PeerHandle,
}

impl McpTunnels {
    /// The tunnels of a daemon whose tasks are `tasks`; the listener is served until `stop`.
    pub fn new(tasks: &TaskTracker, stop: CancellationToken) -> Self {
        McpTunnels {
            base: Arc::default(),
            tasks: tasks.clone(),
            stop,
            routes: Arc::default(),
        }
    }

    /// The endpoint's base URL, binding the loopback listener the first time.
    async fn base(&self) -> std::io::Result<Arc<str>> {
        let bind = async {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
            let addr = listener.local_addr()?;
            let app = axum::Router::new()
                .route("/mcp/{secret}", post(on_post).get(not_allowed))
                .with_state(self.clone());
            let stop = self.stop.clone();
            self.tasks.spawn(async move {
                let serve =
                    axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "the MCP tunnel listener failed");
                }
            });
            tracing::info!(%addr, "MCP tunnel listening");
            Ok::<_, std::io::Error>(Arc::from(format!("http://{addr}/mcp/")))
        };
        self.base.get_or_try_init(|| bind).await.cloned()
    }

    /// For `session/new|load|resume` (other methods: nothing to do), points the `acpd-mcp:`
    /// entries of `params.mcpServers` at this daemon's endpoint, for
    /// the client on `peer`, and returns their secrets (for `bind`). Without a listener they
    /// stay as they are (the agent reports an address it cannot use).
    ///
    /// A `session/load|resume` (`params.sessionId`) also re-points the routes the session's
    /// agent already holds, by server name, at this client: an agent side that lives on keeps
    /// the URLs it was first given.
    pub async fn rewrite(
        &self,
        method: &str,
        params: &mut Value,
        conn: &Arc<str>,
        peer: &PeerHandle,
    ) -> Vec<String> {
        if !matches!(method, "session/new" | "session/load" | "session/resume") {
            return vec![];
        }
        let session = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let tunnelled = |s: &Value| {
            s.get("url")
                .and_then(Value::as_str)
                .is_some_and(|u| u.starts_with(SCHEME))
        };
        let Some(servers) = params.get_mut("mcpServers").and_then(Value::as_array_mut) else {
            return vec![];
        };
        if !servers.iter().any(tunnelled) {
            return vec![];
        }
        let base = match self.base().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for the MCP tunnel");
                return vec![];
            }
        };
        let mut secrets = vec![];
        for s in servers.iter_mut() {
            let Some(server) = s
                .get("url")
                .and_then(Value::as_str)
                .and_then(|u| u.strip_prefix(SCHEME))
                .map(str::to_owned)
            else {
                continue;
            };
            let name = s
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let secret = uuid::Uuid::new_v4().simple().to_string();
            s["url"] = json!(format!("{base}{secret}"));
            let route = Route {
                conn: conn.clone(),
                server: server.clone(),
                name: name.clone(),
                session: session.clone(),
                peer: peer.clone(),
            };
            let mut routes = self.routes.lock().expect("tunnel routes");
            if session.is_some() {
                for r in routes.values_mut() {
                    if r.session == session && r.name == name {
                        r.conn = conn.clone();
                        r.server = server.clone();
                        r.peer = peer.clone();
                    }
                }
            }
            routes.insert(secret.clone(), route);
            secrets.push(secret);
        }
        secrets
    }

    /// `session/new` made `session`: the routes `rewrite` returned are its.
    pub fn bind(&self, secrets: &[String], session: &str) {
        let mut routes = self.routes.lock().expect("tunnel routes");
        for s in secrets {
            if let Some(r) = routes.get_mut(s) {
                r.session = Some(session.to_owned());
            }
        }
    }

    /// The connection ended. Routes of a session stay (a later load re-points them; until
    /// then a call is answered "the editor disconnected"); the others go. The shim stops its
    /// servers itself.
    pub fn forget(&self, conn: &Arc<str>) {
        self.routes
            .lock()
            .expect("tunnel routes")
            .retain(|_, r| &r.conn != conn || r.session.is_some());
    }
}

async fn not_allowed() -> StatusCode {
    StatusCode::METHOD_NOT_ALLOWED
}

async fn on_post(State(t): State<McpTunnels>, Path(secret): Path<String>, body: Bytes) -> Response {
    let route = {
        let routes = t.routes.lock().expect("tunnel routes");
        routes
            .get(&secret)
            .map(|r| (r.peer.clone(), r.server.clone()))
    };
    let Some((peer, server)) = route else {
        return (StatusCode::NOT_FOUND, "no such MCP tunnel").into_response();
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        let e = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "Parse error"}});
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    };
    let id = message.get("id").cloned();
    let params = json!({ "server": server, "message": message });
    let Some(id) = id.filter(|_| message.get("method").is_some()) else {
        // A notification (or a response): nothing to wait for.
        if peer.notify("_acpd/mcp/notify", Some(params)).await.is_err() {
            return (StatusCode::NOT_FOUND, "the editor is gone").into_response();
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let call = peer.request("_acpd/mcp/message", Some(params));
    let why = match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => match v.get("message") {
            Some(m) => return Json(m.clone()).into_response(),
            None => "the editor's side of the MCP tunnel answered without a message".to_owned(),
        },
        // The shim's own words: which server failed to start or exited.
        Ok(Err(PeerError::Remote(e))) => e.message,
        Ok(Err(PeerError::Disconnected)) => "the editor disconnected".to_owned(),
        Err(_) => format!(
            "MCP server `{server}` on the editor's machine did not answer within {}s",
            CALL_TIMEOUT.as_secs()
        ),
    };
    tracing::info!(%server, %why, "MCP tunnel call failed");
    Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": why}}))
        .into_response()
}

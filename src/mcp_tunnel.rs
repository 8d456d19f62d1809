//! The editor's MCP servers, tunnelled: an agent on this box reaches a stdio MCP server that
//! runs on the editor's machine (under acp-shim) through a loopback Streamable HTTP endpoint.
//!
//! acp-shim replaces each stdio server it runs locally by an `http` entry whose `url` is
//! `acpd-mcp:TOKEN`. That form is what a session stores; only a message to the agent carries
//! loopback URLs: `for_agent` turns each entry into `http://127.0.0.1:PORT/mcp/SECRET` (a
//! loopback listener of its own, bound on first use so a daemon nobody tunnels through holds no
//! extra port; TLS, bearer tokens and the origin check of the main listener do not apply; the
//! unguessable path is the capability), a route to (session, server name). Which connection
//! serves a session's tunnelled servers is its *carrier* (`carry`: the client whose
//! `session/new|load|resume`, or whose re-attach after a daemon restart, named them), with that
//! connection's tokens by name; a route is resolved through it at each call, so a new carrier
//! (another shim, a restarted daemon) serves the URLs the agent already holds.
//! A POST there is one MCP JSON-RPC message: a request becomes `_acpd/mcp/message {server,
//! message}` to the carrier, and the `message` of its answer is the HTTP answer
//! (`application/json`); a notification or response becomes `_acpd/mcp/notify` and is answered
//! 202. The carrier's `PeerHandle` outlives socket drops (resumable links), so a call made
//! during a drop is answered when the link is back. No answer within `CALL_TIMEOUT`, no
//! carrier, a closed connection or an error from the shim is a JSON-RPC error under the MCP
//! request's id, never a hang. GET (a server-initiated stream) is 405.

use acpd_protocol::method;
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

use acpd_wire::{PeerError, PeerHandle, code};

/// What acp-shim puts in `url` for a server it runs on the editor's machine.
pub const SCHEME: &str = "acpd-mcp:";
/// How long one MCP request may take on the editor's machine (a tool call may be slow).
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The tunnel endpoint, its routes and each session's carrier; cheap to clone.
///
/// The only owner of both tables: session actors tell it who carries their servers
/// (`carry`, `inherit`, `end`) and ask it for the agent's URLs (`for_agent`); the endpoint
/// reads it per call.
#[derive(Clone)]
pub struct McpTunnels {
    /// `http://127.0.0.1:PORT/mcp/` once the listener is bound.
    base: Arc<tokio::sync::OnceCell<Arc<str>>>,
    tasks: TaskTracker,
    stop: CancellationToken,
    /// A std Mutex: held only to read or change a few entries, never across an await.
    state: Arc<Mutex<Tables>>,
    /// The daemon's accept gate: the tunnel's connections are pending (capped, displaced,
    /// header timeout) like any other listener's; a capability URL is no authentication.
    gate: crate::transport::gate::Gate,
}

#[derive(Default)]
struct Tables {
    /// By secret: the (session, server name) a loopback URL stands for.
    routes: HashMap<String, Route>,
    /// By session: the connection that serves its tunnelled servers.
    carriers: HashMap<String, Carrier>,
}

struct Route {
    session: String,
    name: String,
}

#[derive(Clone)]
struct Carrier {
    peer: PeerHandle,
    /// The carrier's token (what `_acpd/mcp/message` names) for each server name.
    tokens: HashMap<String, String>,
}

/// The `acpd-mcp:` entries of an `mcpServers` list: (name, token).
fn tunnelled(servers: &Value) -> impl Iterator<Item = (String, String)> + '_ {
    servers.as_array().into_iter().flatten().filter_map(|s| {
        let token = s.get("url")?.as_str()?.strip_prefix(SCHEME)?;
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        Some((name.to_owned(), token.to_owned()))
    })
}

impl McpTunnels {
    /// The tunnels of a daemon whose tasks are `tasks`; the listener is served until `stop`.
    pub fn new(
        tasks: &TaskTracker,
        stop: CancellationToken,
        gate: crate::transport::gate::Gate,
    ) -> Self {
        McpTunnels {
            base: Arc::default(),
            tasks: tasks.clone(),
            stop,
            state: Arc::default(),
            gate,
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
            // The daemon's own accept loop (not `axum::serve`): the gate, and a header read
            // timeout, so idle sockets cannot hold the tunnel's descriptors.
            let serve = crate::transport::listen::serve_plain(
                listener,
                app,
                self.gate.clone(),
                self.tasks.clone(),
                self.stop.clone(),
            );
            self.tasks.spawn(async move {
                if let Err(e) = serve.await {
                    tracing::warn!(error = %e, "the MCP tunnel listener failed");
                }
            });
            tracing::info!("MCP tunnel listening: http://{addr}/mcp/");
            Ok::<_, std::io::Error>(Arc::from(format!("http://{addr}/mcp/")))
        };
        self.base.get_or_try_init(|| bind).await.cloned()
    }

    /// `peer` serves the `acpd-mcp:` entries of `servers` for `session` from now on (a list
    /// without any changes nothing: the last client that carried them still does).
    pub fn carry(&self, session: &str, peer: &PeerHandle, servers: &Value) {
        let tokens: HashMap<String, String> = tunnelled(servers).collect();
        if tokens.is_empty() {
            return;
        }
        tracing::debug!(%session, servers = tokens.len(), "MCP tunnel carrier set");
        let carrier = Carrier {
            peer: peer.clone(),
            tokens,
        };
        let mut st = self.state.lock().expect("tunnel state");
        st.carriers.insert(session.to_owned(), carrier);
    }

    /// A fork is served by its parent's carrier.
    pub fn inherit(&self, parent: &str, child: &str) {
        let mut st = self.state.lock().expect("tunnel state");
        if let Some(c) = st.carriers.get(parent).cloned() {
            st.carriers.insert(child.to_owned(), c);
        }
    }

    /// The session closed (or was never made): its routes and carrier go.
    pub fn end(&self, session: &str) {
        let mut st = self.state.lock().expect("tunnel state");
        st.carriers.remove(session);
        st.routes.retain(|_, r| r.session != session);
    }

    /// `servers` as `session`'s agent is to see them: each `acpd-mcp:` entry a loopback URL
    /// of its own. Without a listener they stay as they are (the agent reports an address it
    /// cannot use).
    pub async fn for_agent(&self, session: &str, servers: &Value) -> Value {
        let mut servers = servers.clone();
        if tunnelled(&servers).next().is_none() {
            return servers;
        }
        let base = match self.base().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for the MCP tunnel");
                return servers;
            }
        };
        let mut st = self.state.lock().expect("tunnel state");
        for s in servers.as_array_mut().into_iter().flatten() {
            let ours = s
                .get("url")
                .and_then(Value::as_str)
                .is_some_and(|u| u.starts_with(SCHEME));
            if !ours {
                continue;
            }
            let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
            // A restore within this daemon's life gives the agent the URL it had.
            let known = st
                .routes
                .iter()
                .find(|(_, r)| r.session == session && r.name == name)
                .map(|(secret, _)| secret.clone());
            let secret = known.unwrap_or_else(|| {
                let secret = uuid::Uuid::new_v4().simple().to_string();
                let route = Route {
                    session: session.to_owned(),
                    name: name.to_owned(),
                };
                st.routes.insert(secret.clone(), route);
                secret
            });
            s["url"] = json!(format!("{base}{secret}"));
        }
        servers
    }

    /// Where a POST to `secret` goes: the carrier's peer and token, or why not.
    fn resolve(&self, secret: &str) -> Option<Result<(PeerHandle, String), Unreachable>> {
        let st = self.state.lock().expect("tunnel state");
        let route = st.routes.get(secret)?;
        let name = &route.name;
        let Some(carrier) = st.carriers.get(&route.session) else {
            return Some(Err(Unreachable::NoCarrier(name.clone())));
        };
        Some(match carrier.tokens.get(name) {
            Some(token) => Ok((carrier.peer.clone(), token.clone())),
            None => Err(Unreachable::NotCarried(name.clone())),
        })
    }
}

/// Why a tunnelled MCP server cannot be reached (told to the agent that called it).
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    #[error(
        "MCP server `{0}` runs on the editor's machine, and no editor connection that carries it is attached"
    )]
    NoCarrier(String),
    #[error("the editor's connection no longer carries MCP server `{0}`")]
    NotCarried(String),
}

async fn not_allowed() -> StatusCode {
    StatusCode::METHOD_NOT_ALLOWED
}

async fn on_post(State(t): State<McpTunnels>, Path(secret): Path<String>, body: Bytes) -> Response {
    let Some(route) = t.resolve(&secret) else {
        return (StatusCode::NOT_FOUND, "no such MCP tunnel").into_response();
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        let e = crate::error::reply(&Value::Null, code::PARSE_ERROR, "Parse error");
        return (StatusCode::BAD_REQUEST, Json(e)).into_response();
    };
    let id = message.get("id").cloned();
    let (peer, server) = match route {
        Ok(r) => r,
        Err(why) if id.is_none() || message.get("method").is_none() => {
            return (StatusCode::NOT_FOUND, why.to_string()).into_response();
        }
        Err(why) => {
            tracing::info!(%why, "MCP tunnel call refused");
            let e = crate::error::reply(&id.clone().into(), code::INTERNAL_ERROR, &why.to_string());
            return Json(e).into_response();
        }
    };
    let params = json!({ "server": server, "message": message });
    let Some(id) = id.filter(|_| message.get("method").is_some()) else {
        // A notification (or a response): nothing to wait for.
        if peer
            .notify(method::ACPD_MCP_NOTIFY, Some(params))
            .await
            .is_err()
        {
            return (StatusCode::NOT_FOUND, "the editor is gone").into_response();
        }
        return StatusCode::ACCEPTED.into_response();
    };
    let call = peer.request(method::ACPD_MCP_MESSAGE, Some(params));
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
    Json(crate::error::reply(&id, code::INTERNAL_ERROR, &why)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn agents_get_one_loopback_url_per_server_and_session() {
        let gate = crate::transport::gate::Gate::with(
            Duration::from_secs(1),
            crate::transport::gate::admission::Limits {
                max_pending: 0,
                max_pending_per_source: 0,
                max_open: 0,
                max_streams_per_principal: 0,
            },
        );
        let t = McpTunnels::new(&TaskTracker::new(), CancellationToken::new(), gate);
        let servers = json!([
            {"type": "http", "name": "git", "url": "acpd-mcp:1-git", "headers": []},
            {"type": "http", "name": "web", "url": "https://x/mcp", "headers": []},
        ]);
        let seen = t.for_agent("s1", &servers).await;
        let url = seen[0]["url"].as_str().unwrap().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        assert_eq!(seen[1], servers[1]);
        // A restore in the same daemon gives the same URL; another session gets its own.
        assert_eq!(t.for_agent("s1", &servers).await[0]["url"], url.as_str());
        assert_ne!(t.for_agent("s2", &servers).await[0]["url"], url.as_str());
        // No carrier yet (a restarted daemon before the shim re-attached): a clear error.
        let secret = url.rsplit('/').next().unwrap();
        let Some(Err(why)) = t.resolve(secret) else {
            panic!("resolved without a carrier")
        };
        assert!(why.to_string().contains("`git`"), "{why}");
        t.end("s1");
        assert!(t.resolve(secret).is_none());
        assert_eq!(tunnelled(&servers).count(), 1);
    }
}

//! The built-in agent: acpd's own ACP agent (LLM providers, tools, permissions, modes),
//! run as a task inside acpd and spoken to over an in-memory link like any hosted agent.
//!
//! `run` owns the map of live sessions (one task each, see `session.rs`) and routes
//! requests to them. A session not in memory (after a restart, or unloaded when idle) is
//! read back from its state file on first use, so `session/resume` after a daemon restart
//! continues with the full transcript.

pub mod child_env;
mod client;
mod config;
mod content;
mod mcp_consent;
pub mod mcp_policy;
mod options;
mod provider;
mod session;
mod state;
mod tools;
mod transcript;
mod turn;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use acpd_protocol::method;
use acpd_wire::{Incoming, IncomingRequest, Link, Notification, PeerHandle, ResponseError, code};
use client::ClientCaps;
pub use config::{BuiltinConfig, BuiltinConfigError};
pub use mcp_policy::{McpPolicy, McpPolicyError};
pub use provider::model_problem;
use session::{Ended, Session, SessionCmd};
use state::StateError;

/// Per-agent state every session shares.
pub(crate) struct Shared {
    pub config: Arc<BuiltinConfig>,
    pub peer: PeerHandle,
    /// For MCP servers over HTTP (their event streams may idle for long).
    pub http: reqwest::Client,
    /// For model providers: connect and read (idle) timeouts from the config.
    pub model_http: reqwest::Client,
    pub caps: ClientCaps,
}

/// Runs the agent on `link` until the link closes or `cancel` fires.
pub async fn run(link: Link, config: Arc<BuiltinConfig>, cancel: CancellationToken) {
    let (peer, mut incoming, peer_task) = acpd_wire::spawn(link, cancel.clone());
    // reqwest is built without a bundled TLS provider: ring is installed once per process
    // (an error only means one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let clients = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .build()
        .and_then(|http| {
            let model_http = reqwest::Client::builder()
                .connect_timeout(config.connect_timeout)
                .read_timeout(config.read_timeout)
                .build()?;
            Ok((http, model_http))
        });
    let (http, model_http) = match clients {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "built-in agent: cannot build the HTTP client");
            cancel.cancel();
            let _ = peer_task.await;
            return;
        }
    };
    let sessions_stop = cancel.child_token();
    let mut agent = Agent {
        config,
        peer,
        http,
        model_http,
        shared: None,
        live: HashMap::new(),
        tasks: JoinSet::new(),
        stop: sessions_stop.clone(),
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            msg = incoming.recv() => match msg {
                Some(Incoming::Request(r)) => agent.on_request(*r).await,
                Some(Incoming::Notification(n)) => agent.on_notification(n.into_notification()).await,
                Some(Incoming::Response { .. }) => {}
                None => break,
            },
            Some(ended) = agent.tasks.join_next() => {
                if let Ok(ended) = ended {
                    agent.on_ended(ended).await;
                }
            }
        }
    }
    sessions_stop.cancel();
    while agent.tasks.join_next().await.is_some() {}
    drop(agent);
    cancel.cancel();
    let _ = peer_task.await;
}

struct Agent {
    config: Arc<BuiltinConfig>,
    peer: PeerHandle,
    http: reqwest::Client,
    model_http: reqwest::Client,
    /// Set by `initialize`.
    shared: Option<Arc<Shared>>,
    live: HashMap<Arc<str>, mpsc::Sender<SessionCmd>>,
    tasks: JoinSet<Ended>,
    stop: CancellationToken,
}

fn sid_of(params: &Value) -> Option<Arc<str>> {
    params
        .get("sessionId")
        .and_then(Value::as_str)
        .map(Arc::from)
}

fn not_found(sid: &str) -> ResponseError {
    ResponseError::new(code::RESOURCE_NOT_FOUND, "Resource not found")
        .with_data(json!({ "sessionId": sid }))
}

impl Agent {
    async fn on_request(&mut self, req: IncomingRequest) {
        let IncomingRequest {
            method,
            params,
            responder,
            ..
        } = req;
        let params = params.unwrap_or_else(|| json!({}));
        if method == method::INITIALIZE {
            self.initialize(&params);
            return responder.respond(Ok(initialize_result())).await;
        }
        let Some(shared) = self.shared.clone() else {
            return responder
                .respond(Err(ResponseError::invalid_request(
                    "initialize must come first",
                )))
                .await;
        };
        let cmd = match method.as_str() {
            method::AUTHENTICATE | method::LOGOUT => return responder.respond(Ok(json!({}))).await,
            method::SESSION_NEW => return self.new_session(shared, params, responder).await,
            method::SESSION_LOAD | method::SESSION_RESUME => {
                let replay = method == method::SESSION_LOAD;
                return self.load_session(&shared, params, responder, replay).await;
            }
            method::SESSION_PROMPT => SessionCmd::Prompt {
                params: params.clone(),
                responder,
            },
            method::SESSION_SET_MODE => match params.get("modeId").and_then(Value::as_str) {
                Some(m) => SessionCmd::SetMode {
                    mode: m.to_owned(),
                    responder,
                },
                None => {
                    return responder
                        .respond(Err(ResponseError::invalid_params("modeId is required")))
                        .await;
                }
            },
            method::SESSION_SET_CONFIG_OPTION => {
                let id = params.get("configId").and_then(Value::as_str);
                let value = params.get("value").and_then(Value::as_str);
                match (id, value) {
                    (Some(id), Some(v)) => SessionCmd::SetConfig {
                        id: id.to_owned(),
                        value: v.to_owned(),
                        responder,
                    },
                    _ => {
                        let e = ResponseError::invalid_params(
                            "configId and a string value are required",
                        );
                        return responder.respond(Err(e)).await;
                    }
                }
            }
            method::SESSION_CLOSE | method::SESSION_DELETE => {
                let delete = method == method::SESSION_DELETE;
                return self.close_session(params, responder, delete).await;
            }
            _ => {
                return responder
                    .respond(Err(ResponseError::method_not_found(&method)))
                    .await;
            }
        };
        self.hand_to_session(&shared, &params, cmd).await
    }

    /// Hands a command to the session `params` names (none named: the request is refused).
    async fn hand_to_session(&mut self, shared: &Arc<Shared>, params: &Value, cmd: SessionCmd) {
        match sid_of(params) {
            Some(sid) => self.dispatch(shared, sid, cmd).await,
            None => {
                if let SessionCmd::Prompt { responder, .. }
                | SessionCmd::SetMode { responder, .. }
                | SessionCmd::SetConfig { responder, .. } = cmd
                {
                    responder
                        .respond(Err(ResponseError::invalid_params("sessionId is required")))
                        .await;
                }
            }
        }
    }

    /// What the client's `initialize` says it can do, shared by the sessions to come.
    fn initialize(&mut self, params: &Value) {
        let caps = ClientCaps::from_initialize(params);
        self.shared = Some(Arc::new(Shared {
            config: self.config.clone(),
            peer: self.peer.clone(),
            http: self.http.clone(),
            model_http: self.model_http.clone(),
            caps,
        }));
    }

    /// `session/load` (`replay`: the history goes to the client) or `session/resume`.
    async fn load_session(
        &mut self,
        shared: &Arc<Shared>,
        params: Value,
        responder: acpd_wire::Responder,
        replay: bool,
    ) {
        let Some(sid) = sid_of(&params) else {
            return responder
                .respond(Err(ResponseError::invalid_params("sessionId is required")))
                .await;
        };
        if let Err(m) = tools::parse_client_tools(&params) {
            return responder
                .respond(Err(ResponseError::invalid_params(m)))
                .await;
        }
        let mcp_servers = params.get("mcpServers").and_then(Value::as_array).cloned();
        let cmd = SessionCmd::Start {
            responder,
            result: json!({}),
            replay,
            params,
            mcp_servers,
        };
        self.dispatch(shared, sid, cmd).await
    }

    /// `session/close`, or `session/delete` (its state goes too).
    async fn close_session(
        &mut self,
        params: Value,
        responder: acpd_wire::Responder,
        delete: bool,
    ) {
        let Some(sid) = sid_of(&params) else {
            return responder
                .respond(Err(ResponseError::invalid_params("sessionId is required")))
                .await;
        };
        match self.live.get(&sid) {
            Some(tx) => {
                if let Err(mpsc::error::SendError(SessionCmd::Close { responder, .. })) =
                    tx.send(SessionCmd::Close { responder, delete }).await
                {
                    responder.respond(Ok(json!({}))).await;
                }
            }
            None => {
                if delete && let Err(e) = state::delete(&self.config.state_dir, &sid).await {
                    tracing::warn!(session = %sid, error = %e, "cannot delete the session state");
                }
                responder.respond(Ok(json!({}))).await;
            }
        }
    }

    async fn on_notification(&mut self, n: Notification) {
        if n.method == method::SESSION_CANCEL
            && let Some(sid) = n.params.as_ref().and_then(sid_of)
            && let Some(tx) = self.live.get(&sid)
        {
            let _ = tx.send(SessionCmd::Cancel).await;
        }
    }

    async fn new_session(
        &mut self,
        shared: Arc<Shared>,
        params: Value,
        responder: acpd_wire::Responder,
    ) {
        let cwd = params.get("cwd").and_then(Value::as_str).map(PathBuf::from);
        let Some(cwd) = cwd.filter(|c| c.is_absolute()) else {
            return responder
                .respond(Err(ResponseError::invalid_params(
                    "cwd must be an absolute path",
                )))
                .await;
        };
        let dirs: Vec<PathBuf> = params
            .get("additionalDirectories")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        if dirs.iter().any(|d| !d.is_absolute()) {
            return responder
                .respond(Err(ResponseError::invalid_params(
                    "additionalDirectories must be absolute paths",
                )))
                .await;
        }
        let client_tools = match tools::parse_client_tools(&params) {
            Ok(t) => t.unwrap_or_default(),
            Err(m) => {
                return responder
                    .respond(Err(ResponseError::invalid_params(m)))
                    .await;
            }
        };
        let sid: Arc<str> = Arc::from(uuid::Uuid::new_v4().to_string());
        let mut saved =
            state::SavedSession::new(cwd, dirs, options::default_settings(&self.config));
        saved.client_tools = client_tools;
        if let Err(e) = state::save(&self.config.state_dir, &sid, &saved).await {
            tracing::error!(error = %e, "cannot save a new session's state");
            return responder
                .respond(Err(ResponseError::internal(
                    "cannot save the session state",
                )))
                .await;
        }
        let tx = self.spawn(&shared, sid.clone(), saved);
        let cmd = SessionCmd::Start {
            responder,
            result: json!({ "sessionId": &*sid }),
            replay: false,
            params: json!({}),
            mcp_servers: params.get("mcpServers").and_then(Value::as_array).cloned(),
        };
        let _ = tx.send(cmd).await;
    }

    fn spawn(
        &mut self,
        shared: &Arc<Shared>,
        sid: Arc<str>,
        saved: state::SavedSession,
    ) -> mpsc::Sender<SessionCmd> {
        let (tx, rx) = mpsc::channel(32);
        let session = Session::new(sid.clone(), shared.clone(), saved);
        self.tasks.spawn(session.run(rx, self.stop.child_token()));
        self.live.insert(sid, tx.clone());
        tx
    }

    /// Sends a command to a session, reading it from disk first if it is not in memory.
    async fn dispatch(&mut self, shared: &Arc<Shared>, sid: Arc<str>, cmd: SessionCmd) {
        let cmd = match self.live.get(&sid) {
            Some(tx) => match tx.send(cmd).await {
                Ok(()) => return,
                Err(e) => {
                    self.live.remove(&sid);
                    e.0
                }
            },
            None => cmd,
        };
        match state::load(&self.config.state_dir, &sid).await {
            Ok(saved) => {
                let tx = self.spawn(shared, sid, saved);
                let _ = tx.send(cmd).await;
            }
            Err(e) => {
                let err = match &e {
                    StateError::NotFound(_) | StateError::BadId(_) => not_found(&sid),
                    _ => {
                        tracing::error!(session = %sid, error = %e, "cannot read the session state");
                        ResponseError::internal("cannot read the session state")
                    }
                };
                refuse(cmd, err).await;
            }
        }
    }

    async fn on_ended(&mut self, ended: Ended) {
        // Only forget the sender if it is the ended task's (a reload may have replaced it).
        if self.live.get(&ended.id).is_some_and(|tx| tx.is_closed()) {
            self.live.remove(&ended.id);
        }
        let Some(shared) = self.shared.clone() else {
            return;
        };
        for cmd in ended.leftover {
            self.dispatch(&shared, ended.id.clone(), cmd).await;
        }
    }
}

async fn refuse(cmd: SessionCmd, err: ResponseError) {
    match cmd {
        SessionCmd::Start { responder, .. }
        | SessionCmd::Prompt { responder, .. }
        | SessionCmd::SetMode { responder, .. }
        | SessionCmd::SetConfig { responder, .. }
        | SessionCmd::Close { responder, .. } => responder.respond(Err(err)).await,
        SessionCmd::Cancel => {}
    }
}

fn initialize_result() -> Value {
    json!({
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": { "image": true, "audio": false, "embeddedContext": true },
            "mcpCapabilities": { "http": true, "sse": false },
            "sessionCapabilities": { "resume": {}, "close": {}, "delete": {}, "additionalDirectories": {} },
        },
        "authMethods": [],
        "agentInfo": { "name": "acpd-builtin", "title": "acpd built-in agent", "version": env!("CARGO_PKG_VERSION") },
    })
}

//! Sessions: the `SessionHub` owns the map of live sessions, one actor task each
//! (`actor::Session`). A session outlives the sockets attached to it; only the session layer
//! reads or writes the store.

mod actor;
pub(crate) use actor::agent_forks;
mod claim;
pub mod compaction;
mod hub;
mod mcp;
mod outbox;
mod pending;
mod remote;
mod retention;
pub mod roles;
mod share;
pub use share::{ShareRequest, share_in_store};
mod status;
pub use status::LiveStatus;
mod titles;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent::{AgentHandle, AgentKey, AgentPool};
use crate::config::SessionSettings;
use crate::error::AcpError;
use acpd_store::{SessionRow, Store, StoreError};
use acpd_wire::{PeerHandle, Responder, ResponseError};

/// Identifies one client connection.
pub type ConnId = Arc<str>;

/// A client connection as a session sees it.
#[derive(Clone, Debug)]
pub struct Client {
    pub conn: ConnId,
    pub peer: PeerHandle,
    /// The client's `initialize` params, used to start the agent on its behalf.
    pub init: Arc<Value>,
    /// What it may do in the session (`roles.rs`); the connection has capped it already by
    /// what its principal was granted.
    pub role: roles::Role,
    /// Its principal (id): a revoked grant cuts off that principal's clients.
    pub principal: Arc<str>,
    /// The name of its principal, for presence.
    pub principal_name: Arc<str>,
    /// Its `acpd-mcp:` MCP servers can be tunnelled (acp-shim's transport, a WebSocket).
    pub mcp_tunnel: bool,
}

impl Client {
    /// Whether the `acpd-mcp:` servers it names are served through it: only a controller's
    /// (an observer does not decide what the agent's tools reach) over acp-shim's transport.
    pub fn carries_mcp(&self) -> bool {
        self.mcp_tunnel && self.role.may_steer()
    }

    /// `initialize.clientInfo.name`, if it sent one.
    pub fn name(&self) -> Option<&str> {
        self.init
            .pointer("/clientInfo/name")
            .and_then(Value::as_str)
    }

    /// `initialize.clientCapabilities`.
    pub fn caps(&self) -> &Value {
        self.init.get("clientCapabilities").unwrap_or(&Value::Null)
    }

    /// How presence and `decidedBy` name it.
    pub fn describe(&self) -> Value {
        json!({
            "connectionId": &*self.conn,
            "name": self.name(),
            "role": self.role.as_str(),
            "principal": &*self.principal_name,
        })
    }
}

/// How a client attaches.
#[derive(Debug)]
pub enum AttachMode {
    /// Right after `session/new`: answer with `result`.
    New { result: Value },
    /// `session/load`: replay the whole journal, then answer.
    Load { params: Value },
    /// `session/resume`: no replay.
    Resume { params: Value },
    /// `_acpd/session/attach`: replay what came after `after_seq`, answer `{lastSeq}`. Its
    /// `mcpServers` (acp-shim's re-attach after a daemon restart) claim the session's
    /// tunnelled servers for this client; they do not reach the agent.
    After {
        after_seq: i64,
        mcp_servers: Option<Value>,
    },
    /// A request on a session this connection has not attached yet.
    Implicit,
}

/// What a session actor is asked to do. Every variant with a responder gets one answer.
#[derive(Debug)]
pub enum SessionCommand {
    Attach {
        client: Client,
        mode: AttachMode,
        responder: Option<Responder>,
    },
    Detach {
        conn: ConnId,
    },
    Prompt {
        conn: ConnId,
        params: Value,
        responder: Responder,
    },
    /// `session/cancel`; `conn`: the client that sent it (`None`: acpd itself — a drain, a
    /// revocation).
    Cancel {
        conn: Option<ConnId>,
    },
    /// Any other session-scoped request (`session/set_mode`, `session/set_config_option`,
    /// extension methods): relayed to the agent with the session id rewritten.
    Relay {
        conn: ConnId,
        method: String,
        params: Value,
        responder: Responder,
    },
    /// Session-scoped notifications other than cancel.
    RelayNotification {
        conn: ConnId,
        method: String,
        params: Value,
    },
    /// `session/fork` (`actor/fork.rs`).
    Fork {
        client: Client,
        params: Value,
        responder: Responder,
    },
    Close {
        conn: Option<ConnId>,
        responder: Responder,
    },
    Delete {
        conn: Option<ConnId>,
        responder: Responder,
    },
    /// `principal`'s grant on the session was revoked: its clients are cut off.
    Revoke {
        principal: String,
    },
}

impl SessionCommand {
    /// Answers the command with an error, if it expects an answer (it never ran).
    pub async fn reject(self, e: ResponseError) {
        if let Some(r) = self.into_responder() {
            r.respond(Err(e)).await
        }
    }

    /// The responder the command would answer, if it expects an answer.
    pub fn into_responder(self) -> Option<Responder> {
        match self {
            SessionCommand::Attach {
                responder: Some(r), ..
            }
            | SessionCommand::Prompt { responder: r, .. }
            | SessionCommand::Relay { responder: r, .. }
            | SessionCommand::Fork { responder: r, .. }
            | SessionCommand::Close { responder: r, .. }
            | SessionCommand::Delete { responder: r, .. } => Some(r),
            _ => None,
        }
    }

    /// The client that sent a command only a controller may send.
    pub fn steered_by(&self) -> Option<&ConnId> {
        match self {
            SessionCommand::Prompt { conn, .. }
            | SessionCommand::Relay { conn, .. }
            | SessionCommand::RelayNotification { conn, .. } => Some(conn),
            SessionCommand::Fork { client, .. } => Some(&client.conn),
            SessionCommand::Cancel { conn }
            | SessionCommand::Close { conn, .. }
            | SessionCommand::Delete { conn, .. } => conn.as_ref(),
            SessionCommand::Attach { .. }
            | SessionCommand::Detach { .. }
            | SessionCommand::Revoke { .. } => None,
        }
    }
}

/// Talks to one live session actor. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SessionHandle {
    pub id: Arc<str>,
    /// The principal that owns the session.
    pub principal: Arc<str>,
    /// The agent profile the session runs on.
    pub profile: Arc<str>,
    tx: mpsc::Sender<SessionCommand>,
    /// Published by the actor when a turn starts or ends and when a client comes or goes.
    status: tokio::sync::watch::Receiver<LiveStatus>,
}

impl SessionHandle {
    /// Queues a command; `Err` gives it back when the actor has ended.
    pub async fn send(&self, cmd: SessionCommand) -> Result<(), SessionCommand> {
        self.tx.send(cmd).await.map_err(|e| e.0)
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    pub fn status(&self) -> LiveStatus {
        self.status.borrow().clone()
    }
}

/// Everything a session actor needs from the daemon.
#[derive(Clone)]
pub(crate) struct Shared {
    pub store: Store,
    pub pool: AgentPool,
    pub settings: Arc<SessionSettings>,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    pub hub: mpsc::Sender<HubCommand>,
    /// The editor's tunnelled MCP servers: who carries each session's, and the agent's URLs.
    pub mcp: crate::mcp_tunnel::McpTunnels,
    /// Prompt turns running across all sessions. Each actor adds and removes its own; the
    /// drain reads it to know when running turns are done. A counter, not shared state.
    pub turns: Arc<std::sync::atomic::AtomicUsize>,
    /// Several replicas: the leases this one holds (`None`: a single daemon, no leases).
    pub cluster: Option<crate::cluster::Cluster>,
}

pub(crate) enum HubCommand {
    Open {
        id: String,
        principal: String,
        /// Only a session of this profile (`None`: of any).
        profile: Option<String>,
        reply: oneshot::Sender<Result<SessionHandle, AcpError>>,
    },
    /// The store's answer for a session being opened (in a cluster: after its lease).
    Loaded {
        id: String,
        row: Box<Result<Option<SessionRow>, StoreError>>,
        lease: hub::Leased,
    },
    Spawn {
        row: Box<SessionRow>,
        agent: Option<(AgentHandle, String)>,
        /// The lease epoch of a session just created here (several replicas).
        epoch: Option<i64>,
        reply: oneshot::Sender<SessionHandle>,
    },
    /// Cancel the running turn of every live session (the end of a drain).
    CancelAll,
    /// The status of those of `ids` that are live.
    Status {
        ids: Vec<String>,
        reply: oneshot::Sender<HashMap<String, LiveStatus>>,
    },
    /// A principal's token was revoked: cancel its running turns; `stop_agents` also stops
    /// its agent processes (no valid token of it is connected any more).
    Revoked {
        principal: String,
        stop_agents: bool,
    },
    /// A grant on a session was revoked: its live actor cuts the grantee's clients off.
    GrantRevoked {
        session: String,
        principal: String,
    },
    /// Whether a principal may start one more live session; yes reserves the place (given
    /// back by `Spawn` or `Release`).
    Admit {
        principal: String,
        reply: oneshot::Sender<bool>,
    },
    /// A reserved place that will not be used (`hub::Reservation` dropped).
    Release {
        principal: String,
    },
    Ended {
        id: Arc<str>,
        serial: u64,
    },
}

/// The registry of live sessions. Cheap to clone.
#[derive(Clone)]
pub struct SessionHub {
    shared: Shared,
}

impl SessionHub {
    pub fn spawn(
        store: Store,
        pool: AgentPool,
        settings: SessionSettings,
        mcp: crate::mcp_tunnel::McpTunnels,
        cluster: Option<crate::cluster::Cluster>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> SessionHub {
        let (tx, rx) = mpsc::channel(256);
        let shared = Shared {
            store,
            pool,
            settings: Arc::new(settings),
            tasks: tasks.clone(),
            shutdown,
            hub: tx,
            mcp,
            turns: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            cluster,
        };
        let task = hub::HubTask {
            shared: shared.clone(),
            live: HashMap::new(),
            opening: HashMap::new(),
            reserved: HashMap::new(),
            serial: 0,
        };
        tasks.spawn(task.run(rx));
        SessionHub { shared }
    }

    pub fn pool(&self) -> &AgentPool {
        &self.shared.pool
    }

    /// Prompt turns running right now, across all sessions.
    pub fn running_turns(&self) -> usize {
        self.shared.turns.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Asks every live session to cancel its running turn (`stopReason: cancelled`).
    pub async fn cancel_all(&self) {
        let _ = self.shared.hub.send(HubCommand::CancelAll).await;
    }

    /// A token of `principal` was revoked: its running turns are cancelled and, when
    /// `stop_agents`, its agent processes stopped.
    pub async fn revoked(&self, principal: &str, stop_agents: bool) {
        let principal = principal.to_owned();
        let cmd = HubCommand::Revoked {
            principal,
            stop_agents,
        };
        let _ = self.shared.hub.send(cmd).await;
    }

    /// The live actor of a session that `principal` owns on `profile` (`None`: on any),
    /// started from the store if needed. Another principal's or profile's session is reported
    /// exactly like a missing one.
    pub async fn open(
        &self,
        id: &str,
        principal: &str,
        profile: Option<&str>,
    ) -> Result<SessionHandle, AcpError> {
        let (reply, rx) = oneshot::channel();
        let cmd = HubCommand::Open {
            id: id.to_owned(),
            principal: principal.to_owned(),
            profile: profile.map(str::to_owned),
            reply,
        };
        self.shared
            .hub
            .send(cmd)
            .await
            .map_err(|_| AcpError::SessionGone)?;
        rx.await.map_err(|_| AcpError::SessionGone)?
    }

    /// `session/new`: creates the agent-side session, records it, starts its actor and
    /// attaches `client`, which answers `responder`.
    pub async fn create(
        &self,
        principal: &str,
        profile: &str,
        client: Client,
        params: Value,
        responder: Responder,
    ) -> Result<SessionHandle, (AcpError, Responder)> {
        let (reply, rx) = oneshot::channel();
        let admit = HubCommand::Admit {
            principal: principal.to_owned(),
            reply,
        };
        if self.shared.hub.send(admit).await.is_err() || !rx.await.unwrap_or(false) {
            return Err((AcpError::TooManySessions, responder));
        }
        // Held until the session is started; every early return below gives it back.
        let reservation = hub::Reservation::new(&self.shared, principal);
        let key = AgentKey {
            principal: principal.to_owned(),
            profile: profile.to_owned(),
        };
        let agent = match self.shared.pool.get(key, client.init.clone()).await {
            Ok(a) => a,
            Err(e) => return Err((e.into(), responder)),
        };
        let Some(cwd) = params.get("cwd").and_then(Value::as_str).map(str::to_owned) else {
            return Err((AcpError::InvalidParams("cwd is required".into()), responder));
        };
        // Stdio MCP servers the policy does not allow never reach a hosted agent.
        let policy = &self.shared.settings.mcp_policy;
        let (params, mcp_refused) = match mcp::for_agent(profile, &params, policy, "(new)") {
            Ok(p) => p,
            Err(why) => return Err((AcpError::InvalidParams(why), responder)),
        };
        // The id comes first: the tunnelled servers' routes are the session's. What is stored
        // is their `acpd-mcp:` form; only the agent gets loopback URLs.
        let id = new_session_id();
        let servers = params
            .get("mcpServers")
            .cloned()
            .unwrap_or_else(|| json!([]));
        if client.carries_mcp() {
            self.shared.mcp.carry(&id, &client.peer, &servers);
        }
        let mut to_agent = params.clone();
        to_agent["mcpServers"] = self.shared.mcp.for_agent(&id, &servers).await;
        let mut result = match agent.request("session/new", to_agent).await {
            Ok(r) => r,
            Err(e) => {
                self.shared.mcp.end(&id);
                return Err((e.into(), responder));
            }
        };
        if !mcp_refused.is_empty() {
            if !result["_meta"].is_object() {
                result["_meta"] = json!({});
            }
            if !result["_meta"]["acpd"].is_object() {
                result["_meta"]["acpd"] = json!({});
            }
            result["_meta"]["acpd"]["mcpServersRefused"] = json!(mcp_refused);
        }
        let Some(agent_sid) = result
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return Err((
                AcpError::Internal("the agent's session/new answer has no sessionId".into()),
                responder,
            ));
        };
        let now = now_ms();
        let row = SessionRow {
            id: id.clone(),
            principal_id: principal.to_owned(),
            agent: profile.to_owned(),
            agent_session_id: Some(agent_sid.clone()),
            cwd,
            additional_dirs: params
                .get("additionalDirectories")
                .cloned()
                .unwrap_or_else(|| json!([]))
                .to_string(),
            title: None,
            mode_id: result
                .pointer("/modes/currentModeId")
                .and_then(Value::as_str)
                .map(str::to_owned),
            config_values: "{}".into(),
            meta: json!({
                "modes": result.get("modes"),
                "configOptions": result.get("configOptions"),
                "mcpServers": servers,
            })
            .to_string(),
            created_at_ms: now,
            updated_at_ms: now,
            closed: false,
            last_seq: 0,
            owner_instance: None,
            lease_until_ms: None,
        };
        if let Err(e) = self.shared.store.insert_session(&row).await {
            return Err((e.into(), responder));
        }
        let epoch = match hub::lease_new(&self.shared, &row.id).await {
            Ok(epoch) => epoch,
            Err(e) => return Err((e, responder)),
        };
        result["sessionId"] = Value::String(id);
        let (reply, rx) = oneshot::channel();
        let _ = self
            .shared
            .hub
            .send(HubCommand::Spawn {
                row: Box::new(row),
                agent: Some((agent, agent_sid)),
                epoch,
                reply,
            })
            .await;
        // Once `Spawn` is queued the hub gives the place back itself (nothing awaits between).
        reservation.use_up();
        let Ok(handle) = rx.await else {
            return Err((AcpError::SessionGone, responder));
        };
        let cmd = SessionCommand::Attach {
            client,
            mode: AttachMode::New { result },
            responder: Some(responder),
        };
        match handle.send(cmd).await {
            Ok(()) => Ok(handle),
            Err(SessionCommand::Attach {
                responder: Some(r), ..
            }) => Err((AcpError::SessionGone, r)),
            Err(_) => unreachable!("the command given back is the one sent"),
        }
    }
}

/// A new acpd session id (`session/new`, `session/fork`).
fn new_session_id() -> String {
    format!("s-{}", uuid::Uuid::new_v4().simple())
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

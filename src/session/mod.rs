//! Sessions: the `SessionHub` owns the map of live sessions, one actor task each
//! (`actor::Session`). A session outlives the sockets attached to it. The session layer is
//! what holds the whole `acpd_store::Store` and the only one that writes sessions and
//! journals; the web console, the connection registry and the lease keeper hold narrow
//! handles (`WebStore`, `RegistryStore`, `ClusterStore`), token auth and the admin commands
//! the `Store` (`tests/it/tidy.rs`, `only_the_session_layer_holds_the_whole_store`).

mod actor;
pub(crate) use actor::agent_forks;
pub mod capabilities;
mod claim;
pub mod compaction;
mod create;
mod hub;
pub mod journal_form;
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

use crate::agent::{AgentHandle, AgentPool};
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

    /// Whether someone waits for this command's answer.
    pub fn expects_answer(&self) -> bool {
        matches!(
            self,
            SessionCommand::Attach {
                responder: Some(_),
                ..
            } | SessionCommand::Prompt { .. }
                | SessionCommand::Relay { .. }
                | SessionCommand::Fork { .. }
                | SessionCommand::Close { .. }
                | SessionCommand::Delete { .. }
        )
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
    /// Boxed: a channel allocates its first block of 32 slots up front, and a live session
    /// holds that block of its command channel for its whole life.
    tx: mpsc::Sender<Box<SessionCommand>>,
    /// Published by the actor when a turn starts or ends and when a client comes or goes.
    status: tokio::sync::watch::Receiver<LiveStatus>,
}

impl SessionHandle {
    /// Queues a command; `Err` gives it back when the actor has ended.
    pub async fn send(&self, cmd: SessionCommand) -> Result<(), SessionCommand> {
        self.tx.send(Box::new(cmd)).await.map_err(|e| *e.0)
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
    /// Numbers the actors started, so the hub tells an ended actor from a newer one of the
    /// same session. A counter, not shared state.
    pub serials: Arc<std::sync::atomic::AtomicU64>,
    /// What principals spent this month, for budgets (`budget::Ledger`).
    pub ledger: crate::budget::Ledger,
}

impl Shared {
    pub(crate) fn next_serial(&self) -> u64 {
        self.serials
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }
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
    /// `session/new` started this session's actor: live from now on (its reserved place is
    /// given back).
    Started { handle: SessionHandle, serial: u64 },
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
    GrantRevoked { session: String, principal: String },
    /// Whether a principal may start one more live session; yes reserves the place (given
    /// back by `Spawn` or `Release`).
    Admit {
        principal: String,
        reply: oneshot::Sender<bool>,
    },
    /// A reserved place that will not be used (`hub::Reservation` dropped).
    Release { principal: String },
    /// A session's actor ended. `handed_back`: commands that reached it after it decided to
    /// end (not after a delete); the hub opens the session again for them, as the owner.
    Ended {
        id: Arc<str>,
        serial: u64,
        owner: Arc<str>,
        handed_back: Vec<SessionCommand>,
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
            serials: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            ledger: crate::budget::Ledger::default(),
        };
        let task = hub::HubTask {
            shared: shared.clone(),
            live: hub::Live::default(),
            opening: HashMap::new(),
            reserved: HashMap::new(),
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
    /// attaches `client`, which answers `responder` (`create.rs`).
    pub async fn create(
        &self,
        principal: &str,
        profile: &str,
        client: Client,
        params: Value,
        responder: Responder,
    ) -> Result<SessionHandle, (AcpError, Responder)> {
        create::create(&self.shared, principal, profile, client, params, responder).await
    }
}

/// A new acpd session id (`session/new`, `session/fork`).
fn new_session_id() -> String {
    format!("s-{}", uuid::Uuid::new_v4().simple())
}

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

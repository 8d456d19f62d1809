//! Agent backends behind sessions. `AgentPool` owns one agent process per (principal,
//! profile), started on first use and restarted on the next use after it died.
//! Each process is an ACP peer; `AgentHandle` is how sessions talk to it.

pub mod hosted;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{AgentProfile, BUILTIN_AGENT, Config};
use acpd_wire::{IncomingRequest, PeerError, PeerHandle, ResponseError};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("no agent profile named {0:?}")]
    UnknownProfile(String),
    #[error("cannot start agent {profile:?}: {source}")]
    Spawn {
        profile: String,
        source: std::io::Error,
    },
    #[error("agent {profile:?} failed to initialize: {message}")]
    Initialize { profile: String, message: String },
    #[error("acpd is shutting down")]
    ShuttingDown,
}

/// What the agent process sends about one of its sessions.
#[derive(Debug)]
pub enum AgentEvent {
    Notification {
        method: String,
        params: Value,
    },
    Request(IncomingRequest),
    /// The answer to a request sent with `AgentHandle::request_in_band`.
    Response {
        tag: u64,
        result: Result<Value, ResponseError>,
    },
    /// The process is gone; `status` says how it ended.
    Exited {
        status: String,
    },
}

/// Which process: agents are per principal so tokens never share an agent's memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentKey {
    pub principal: String,
    pub profile: String,
}

/// A live agent process. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    pub peer: PeerHandle,
    /// The agent's `initialize` result, unaltered.
    pub init: Arc<Value>,
    router: mpsc::UnboundedSender<hosted::RouterCommand>,
    /// Fires when the process has exited.
    pub exited: CancellationToken,
}

impl AgentHandle {
    /// Routes in-band answers for `session_id` (acpd's id) to `events`, and the agent's
    /// messages about `agent_session_id`, including any that came before it was known.
    pub fn register(
        &self,
        session_id: &str,
        agent_session_id: Option<&str>,
        events: mpsc::Sender<AgentEvent>,
    ) {
        let _ = self.router.send(hosted::RouterCommand::Register {
            route: session_id.to_owned(),
            agent_session_id: agent_session_id.map(str::to_owned),
            events,
        });
    }

    pub fn unregister(&self, session_id: &str) {
        let _ = self.router.send(hosted::RouterCommand::Unregister {
            route: session_id.to_owned(),
        });
    }

    /// Sends a request whose answer arrives as `AgentEvent::Response { tag }` on the session's
    /// event stream, after every update the agent sent before it.
    pub async fn request_in_band(
        &self,
        method: &str,
        params: Value,
        session_id: &str,
        tag: u64,
    ) -> Result<u64, PeerError> {
        let _ = self.router.send(hosted::RouterCommand::Active {
            route: session_id.to_owned(),
        });
        self.peer
            .request_in_band(method, Some(params), session_id, tag)
            .await
    }

    pub async fn request(&self, method: &str, params: Value) -> Result<Value, PeerError> {
        self.peer.request(method, Some(params)).await
    }

    fn capability(&self, path: &[&str]) -> bool {
        let mut v = self.init.get("agentCapabilities");
        for p in path {
            v = v.and_then(|x| x.get(*p));
        }
        match v {
            Some(Value::Bool(b)) => *b,
            Some(Value::Null) | None => false,
            Some(_) => true,
        }
    }

    pub fn supports_load(&self) -> bool {
        self.capability(&["loadSession"])
    }
    pub fn supports_resume(&self) -> bool {
        self.capability(&["sessionCapabilities", "resume"])
    }
    pub fn supports_close(&self) -> bool {
        self.capability(&["sessionCapabilities", "close"])
    }
    pub fn supports_delete(&self) -> bool {
        self.capability(&["sessionCapabilities", "delete"])
    }
}

enum PoolCommand {
    Get {
        key: AgentKey,
        client_init: Arc<Value>,
        reply: oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>,
    },
    Started {
        key: AgentKey,
        result: Result<AgentHandle, Arc<AgentError>>,
    },
    /// Stop every agent process of a principal (its last valid token was revoked).
    StopPrincipal { principal: String },
}

/// Hands out agent processes. Cheap to clone.
#[derive(Clone)]
pub struct AgentPool {
    tx: mpsc::Sender<PoolCommand>,
}

impl AgentPool {
    pub fn spawn(
        config: Arc<Config>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> AgentPool {
        let (tx, rx) = mpsc::channel(64);
        let pool = PoolTask {
            config,
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
            self_tx: tx.clone(),
            slots: HashMap::new(),
            stops: HashMap::new(),
            generation: 0,
        };
        tasks.spawn(pool.run(rx));
        AgentPool { tx }
    }

    /// The live process for `key`, started (and initialized with `client_init`, the first
    /// client's `initialize` params) if there is none.
    pub async fn get(
        &self,
        key: AgentKey,
        client_init: Arc<Value>,
    ) -> Result<AgentHandle, Arc<AgentError>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(PoolCommand::Get {
                key,
                client_init,
                reply,
            })
            .await
            .map_err(|_| Arc::new(AgentError::ShuttingDown))?;
        rx.await.map_err(|_| Arc::new(AgentError::ShuttingDown))?
    }

    /// Stops the agent processes of `principal`; the next use starts new ones.
    pub async fn stop_principal(&self, principal: &str) {
        let principal = principal.to_owned();
        let _ = self.tx.send(PoolCommand::StopPrincipal { principal }).await;
    }
}

enum Slot {
    Starting(Vec<oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>>),
    Ready(AgentHandle),
}

struct PoolTask {
    config: Arc<Config>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    self_tx: mpsc::Sender<PoolCommand>,
    slots: HashMap<AgentKey, Slot>,
    /// Each process's own stop (a child of `shutdown`), for `StopPrincipal`.
    stops: HashMap<AgentKey, CancellationToken>,
    generation: u64,
}

impl PoolTask {
    async fn run(mut self, mut rx: mpsc::Receiver<PoolCommand>) {
        loop {
            let cmd = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                cmd = rx.recv() => match cmd { Some(c) => c, None => break },
            };
            match cmd {
                PoolCommand::Get {
                    key,
                    client_init,
                    reply,
                } => self.get(key, client_init, reply),
                PoolCommand::Started { key, result } => {
                    let waiters = match self.slots.remove(&key) {
                        Some(Slot::Starting(w)) => w,
                        _ => vec![],
                    };
                    if let Ok(h) = &result {
                        self.slots.insert(key, Slot::Ready(h.clone()));
                    }
                    for w in waiters {
                        let _ = w.send(result.clone());
                    }
                }
                PoolCommand::StopPrincipal { principal } => {
                    self.slots.retain(|k, _| k.principal != principal);
                    self.stops.retain(|k, stop| {
                        let keep = k.principal != principal;
                        if !keep {
                            tracing::info!(target: "acpd::audit", %principal, profile = %k.profile, "agent process stopped: its principal's token was revoked");
                            stop.cancel();
                        }
                        keep
                    });
                }
            }
        }
    }

    fn get(
        &mut self,
        key: AgentKey,
        client_init: Arc<Value>,
        reply: oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>,
    ) {
        match self.slots.get_mut(&key) {
            Some(Slot::Ready(h)) if !h.exited.is_cancelled() => {
                let _ = reply.send(Ok(h.clone()));
                return;
            }
            Some(Slot::Starting(waiters)) => {
                waiters.push(reply);
                return;
            }
            _ => {}
        }
        let profile = if key.profile == BUILTIN_AGENT {
            None
        } else {
            match self.config.agents.get(&key.profile) {
                Some(p) => Some(p.clone()),
                None => {
                    let _ = reply.send(Err(Arc::new(AgentError::UnknownProfile(
                        key.profile.clone(),
                    ))));
                    return;
                }
            }
        };
        self.generation += 1;
        self.slots.insert(key.clone(), Slot::Starting(vec![reply]));
        let stop = self.shutdown.child_token();
        self.stops.insert(key.clone(), stop.clone());
        let start = start(
            profile,
            self.config.clone(),
            client_init,
            self.generation,
            self.tasks.clone(),
            stop,
        );
        let tx = self.self_tx.clone();
        self.tasks.spawn(async move {
            let result = start.await.map_err(Arc::new);
            let _ = tx.send(PoolCommand::Started { key, result }).await;
        });
    }
}

async fn start(
    profile: Option<AgentProfile>,
    config: Arc<Config>,
    client_init: Arc<Value>,
    generation: u64,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    match profile {
        Some(profile) => hosted::start(&profile, &client_init, generation, &tasks, shutdown).await,
        None => start_builtin(&config, &client_init, &tasks, shutdown).await,
    }
}

/// The built-in agent: a task on an in-memory link, hosted like any agent process.
async fn start_builtin(
    config: &Config,
    client_init: &Value,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    let builtin_config = acpd_builtin::BuiltinConfig::parse(&config.builtin, &config.data_dir)
        .map_err(|e| AgentError::Initialize {
            profile: BUILTIN_AGENT.to_owned(),
            message: e.to_string(),
        })?;
    let (acpd_side, agent_side, carry) = acpd_wire::memory_pair();
    tasks.spawn(carry);
    let cancel = CancellationToken::new();
    let join = tasks.spawn(acpd_builtin::run(
        agent_side,
        Arc::new(builtin_config),
        cancel.clone(),
    ));
    let io_cancel = CancellationToken::new();
    hosted::connect(
        BUILTIN_AGENT,
        acpd_side,
        hosted::Process::Task { join, cancel },
        io_cancel,
        client_init,
        tasks,
        shutdown,
    )
    .await
}

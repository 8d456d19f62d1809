//! Agent backends behind sessions. `AgentPool` owns one agent process per (principal,
//! profile), started on first use and restarted on the next use after it died — unless it
//! is crash-looping (`backoff`). Each process is an ACP peer; `AgentHandle` is how sessions
//! talk to it. `home` gives a profile its own HOME. `supervisor` is the per-agent process that owns an agent's whole tree;
//! `login` is `acpd agent login NAME`.

pub mod backoff;
pub mod home;
pub mod hosted;
pub mod login;
pub mod supervisor;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

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
    /// Crash-loop backoff: no start before `next_start`.
    #[error("agent {profile:?} failed {failures} times in a row; next start at {next_start}")]
    BackingOff {
        profile: String,
        failures: u32,
        /// RFC 3339, UTC.
        next_start: String,
        retry_in: Duration,
    },
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
    /// The profile's name.
    profile: Arc<str>,
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
        match self.peer.request(method, Some(params)).await {
            Err(PeerError::Remote(e)) => Err(PeerError::Remote(login::auth_hint(e, &self.profile))),
            other => other,
        }
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
        generation: u64,
        result: Result<AgentHandle, Arc<AgentError>>,
    },
    /// The process of `key` started as `generation` has exited.
    Exited { key: AgentKey, generation: u64 },
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
            generation: 0,
            backoff: HashMap::new(),
            policy: backoff::Policy::default(),
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
}

enum Slot {
    Starting(Vec<oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>>),
    Ready(AgentHandle, u64),
}

struct PoolTask {
    config: Arc<Config>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    self_tx: mpsc::Sender<PoolCommand>,
    slots: HashMap<AgentKey, Slot>,
    generation: u64,
    backoff: HashMap<AgentKey, backoff::Backoff>,
    policy: backoff::Policy,
}

/// Where supervisors keep the records of their trees.
pub fn records_dir(config: &Config) -> PathBuf {
    config.data_dir.join("agent-trees")
}

impl PoolTask {
    async fn run(mut self, mut rx: mpsc::Receiver<PoolCommand>) {
        // What an earlier acpd on this data directory left running goes first.
        let records = records_dir(&self.config);
        let reaped = tokio::task::spawn_blocking(move || {
            supervisor::record::reap_stale(&records, hosted::KILL_GRACE)
        })
        .await
        .unwrap_or(0);
        if reaped > 0 {
            tracing::warn!(
                processes = reaped,
                "killed agent processes an earlier acpd left running"
            );
        }
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
                PoolCommand::Started {
                    key,
                    generation,
                    result,
                } => self.started(key, generation, result),
                PoolCommand::Exited { key, generation } => {
                    if matches!(self.slots.get(&key), Some(Slot::Ready(_, g)) if *g == generation) {
                        self.exited(&key);
                    }
                }
            }
        }
    }

    /// The ready process of `key` is gone: its slot goes, and the backoff hears of it.
    fn exited(&mut self, key: &AgentKey) {
        self.slots.remove(key);
        let now = Instant::now();
        let until = self
            .backoff
            .entry(key.clone())
            .or_default()
            .exited(&self.policy, now);
        if until > now {
            metrics::counter!(crate::metrics::AGENT_CRASH_LOOPS_TOTAL).increment(1);
            tracing::warn!(agent = %key.profile, retry_in_ms = (until - now).as_millis() as u64, "agent exited soon after its start; backing off");
        }
    }

    fn started(
        &mut self,
        key: AgentKey,
        generation: u64,
        result: Result<AgentHandle, Arc<AgentError>>,
    ) {
        let waiters = match self.slots.remove(&key) {
            Some(Slot::Starting(w)) => w,
            _ => vec![],
        };
        let now = Instant::now();
        match &result {
            Ok(h) => {
                self.backoff.entry(key.clone()).or_default().started(now);
                self.slots
                    .insert(key.clone(), Slot::Ready(h.clone(), generation));
                let (exited, tx) = (h.exited.clone(), self.self_tx.clone());
                let key = key.clone();
                self.tasks.spawn(async move {
                    exited.cancelled().await;
                    let _ = tx.send(PoolCommand::Exited { key, generation }).await;
                });
            }
            Err(e) => {
                metrics::counter!(crate::metrics::AGENT_START_FAILURES_TOTAL).increment(1);
                let until = self
                    .backoff
                    .entry(key.clone())
                    .or_default()
                    .start_failed(&self.policy, now);
                if until > now {
                    metrics::counter!(crate::metrics::AGENT_CRASH_LOOPS_TOTAL).increment(1);
                }
                tracing::warn!(agent = %key.profile, error = %e, retry_in_ms = (until - now).as_millis() as u64, "agent failed to start");
            }
        }
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }

    fn get(
        &mut self,
        key: AgentKey,
        client_init: Arc<Value>,
        reply: oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>,
    ) {
        match self.slots.get_mut(&key) {
            Some(Slot::Ready(h, _)) if !h.exited.is_cancelled() => {
                let _ = reply.send(Ok(h.clone()));
                return;
            }
            Some(Slot::Starting(waiters)) => {
                waiters.push(reply);
                return;
            }
            Some(Slot::Ready(..)) => self.exited(&key),
            None => {}
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
        let now = Instant::now();
        if let Some(backoff::Decision::Wait { until, failures }) =
            self.backoff.get(&key).map(|b| b.decide(now))
        {
            metrics::counter!(crate::metrics::AGENT_BACKOFF_REFUSALS_TOTAL).increment(1);
            let retry_in = until - now;
            let at = SystemTime::now() + retry_in;
            let _ = reply.send(Err(Arc::new(AgentError::BackingOff {
                profile: key.profile.clone(),
                failures,
                next_start: rfc3339(at),
                retry_in,
            })));
            return;
        }
        self.generation += 1;
        self.slots.insert(key.clone(), Slot::Starting(vec![reply]));
        let start = start(
            profile,
            self.config.clone(),
            client_init,
            self.generation,
            self.tasks.clone(),
            self.shutdown.clone(),
        );
        let tx = self.self_tx.clone();
        let generation = self.generation;
        self.tasks.spawn(async move {
            let result = start.await.map_err(Arc::new);
            let _ = tx
                .send(PoolCommand::Started {
                    key,
                    generation,
                    result,
                })
                .await;
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
        Some(profile) => {
            let records = records_dir(&config);
            hosted::start(
                &profile,
                &client_init,
                generation,
                &records,
                &tasks,
                shutdown,
            )
            .await
        }
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

/// `2026-12-01T14:00:03Z`: to the second, UTC.
fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

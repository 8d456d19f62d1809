//! The agent pool's actor: one slot per (principal, profile) — starting, or ready — the
//! crash-loop backoff of each (`backoff`), and idle stops.
//!
//! A ready slot holds its agent strongly while it is being asked for; after
//! `agent_idle_stop` without a request it holds it weakly, so the agent stops ("no longer
//! used", its whole tree with it) once the last session holding it ends, and is started
//! again by the next request.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{AgentError, AgentHandle, AgentKey, WeakAgentHandle, backoff, hosted, supervisor};
use crate::config::{AgentProfile, BUILTIN_AGENT, Config};

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
    /// Stop every agent process of a principal (its last valid token was revoked).
    StopPrincipal { principal: String },
    /// The live agent of `key` was used without `Get` (a connection's remembered handle).
    Touch { key: AgentKey },
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
            backoff: HashMap::new(),
            policy: backoff::Policy::default(),
        };
        tasks.spawn(pool.run(rx));
        AgentPool { tx }
    }

    /// Stops the agent processes of `principal`; the next use starts new ones.
    pub async fn stop_principal(&self, principal: &str) {
        let principal = principal.to_owned();
        let _ = self.tx.send(PoolCommand::StopPrincipal { principal }).await;
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

    /// Counts as asking for the live agent of `key` (it is held strongly again, and its
    /// idle time starts over) without waiting for the pool. A full queue skips it: touches
    /// are repeated.
    pub fn touch(&self, key: AgentKey) {
        let _ = self.tx.try_send(PoolCommand::Touch { key });
    }
}

enum Slot {
    Starting(Vec<oneshot::Sender<Result<AgentHandle, Arc<AgentError>>>>),
    Ready(Held, u64),
}

/// How a ready slot holds its agent.
enum Held {
    /// Keeps it running; last asked for at the instant.
    Strong(AgentHandle, Instant),
    /// Idle: running only while sessions hold it.
    Weak(WeakAgentHandle),
}

impl Held {
    /// The live agent, if there still is one.
    fn live(&self) -> Option<AgentHandle> {
        let h = match self {
            Held::Strong(h, _) => h.clone(),
            Held::Weak(w) => w.upgrade()?,
        };
        h.is_live().then_some(h)
    }
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
    backoff: HashMap<AgentKey, backoff::Backoff>,
    policy: backoff::Policy,
}

/// Where supervisors keep the records of their trees.
fn records_dir(config: &Config) -> PathBuf {
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
        let idle_stop = self.config.agent_idle_stop;
        let mut tick =
            tokio::time::interval(idle_stop.map_or(std::time::Duration::from_secs(3600), |d| {
                (d / 4).max(std::time::Duration::from_millis(250))
            }));
        loop {
            let cmd = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                _ = tick.tick(), if idle_stop.is_some() => {
                    self.let_idle_go(Instant::now());
                    continue;
                }
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
                PoolCommand::StopPrincipal { principal } => self.stop_principal(&principal),
                PoolCommand::Touch { key } => {
                    if let Some(Slot::Ready(held, _)) = self.slots.get_mut(&key)
                        && let Some(h) = held.live()
                    {
                        *held = Held::Strong(h, Instant::now());
                    }
                }
            }
        }
    }

    /// The principal's last valid token was revoked: its processes stop (their exit is a
    /// stop, not a failure: the slots go first), and the next use starts new ones.
    fn stop_principal(&mut self, principal: &str) {
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

    /// Agents not asked for within `agent_idle_stop` are held weakly from now on.
    fn let_idle_go(&mut self, now: Instant) {
        let Some(idle) = self.config.agent_idle_stop else {
            return;
        };
        for (key, slot) in &mut self.slots {
            if let Slot::Ready(held @ Held::Strong(..), _) = slot
                && let Held::Strong(h, last) = &*held
                && now.saturating_duration_since(*last) >= idle
            {
                tracing::info!(agent = %key.profile, "agent idle: it stops when its last session ends");
                *held = Held::Weak(h.downgrade());
            }
        }
    }

    /// The ready process of `key` is gone: its slot goes, and the backoff hears of it (an
    /// idle agent's end is a stop, not a failure).
    fn exited(&mut self, key: &AgentKey) {
        let idle = matches!(self.slots.remove(key), Some(Slot::Ready(Held::Weak(_), _)));
        self.stops.remove(key);
        let now = Instant::now();
        if idle {
            self.backoff.entry(key.clone()).or_default().stopped();
            return;
        }
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
                self.slots.insert(
                    key.clone(),
                    Slot::Ready(Held::Strong(h.clone(), now), generation),
                );
                let (exited, tx) = (h.exited.clone(), self.self_tx.clone());
                let key = key.clone();
                self.tasks.spawn(async move {
                    exited.cancelled().await;
                    let _ = tx.send(PoolCommand::Exited { key, generation }).await;
                });
            }
            Err(e) => {
                self.stops.remove(&key);
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
            Some(Slot::Ready(held, _)) if let Some(h) = held.live() => {
                *held = Held::Strong(h.clone(), Instant::now());
                let _ = reply.send(Ok(h));
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

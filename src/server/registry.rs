//! Live client connections: enforces the connection limits and cuts off the connections of
//! a token that was revoked (`acpd token revoke` runs in another process, so the registry
//! checks the store every few seconds for the tokens it has in use).
//!
//! The registry task never waits on the store: each check is a task of its own that reports
//! the revoked token ids back as a message (like `AgentPool`'s `Started`), at most one at a time.
//! It holds a `RegistryStore`, which reads tokens and revoked grants and nothing else.
//!
//! A revocation closes every connection of the token (plain WebSocket and resumable links
//! with 1008, TCP), cancels its principal's running turns, and, when no connection of that
//! principal with a valid token is left, stops its agent processes (`SessionHub::revoked`).
//!
//! Session grants (`acpd share --revoke`, also another process) are polled the same way, more
//! often (`GRANT_CHECK`): a grant revoked since the last look is handed to the hub, whose live
//! session cuts the grantee's clients off (`SessionHub::grant_revoked`).
//!
//! Replicas on Postgres also hear of revocations at once (`Store::revocation_signals`,
//! `LISTEN`): a signal starts both checks now, on top of the polls.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::session::SessionHub;
use acpd_store::RegistryStore;

/// How often the tokens in use are checked for revocation.
const REVOCATION_CHECK: Duration = Duration::from_secs(2);
/// How often revoked session grants are looked for: a revoked grantee is cut off within a
/// second (one indexed query on a small table while any client is connected).
const GRANT_CHECK: Duration = Duration::from_millis(250);

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many connections")]
    Total,
    #[error("too many connections for this user")]
    PerPrincipal,
}

enum Command {
    Open {
        conn_id: String,
        principal: String,
        token_id: Option<String>,
        kick: CancellationToken,
        reply: oneshot::Sender<Result<(), Refused>>,
    },
    Closed {
        conn_id: String,
    },
    /// A revocation check finished: the revoked token ids, or `None` if the store failed.
    Checked {
        revoked: Option<HashSet<String>>,
    },
    /// A grant check finished: `(session, principal)` of the grants revoked since the last
    /// one and the newest revocation time seen, or `None` if the store failed.
    GrantsChecked {
        revoked: Option<(Vec<(String, String)>, i64)>,
    },
}

struct Entry {
    principal: String,
    token_id: Option<String>,
    kick: CancellationToken,
}

/// Handle to the registry task. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    tx: mpsc::Sender<Command>,
    tasks: TaskTracker,
}

/// Keeps a connection registered; unregisters it when dropped.
pub struct Registration {
    conn_id: String,
    tx: mpsc::Sender<Command>,
    tasks: TaskTracker,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let cmd = Command::Closed {
            conn_id: std::mem::take(&mut self.conn_id),
        };
        // Drop cannot await: a full queue is finished on a tracked task (the registry task
        // drains its queue quickly, and once it is gone the send fails at once).
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.tx.try_send(cmd) {
            let tx = self.tx.clone();
            self.tasks.spawn(async move {
                let _ = tx.send(cmd).await;
            });
        }
    }
}

impl Registry {
    /// Starts the registry task; it ends with `shutdown`.
    pub fn spawn(
        store: impl Into<RegistryStore>,
        hub: SessionHub,
        max_total: usize,
        max_per_principal: usize,
        signals: Option<mpsc::Receiver<()>>,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Registry {
        let (tx, rx) = mpsc::channel(256);
        let task = Task {
            store: store.into(),
            hub,
            max_total,
            max_per_principal,
            live: HashMap::new(),
            tasks: tasks.clone(),
            self_tx: tx.downgrade(),
            checking: false,
            grants_checking: false,
            again: false,
            grants_again: false,
            grants_seen: crate::session::now_ms(),
        };
        tasks.spawn(task.run(rx, signals, shutdown));
        Registry {
            tx,
            tasks: tasks.clone(),
        }
    }

    /// Registers a connection; `kick` is fired if its token is revoked.
    pub async fn open(
        &self,
        conn_id: &str,
        principal: &str,
        token_id: Option<String>,
        kick: CancellationToken,
    ) -> Result<Registration, Refused> {
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Open {
            conn_id: conn_id.to_owned(),
            principal: principal.to_owned(),
            token_id,
            kick,
            reply,
        };
        // A registry that is gone (shutting down) refuses nothing; the drain handles the rest.
        if self.tx.send(cmd).await.is_ok() {
            rx.await.unwrap_or(Ok(()))?;
        }
        Ok(Registration {
            conn_id: conn_id.to_owned(),
            tx: self.tx.clone(),
            tasks: self.tasks.clone(),
        })
    }
}

struct Task {
    store: RegistryStore,
    /// Told about revoked principals (turns cancelled, agents stopped).
    hub: SessionHub,
    max_total: usize,
    max_per_principal: usize,
    live: HashMap<String, Entry>,
    /// Where store checks run; they end with `shutdown` too.
    tasks: TaskTracker,
    /// For check results; weak, so the registry still ends when every handle is gone.
    self_tx: mpsc::WeakSender<Command>,
    /// A check is running; the next tick does not start another.
    checking: bool,
    /// The same for grant checks.
    grants_checking: bool,
    /// A signal came while a check ran (it may have read the rows before the revocation):
    /// another check follows it.
    again: bool,
    grants_again: bool,
    /// Grants revoked at or before this (epoch ms) were handled (or predate this daemon:
    /// opening a session reads the grant afresh, so nothing older is live).
    grants_seen: i64,
}

impl Task {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Command>,
        mut signals: Option<mpsc::Receiver<()>>,
        shutdown: CancellationToken,
    ) {
        let mut check = tokio::time::interval(REVOCATION_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut grants = tokio::time::interval(GRANT_CHECK);
        grants.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = rx.recv() => match cmd {
                    Some(Command::Open { conn_id, principal, token_id, kick, reply }) => {
                        let r = self.admit(&principal);
                        if r.is_ok() {
                            self.live.insert(conn_id, Entry { principal, token_id, kick });
                        }
                        let _ = reply.send(r);
                    }
                    Some(Command::Closed { conn_id }) => {
                        self.live.remove(&conn_id);
                    }
                    Some(Command::Checked { revoked }) => {
                        self.checking = false;
                        if let Some(revoked) = revoked {
                            self.cut_off(&revoked);
                        }
                        if std::mem::take(&mut self.again) {
                            self.start_check(&shutdown);
                        }
                    }
                    Some(Command::GrantsChecked { revoked }) => {
                        self.grants_checking = false;
                        if std::mem::take(&mut self.grants_again) {
                            self.start_grant_check(&shutdown);
                        }
                        if let Some((revoked, seen)) = revoked {
                            self.grants_seen = self.grants_seen.max(seen);
                            for (session, principal) in revoked {
                                let hub = self.hub.clone();
                                self.tasks.spawn(async move { hub.grant_revoked(&session, &principal).await });
                            }
                        }
                    }
                    None => break,
                },
                _ = check.tick() => self.start_check(&shutdown),
                _ = grants.tick() => self.start_grant_check(&shutdown),
                Some(()) = next_signal(&mut signals) => {
                    tracing::info!("revocation signalled by the store: checking now");
                    (self.again, self.grants_again) = (self.checking, self.grants_checking);
                    self.start_check(&shutdown);
                    self.start_grant_check(&shutdown);
                }
            }
            metrics::gauge!(crate::metrics::CONNECTIONS_REGISTERED).set(self.live.len() as f64);
        }
    }

    fn admit(&self, principal: &str) -> Result<(), Refused> {
        if self.max_total > 0 && self.live.len() >= self.max_total {
            return Err(Refused::Total);
        }
        let mine = self
            .live
            .values()
            .filter(|e| e.principal == principal)
            .count();
        if self.max_per_principal > 0 && mine >= self.max_per_principal {
            return Err(Refused::PerPrincipal);
        }
        Ok(())
    }

    /// Starts a revocation check on its own task, unless one is running or no live connection
    /// uses a token.
    fn start_check(&mut self, shutdown: &CancellationToken) {
        if self.checking || !self.live.values().any(|e| e.token_id.is_some()) {
            return;
        }
        let Some(tx) = self.self_tx.upgrade() else {
            return;
        };
        self.checking = true;
        let store = self.store.clone();
        let stop = shutdown.clone();
        self.tasks.spawn(async move {
            let revoked = tokio::select! {
                _ = stop.cancelled() => return,
                r = store.list_tokens() => match r {
                    Ok(tokens) => Some(tokens.into_iter().filter(|t| t.revoked).map(|t| t.id).collect()),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot check tokens for revocation");
                        None
                    }
                },
            };
            let _ = tx.send(Command::Checked { revoked }).await;
        });
    }

    /// Looks for grants revoked since the last look on its own task, unless one is running or
    /// nobody is connected.
    fn start_grant_check(&mut self, shutdown: &CancellationToken) {
        if self.grants_checking || self.live.is_empty() {
            return;
        }
        let Some(tx) = self.self_tx.upgrade() else {
            return;
        };
        self.grants_checking = true;
        let (store, stop, after) = (self.store.clone(), shutdown.clone(), self.grants_seen);
        self.tasks.spawn(async move {
            let revoked = tokio::select! {
                _ = stop.cancelled() => return,
                r = store.grants_revoked_after(after) => match r {
                    Ok(rows) => {
                        let seen = rows.iter().filter_map(|g| g.revoked_at_ms).max().unwrap_or(after);
                        Some((rows.into_iter().map(|g| (g.session_id, g.principal_id)).collect(), seen))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot check session grants for revocation");
                        None
                    }
                },
            };
            let _ = tx.send(Command::GrantsChecked { revoked }).await;
        });
    }

    /// Cuts off the live connections whose token is in `revoked`, then tells the hub about
    /// their principals.
    fn cut_off(&self, revoked: &HashSet<String>) {
        let mut principals = HashSet::new();
        for (conn_id, e) in &self.live {
            if let Some(t) = &e.token_id
                && revoked.contains(t)
                && !e.kick.is_cancelled()
            {
                tracing::warn!(target: "acpd::audit", token = %t, conn = %conn_id, "token revoked: connection cut off");
                e.kick.cancel();
                principals.insert(e.principal.clone());
            }
        }
        for principal in principals {
            let still_valid = self.live.values().any(|e| {
                e.principal == principal
                    && !e.kick.is_cancelled()
                    && e.token_id.as_ref().is_none_or(|t| !revoked.contains(t))
            });
            let hub = self.hub.clone();
            self.tasks
                .spawn(async move { hub.revoked(&principal, !still_valid).await });
        }
    }
}

/// The next revocation signal; never resolves without a listener.
async fn next_signal(signals: &mut Option<mpsc::Receiver<()>>) -> Option<()> {
    match signals {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

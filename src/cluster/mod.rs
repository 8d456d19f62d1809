//! Several replicas on one Postgres: this replica's identity and the session leases it holds.
//!
//! A live session is owned by one replica through its lease
//! (`acpd_store::ClusterStore::acquire_lease`: owner, epoch, expiry in the session row; the
//! `ClusterStore` handle is all of the store this module may use). The keeper task (`Keeper`) renews every lease this
//! replica holds in one statement every third of the TTL, and heartbeats the `replicas` row in
//! the same round; it never waits on the store itself: each round is a task whose answer comes
//! back as a message (like `AgentPool`'s starts), at most one at a time. A lease the round
//! finds lost (another replica took the session over after it expired) fires that lease's
//! `lost` token, which the session actor watches: it lets the session go. Whatever the keeper
//! does not notice in time, the store's fencing catches: an append under a stale epoch is
//! refused in its own transaction.
//!
//! Nothing here knows sessions: a lease is a session id, an epoch and a token.

mod leases;
pub mod link;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ClusterConfig;
use acpd_store::{Acquired, ClusterStore, StoreError, Watermark};
use leases::Leases;

/// A lease this replica holds on one session.
#[derive(Debug, Clone)]
pub struct Lease {
    pub epoch: i64,
    /// Fired when the keeper finds the lease taken over: the session lets go.
    pub lost: CancellationToken,
}

enum Command {
    Hold {
        id: Arc<str>,
        epoch: i64,
        lost: CancellationToken,
    },
    Release {
        id: Arc<str>,
        epoch: i64,
    },
    /// A renewal round finished: the sessions whose lease is gone, or `None` if the store
    /// failed (the leases stand until they expire; fencing covers the rest).
    Renewed {
        lost: Option<Vec<(String, i64)>>,
    },
}

/// This replica in the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub replica: Arc<str>,
    /// The secret the replicas share: the internal link's credential.
    pub secret: Arc<str>,
    /// How the internal link checks a `wss://` peer.
    pub tls: Arc<rustls::ClientConfig>,
    ttl_ms: i64,
    store: ClusterStore,
    tx: mpsc::Sender<Command>,
    tasks: TaskTracker,
}

impl Cluster {
    /// Registers the replica and starts the keeper; it ends with `shutdown` (the store's
    /// `close` gives the leases back).
    pub fn spawn(
        config: &ClusterConfig,
        store: impl Into<ClusterStore>,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Cluster {
        let store: ClusterStore = store.into();
        let (tx, rx) = mpsc::channel(256);
        let ttl_ms = i64::try_from(config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let keeper = Keeper {
            replica: Arc::from(config.replica_id.as_str()),
            advertise_url: config.advertise_url.clone(),
            ttl_ms,
            every: config.lease_ttl / 3,
            store: store.clone(),
            leases: Leases::default(),
            renewing: false,
            self_tx: tx.downgrade(),
            tasks: tasks.clone(),
        };
        tasks.spawn(keeper.run(rx, shutdown));
        tracing::info!(replica = %config.replica_id, advertise_url = ?config.advertise_url, ttl_ms, "replica of a cluster: sessions are leased");
        if let Some(url) = &config.advertise_url
            && crate::config::cluster_tls::clear_and_not_loopback(url)
        {
            tracing::warn!(advertise_url = %url, "the internal link to this replica is plain ws://: the cluster secret travels in clear; advertise a wss:// URL (TLS on this replica) unless the network is private");
        }
        Cluster {
            replica: Arc::from(config.replica_id.as_str()),
            secret: Arc::from(config.secret.as_str()),
            tls: config.tls.clone(),
            ttl_ms,
            store,
            tx,
            tasks: tasks.clone(),
        }
    }

    /// Tries to take a session's lease (free, expired, or this replica's already). Callers
    /// are tasks, never actors: this waits on the store.
    pub async fn acquire(&self, session_id: &str) -> Result<Acquired, StoreError> {
        self.store
            .acquire_lease(session_id, &self.replica, self.ttl_ms)
            .await
    }

    /// Starts renewing a lease just acquired; its `lost` token fires if it is taken over.
    pub fn hold(&self, id: Arc<str>, epoch: i64) -> Lease {
        let lost = CancellationToken::new();
        self.send(Command::Hold {
            id,
            epoch,
            lost: lost.clone(),
        });
        Lease { epoch, lost }
    }

    /// The session ended here: once everything it appended up to `upto` is settled, its
    /// lease is given back, so a peer takes it at once rather than after the TTL.
    pub fn release(
        &self,
        id: Arc<str>,
        epoch: i64,
        mut durable: watch::Receiver<Watermark>,
        upto: i64,
    ) {
        self.send(Command::Release {
            id: id.clone(),
            epoch,
        });
        let (store, replica) = (self.store.clone(), self.replica.clone());
        self.tasks.spawn(async move {
            // Bounded: a store gone for good must not keep the task (and shutdown) waiting.
            let settled = durable.wait_for(|d| d.settled(upto));
            let _ = tokio::time::timeout(Duration::from_secs(10), settled).await;
            if let Err(e) = store.release_lease(&id, &replica, epoch).await {
                tracing::warn!(session = %id, error = %e, "cannot give the session lease back; it expires by itself");
            }
        });
    }

    /// Queues a command without waiting (callers are actors); a full queue finishes on a
    /// tracked task.
    fn send(&self, cmd: Command) {
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.tx.try_send(cmd) {
            let tx = self.tx.clone();
            self.tasks.spawn(async move {
                let _ = tx.send(cmd).await;
            });
        }
    }
}

/// The keeper task: owns the leases this replica holds.
struct Keeper {
    replica: Arc<str>,
    advertise_url: Option<String>,
    ttl_ms: i64,
    every: Duration,
    store: ClusterStore,
    leases: Leases,
    /// A renewal round is under way.
    renewing: bool,
    self_tx: mpsc::WeakSender<Command>,
    tasks: TaskTracker,
}

impl Keeper {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.every.max(Duration::from_millis(50)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => break,
                },
                _ = tick.tick() => self.round(),
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Hold { id, epoch, lost } => self.leases.hold(id, epoch, lost),
            Command::Release { id, epoch } => self.leases.release(&id, epoch),
            Command::Renewed { lost } => {
                self.renewing = false;
                let Some(lost) = lost else { return };
                for (id, token) in self.leases.lost(&lost) {
                    tracing::warn!(session = %id, replica = %self.replica, "session lease lost to another replica; letting the session go");
                    token.cancel();
                }
            }
        }
    }

    /// Heartbeat and renew every held lease, on a task; its answer comes back as `Renewed`.
    fn round(&mut self) {
        if self.renewing {
            return;
        }
        self.renewing = true;
        let held = self.leases.snapshot();
        let (store, replica, url, ttl) = (
            self.store.clone(),
            self.replica.clone(),
            self.advertise_url.clone(),
            self.ttl_ms,
        );
        let tx = self.self_tx.clone();
        self.tasks.spawn(async move {
            if let Err(e) = store.replica_heartbeat(&replica, url.as_deref()).await {
                tracing::warn!(error = %e, "replica heartbeat failed");
            }
            let lost = match store.renew_leases(&replica, &held, ttl).await {
                Ok(lost) => Some(
                    held.into_iter()
                        .filter(|(id, _)| lost.contains(id))
                        .collect(),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, leases = held.len(), "cannot renew the session leases");
                    None
                }
            };
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(Command::Renewed { lost }).await;
            }
        });
    }
}

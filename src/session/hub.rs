//! The hub's task: owns the map of live sessions, opens them from the store (a task reads
//! the row; the answer comes back as `Loaded`), checks the owning principal (and the
//! profile, when the connection is scoped to one) and the live-session limit. A
//! `session/new` reserves its place under that limit before it asks the agent
//! (`Reservation`), so concurrent ones cannot all pass the check; it starts its actor itself
//! and tells the hub (`Started`) without waiting for an answer (`create.rs`).
//!
//! In a cluster the reading task first takes the session's lease (`cluster::Cluster::acquire`)
//! and reads the row after it, so the row's `last_seq` is at or past every append the
//! previous owner got in: from the new epoch on, the store refuses that owner's appends.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{HubCommand, SessionCommand, SessionHandle, Shared, actor};
use crate::agent::AgentHandle;
use crate::error::AcpError;
use acpd_store::{Acquired, SessionRow, StoreError};

/// What the lease side of opening a session found.
#[derive(Debug)]
pub(crate) enum Leased {
    /// No cluster: no lease.
    Single,
    /// This replica owns the session now, under this epoch.
    Owned(i64),
    /// Another replica holds a live lease.
    Elsewhere {
        owner: String,
        advertise_url: Option<String>,
        expires_in_ms: i64,
    },
}

/// Who waits for a session the hub is reading from the store: principal, profile (`None`:
/// any), reply.
type OpenWaiter = (
    String,
    Option<String>,
    oneshot::Sender<Result<SessionHandle, AcpError>>,
);

/// The hub never waits on the store or on a session: a session row is read by a task whose
/// answer comes back as `Loaded`, and a cancel-all is sent by a task.
pub(super) struct HubTask {
    pub shared: Shared,
    pub live: Live,
    /// Sessions whose row is being read, with who waits for them.
    pub opening: HashMap<String, Vec<OpenWaiter>>,
    /// Places under the live-session limit held by `session/new`s still under way.
    pub reserved: HashMap<String, usize>,
}

/// The live sessions: id -> (serial, handle), and each principal's ids, so the limit check
/// and a revocation look at one principal's sessions, not at every session of the daemon.
#[derive(Default)]
pub(super) struct Live {
    by_id: HashMap<Arc<str>, (u64, SessionHandle)>,
    by_principal: HashMap<Arc<str>, HashSet<Arc<str>>>,
}

impl Live {
    fn get(&self, id: &str) -> Option<&(u64, SessionHandle)> {
        self.by_id.get(id)
    }

    fn insert(&mut self, serial: u64, handle: SessionHandle) {
        // A session's principal never changes, so a reopened id stays where it was indexed.
        let id = handle.id.clone();
        self.by_principal
            .entry(handle.principal.clone())
            .or_default()
            .insert(id.clone());
        self.by_id.insert(id, (serial, handle));
    }

    /// Removes `id` if it is still the actor started as `serial`.
    fn remove(&mut self, id: &str, serial: u64) {
        if self.by_id.get(id).is_some_and(|(s, _)| *s == serial)
            && let Some((_, h)) = self.by_id.remove(id)
        {
            self.unindex(id, &h.principal);
        }
    }

    fn unindex(&mut self, id: &str, principal: &Arc<str>) {
        if let Some(ids) = self.by_principal.get_mut(principal) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_principal.remove(principal);
            }
        }
    }

    fn all(&self) -> impl Iterator<Item = &SessionHandle> {
        self.by_id.values().map(|(_, h)| h)
    }

    fn of<'a>(&'a self, principal: &str) -> impl Iterator<Item = &'a SessionHandle> + 'a {
        let ids = self.by_principal.get(principal).into_iter().flatten();
        ids.filter_map(|id| self.by_id.get(id).map(|(_, h)| h))
    }
}

/// A place under a principal's live-session limit, held from the admission of a
/// `session/new` until its session is started; given back when dropped unused.
pub(crate) struct Reservation {
    principal: String,
    hub: mpsc::Sender<HubCommand>,
    tasks: tokio_util::task::TaskTracker,
    used: bool,
}

impl Reservation {
    /// Asks the hub for a place of `principal`; `None`: over the limit (or shutting down).
    pub(super) async fn admit(shared: &Shared, principal: &str) -> Option<Reservation> {
        let (reply, rx) = oneshot::channel();
        let admit = HubCommand::Admit {
            principal: principal.to_owned(),
            reply,
        };
        if shared.hub.send(admit).await.is_err() || !rx.await.unwrap_or(false) {
            return None;
        }
        Some(Reservation {
            principal: principal.to_owned(),
            hub: shared.hub.clone(),
            tasks: shared.tasks.clone(),
            used: false,
        })
    }

    /// The session's actor runs: the hub counts it as live from this message on (which also
    /// gives the place back). Nothing waits for the hub to take it.
    pub(super) async fn started(mut self, handle: SessionHandle, serial: u64) {
        self.used = true;
        let _ = self.hub.send(HubCommand::Started { handle, serial }).await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.used {
            return;
        }
        let cmd = HubCommand::Release {
            principal: std::mem::take(&mut self.principal),
        };
        // Drop cannot await: a full queue is finished on a tracked task.
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.hub.try_send(cmd) {
            let hub = self.hub.clone();
            self.tasks.spawn(async move {
                let _ = hub.send(cmd).await;
            });
        }
    }
}

impl HubTask {
    pub async fn run(mut self, mut rx: mpsc::Receiver<HubCommand>) {
        // Before any session opens: what was spent this month counts against budgets.
        actor::load_ledger(&self.shared).await;
        loop {
            let cmd = tokio::select! {
                _ = self.shared.shutdown.cancelled() => break,
                cmd = rx.recv() => match cmd { Some(c) => c, None => break },
            };
            match cmd {
                HubCommand::Open {
                    id,
                    principal,
                    profile,
                    reply,
                } => self.open(id, principal, profile, reply),
                HubCommand::Loaded { id, row, lease } => self.loaded(id, *row, lease),
                HubCommand::Spawn {
                    row,
                    agent,
                    epoch,
                    reply,
                } => {
                    self.release(&row.principal_id);
                    let _ = reply.send(self.start(*row, agent, epoch));
                }
                HubCommand::Started { handle, serial } => {
                    self.release(&handle.principal);
                    // An actor already gone (a shutdown) is not live.
                    if !handle.is_closed() {
                        self.live.insert(serial, handle);
                    }
                }
                HubCommand::Admit { principal, reply } => {
                    let admitted = self.admits(&principal);
                    if admitted {
                        *self.reserved.entry(principal).or_default() += 1;
                    }
                    let _ = reply.send(admitted);
                }
                HubCommand::Release { principal } => self.release(&principal),
                HubCommand::GrantRevoked { session, principal } => {
                    if let Some((_, h)) = self.live.get(&session) {
                        let h = h.clone();
                        // Sent by a task: the hub never waits on a session.
                        self.shared.tasks.spawn(async move {
                            let _ = h.send(SessionCommand::Revoke { principal }).await;
                        });
                    }
                }
                HubCommand::Status { ids, reply } => {
                    let found = ids
                        .into_iter()
                        .filter_map(|id| {
                            let status = self.live.get(&id)?.1.status();
                            Some((id, status))
                        })
                        .collect();
                    let _ = reply.send(found);
                }
                HubCommand::CancelAll => {
                    let live: Vec<SessionHandle> = self.live.all().cloned().collect();
                    self.shared.tasks.spawn(async move {
                        for h in live {
                            let _ = h.send(SessionCommand::Cancel { conn: None }).await;
                        }
                    });
                }
                HubCommand::Revoked {
                    principal,
                    stop_agents,
                } => self.revoked(principal, stop_agents),
                HubCommand::Ended {
                    id,
                    serial,
                    owner,
                    handed_back,
                } => self.ended(&id, serial, &owner, handed_back),
            }
        }
    }

    fn ended(&mut self, id: &str, serial: u64, owner: &str, handed_back: Vec<SessionCommand>) {
        self.live.remove(id, serial);
        if !handed_back.is_empty() {
            self.reopen(id, owner, handed_back);
        }
    }

    /// Opens a session again for the commands that reached its actor as it ended (a resume
    /// racing a `session/close`'s end): they go to the new actor in order, or get the error.
    fn reopen(&mut self, id: &str, owner: &str, commands: Vec<SessionCommand>) {
        let (reply, opened) = oneshot::channel();
        self.open(id.to_owned(), owner.to_owned(), None, reply);
        self.shared.tasks.spawn(async move {
            let handle = match opened.await {
                Ok(Ok(h)) => h,
                Ok(Err(e)) => return reject_all(commands, e).await,
                Err(_) => return reject_all(commands, AcpError::SessionGone).await,
            };
            for cmd in commands {
                if let Err(cmd) = handle.send(cmd).await {
                    cmd.reject(AcpError::SessionGone.into()).await;
                }
            }
        });
    }

    fn open(
        &mut self,
        id: String,
        principal: String,
        profile: Option<String>,
        reply: oneshot::Sender<Result<SessionHandle, AcpError>>,
    ) {
        if let Some((_, h)) = self.live.get(&id)
            && !h.is_closed()
        {
            // The owner is checked against the store row the actor was started from.
            let r = if *h.principal == *principal && in_profile(&h.profile, &profile) {
                Ok(h.clone())
            } else {
                Err(AcpError::SessionNotFound(id))
            };
            let _ = reply.send(r);
            return;
        }
        if let Some(waiters) = self.opening.get_mut(&id) {
            waiters.push((principal, profile, reply));
            return;
        }
        self.opening
            .insert(id.clone(), vec![(principal, profile, reply)]);
        let (store, hub) = (self.shared.store.clone(), self.shared.hub.clone());
        let cluster = self.shared.cluster.clone();
        self.shared.tasks.spawn(async move {
            let lease = match &cluster {
                None => Ok(Leased::Single),
                Some(c) => c.acquire(&id).await.map(|a| match a {
                    Acquired::Owned { epoch } => Leased::Owned(epoch),
                    Acquired::Held {
                        owner,
                        advertise_url,
                        expires_in_ms,
                    } => Leased::Elsewhere {
                        owner,
                        advertise_url,
                        expires_in_ms,
                    },
                    // No such live session: the row read says so.
                    Acquired::Missing => Leased::Single,
                }),
            };
            let (row, lease) = match lease {
                Ok(lease @ Leased::Elsewhere { .. }) => (Ok(None), lease),
                Ok(lease) => (store.session(&id).await, lease),
                Err(e) => (Err(e), Leased::Single),
            };
            let row = Box::new(row);
            let _ = hub.send(HubCommand::Loaded { id, row, lease }).await;
        });
    }

    fn loaded(&mut self, id: String, row: Result<Option<SessionRow>, StoreError>, lease: Leased) {
        let waiters = self.opening.remove(&id).unwrap_or_default();
        let epoch = match lease {
            Leased::Single => None,
            Leased::Owned(epoch) => Some(epoch),
            Leased::Elsewhere {
                owner,
                advertise_url,
                expires_in_ms,
            } => {
                let owner = (owner, advertise_url, expires_in_ms);
                return self.live_elsewhere(&id, waiters, owner);
            }
        };
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                let why = e.to_string();
                let mut first = Some(e);
                for (_, _, reply) in waiters {
                    let e = first
                        .take()
                        .unwrap_or_else(|| StoreError::Unavailable(why.clone()));
                    let _ = reply.send(Err(e.into()));
                }
                return;
            }
        };
        let mut handle: Option<SessionHandle> = None;
        for (principal, profile, reply) in waiters {
            let r = match &row {
                Some(row) if row.principal_id == principal && in_profile(&row.agent, &profile) => {
                    match &handle {
                        Some(h) => Ok(h.clone()),
                        None if !self.admits(&principal) => Err(AcpError::TooManySessions),
                        None => {
                            let h = self.start(row.clone(), None, epoch);
                            handle = Some(h.clone());
                            Ok(h)
                        }
                    }
                }
                // Another principal's (or profile's) session is reported exactly like a
                // missing one.
                _ => Err(AcpError::SessionNotFound(id.clone())),
            };
            let _ = reply.send(r);
        }
        // Leased for nobody (another principal's id, the limit): given back at once.
        if handle.is_none()
            && let (Some(epoch), Some(c)) = (epoch, &self.shared.cluster)
        {
            let (_, settled) = acpd_store::watermark(0);
            c.release(Arc::from(id.as_str()), epoch, settled, 0);
        }
    }

    /// Another replica holds the session: each opener gets a forwarder to it (once it says
    /// where it is), or the error that says who has it.
    fn live_elsewhere(
        &self,
        id: &str,
        waiters: Vec<OpenWaiter>,
        (owner, advertise_url, expires_in_ms): (String, Option<String>, i64),
    ) {
        tracing::info!(session = %id, %owner, expires_in_ms, "session is live on another replica");
        // Forwarded to the owner when it says where it is: one forwarder per opener.
        if let Some(url) = advertise_url
            .as_ref()
            .filter(|_| self.shared.cluster.is_some())
        {
            for (principal, profile, reply) in waiters {
                let to = super::remote::Owner {
                    id: owner.clone(),
                    url: url.clone(),
                    expires_in_ms,
                };
                let h = super::remote::spawn(
                    id,
                    &principal,
                    profile.as_deref(),
                    to,
                    self.shared.clone(),
                );
                let _ = reply.send(Ok(h));
            }
            return;
        }
        for (_, _, reply) in waiters {
            let _ = reply.send(Err(AcpError::OwnedElsewhere {
                session: id.to_owned(),
                owner: owner.clone(),
                advertise_url: advertise_url.clone(),
                expires_in_ms,
            }));
        }
    }

    /// Whether `principal` may have one more live session (counting the reserved ones).
    fn admits(&self, principal: &str) -> bool {
        let max = self.shared.settings.max_live_per_principal;
        let reserved = self.reserved.get(principal).copied().unwrap_or(0);
        max == 0 || self.live.of(principal).filter(|h| !h.is_closed()).count() + reserved < max
    }

    /// Cancels the running turns of `principal`'s live sessions on a task; then, if asked,
    /// stops its agent processes (after a moment, so turns end as cancelled, not as a crash).
    fn revoked(&mut self, principal: String, stop_agents: bool) {
        let live: Vec<SessionHandle> = self.live.of(&principal).cloned().collect();
        tracing::warn!(target: "acpd::audit", %principal, sessions = live.len(), stop_agents, "token revoked: cancelling the principal's turns");
        let pool = self.shared.pool.clone();
        self.shared.tasks.spawn(async move {
            for h in live {
                let _ = h.send(SessionCommand::Cancel { conn: None }).await;
            }
            if stop_agents {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                pool.stop_principal(&principal).await;
            }
        });
    }

    /// Gives back one reserved place of `principal` (started or abandoned).
    fn release(&mut self, principal: &str) {
        if let Some(n) = self.reserved.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                self.reserved.remove(principal);
            }
        }
    }

    fn start(
        &mut self,
        row: SessionRow,
        agent: Option<(AgentHandle, String)>,
        epoch: Option<i64>,
    ) -> SessionHandle {
        let serial = self.shared.next_serial();
        let id: Arc<str> = Arc::from(row.id.as_str());
        let lease = epoch.and_then(|e| Some(self.shared.cluster.as_ref()?.hold(id.clone(), e)));
        let handle = actor::spawn(row, agent, self.shared.clone(), serial, lease, None);
        self.live.insert(serial, handle.clone());
        handle
    }
}

/// The lease of a session just inserted here (`session/new`, `session/fork`), in a cluster:
/// nobody else can hold it yet.
pub(super) async fn lease_new(shared: &Shared, id: &str) -> Result<Option<i64>, AcpError> {
    let Some(cluster) = &shared.cluster else {
        return Ok(None);
    };
    match cluster.acquire(id).await? {
        acpd_store::Acquired::Owned { epoch } => Ok(Some(epoch)),
        other => Err(AcpError::Internal(format!(
            "cannot lease the new session {id}: {other:?}"
        ))),
    }
}

/// Whether a session of profile `agent` is visible to a request scoped to `profile`.
fn in_profile(agent: &str, profile: &Option<String>) -> bool {
    profile.as_deref().is_none_or(|p| p == agent)
}

/// Answers every command with `e` (those with no one waiting are dropped).
async fn reject_all(commands: Vec<SessionCommand>, e: AcpError) {
    let e: acpd_wire::ResponseError = e.into();
    for cmd in commands {
        cmd.reject(e.clone()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(id: &str, principal: &str) -> SessionHandle {
        let (tx, _) = mpsc::channel(1);
        let (_, status) = tokio::sync::watch::channel(Default::default());
        SessionHandle {
            id: Arc::from(id),
            principal: Arc::from(principal),
            profile: Arc::from("p"),
            tx,
            status,
        }
    }

    fn ids<'a>(it: impl Iterator<Item = &'a SessionHandle>) -> Vec<String> {
        let mut v: Vec<String> = it.map(|h| h.id.to_string()).collect();
        v.sort();
        v
    }

    /// A principal's sessions are found without looking at anyone else's, and an actor's
    /// end removes it only while it is the actor the hub knows (not a newer one of the id).
    #[test]
    fn live_sessions_are_indexed_by_principal() {
        let mut live = Live::default();
        live.insert(1, handle("a1", "alice"));
        live.insert(2, handle("a2", "alice"));
        live.insert(3, handle("b1", "bob"));
        assert_eq!(ids(live.of("alice")), ["a1", "a2"]);
        assert_eq!(ids(live.of("bob")), ["b1"]);
        assert_eq!(ids(live.of("carol")), Vec::<String>::new());
        assert_eq!(ids(live.all()), ["a1", "a2", "b1"]);

        // a1 reopened as actor 4: the end of actor 1 leaves it.
        live.insert(4, handle("a1", "alice"));
        live.remove("a1", 1);
        assert_eq!(ids(live.of("alice")), ["a1", "a2"]);
        live.remove("a1", 4);
        live.remove("a2", 2);
        assert_eq!(ids(live.of("alice")), Vec::<String>::new());
        assert!(
            !live.by_principal.contains_key("alice"),
            "no empty sets kept"
        );
        assert_eq!(ids(live.all()), ["b1"]);
    }
}

//! One session's actor: the only owner of its journal position, attached clients, running
//! turns, and the agent's requests waiting for a client.
//!
//! Every event source is one arm of the `select!` in `Session::run`. Updates are appended to
//! the journal and queued in the outbox; the outbox releases them once durable (see
//! `outbox.rs`), so nothing reaches a client that a later `session/load` could not replay.

mod agent_side;
mod approvals;
mod attach;
mod cancel;
mod clients;
mod events;
mod fork;
pub(crate) use fork::agent_forks;
mod journal;
mod meta;
mod position;
mod restore;
mod rows;
mod splice;
mod to_agent;
mod usage;
pub(super) use to_agent::next_tag;
pub(super) use usage::load_ledger;

use acpd_protocol::method;
use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::outbox::{Out, Outbox};
use super::pending::PendingRequests;
use super::{AttachMode, ConnId, HubCommand, SessionCommand, SessionHandle, Shared};
use crate::agent::{AgentError, AgentEvent, AgentHandle};
use crate::error::AcpError;
use acpd_store::{JournalWatch, SessionRow, StoreError};
use acpd_wire::{PeerError, Responder, ResponseError};

/// Most agent events handled in one pass of the actor's loop.
const EVENT_BURST: usize = 256;
/// How often a session holding appends for a full store queue looks whether the store stalled.
/// The most commands held for the hub while the session ends (more are refused: try again).
const HAND_BACK_MAX: usize = 256;
const STALL_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// A session just created (`create.rs`), as `spawn` starts it.
pub(super) struct Created<'a> {
    /// The owner's name: a new session has spent nothing, so its accounting starts ready,
    /// without reading the store (two queries fewer on `session/new`'s path).
    pub owner: &'a str,
    /// The journal's watch when the row is queued, not yet committed (`Store::queue_session`):
    /// at `ROW_QUEUED` until the writer commits it. `None`: the row is committed.
    pub row_queued: Option<JournalWatch>,
}

/// `created`: `None` for a session opened again, which reads its owner and past spending.
pub(super) fn spawn(
    mut row: SessionRow,
    agent: Option<(AgentHandle, String)>,
    shared: Shared,
    serial: u64,
    lease: Option<crate::cluster::Lease>,
    mut created: Option<Created<'_>>,
) -> SessionHandle {
    let (tx, rx) = mpsc::channel(256);
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let (status, status_rx) = watch::channel(super::LiveStatus::default());
    let id: Arc<str> = Arc::from(row.id.as_str());
    let handle = SessionHandle {
        id: id.clone(),
        principal: Arc::from(row.principal_id.as_str()),
        profile: Arc::from(row.agent.as_str()),
        tx,
        status: status_rx,
    };
    let journaled = row.last_seq;
    let mut session = Session {
        id,
        position: match created.as_mut().and_then(|c| c.row_queued.take()) {
            Some(watch) => position::Position::queued(watch, lease),
            None => position::Position::new(journaled, lease),
        },
        // Taken out of the row: the session holds it once (`meta.rs`).
        meta: meta::Meta::new(std::mem::take(&mut row.meta)),
        row,
        shared: shared.clone(),
        agent: agent_side::AgentSide::new(ev_tx),
        outbox: Outbox::new(shared.tasks.clone(), journaled),
        turn: Turn {
            cancel_requested: false,
            conn: None,
            own_from: 0,
            guard: cancel::CancelGuard::new(
                shared.settings.cancel_grace,
                shared.settings.cancel_abandon,
            ),
            held: Vec::new(),
            queued: VecDeque::new(),
            cut_off: std::collections::HashSet::new(),
        },
        pending: PendingRequests::default(),
        tasks: JoinSet::new(),
        ending: false,
        handed_back: Vec::new(),
        upkeep: Upkeep::default(),
        rows: rows::RowWrites::default(),
        status,
        usage: usage::Accounting::default(),
    };
    match created {
        Some(c) => session.usage_loaded(usage::Loaded::Past {
            owner: Some(c.owner.to_owned()),
            spent: Ok(Default::default()),
        }),
        None => {
            session.tasks.spawn(usage::load(
                shared.store.clone(),
                session.id.to_string(),
                session.row.principal_id.clone(),
                shared.settings.budgets.currency.clone(),
            ));
        }
    }
    if let Some((agent, agent_sid)) = agent {
        agent.register(&session.id, Some(&agent_sid), session.agent.events.clone());
        session.agent.state = AgentState::Bound { agent, agent_sid };
    }
    shared.tasks.spawn(session.run(rx, ev_rx, serial));
    handle
}

enum AgentState {
    Unbound,
    /// Waiting for the pool to hand out a process.
    Starting,
    /// Re-creating the agent-side session; the replay of a `session/load` is dropped.
    Restoring {
        agent: AgentHandle,
    },
    Bound {
        agent: AgentHandle,
        agent_sid: String,
    },
    /// Restoring failed; the next command that needs the agent tries again.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Restore {
    Resume,
    Load,
    New,
}

/// An in-band request to the agent, by tag.
enum Inflight {
    Prompt {
        responder: Responder,
    },
    Relay {
        responder: Responder,
    },
    Fork {
        responder: Responder,
        client: super::Client,
        params: Value,
    },
    Restore(Restore),
}

/// Completions of the actor's helper tasks.
enum TaskDone {
    AgentReady(Result<AgentHandle, Arc<AgentError>>),
    Retention(Result<super::retention::Pass, StoreError>),
    ClientAnswer {
        pending: u64,
        conn: ConnId,
        result: Result<Value, PeerError>,
    },
    /// A journal page for a lagging client.
    CatchUp {
        conn: ConnId,
        after: i64,
        page: Result<Vec<acpd_store::JournalEntry>, StoreError>,
    },
    Row(rows::RowDone),
    /// What `usage.rs`'s helper tasks bring back: the owner and past spending, or a ledger move.
    Usage(Box<usage::Loaded>),
}

/// The running turn (its in-band requests are the agent side's `inflight`).
struct Turn {
    cancel_requested: bool,
    /// The connection whose prompt is running: the agent's requests go there first.
    conn: Option<ConnId>,
    /// The first seq of that prompt's turn (its own prompt is not echoed to it).
    own_from: i64,
    /// What `session/cancel` guarantees (`cancel.rs`).
    guard: cancel::CancelGuard,
    /// Prompts waiting for an abandoned turn's late answer before they go to the agent.
    held: Vec<cancel::HeldPrompt>,
    /// Prompts of (other) controllers waiting for the running turn to end (`busy_prompts`).
    queued: VecDeque<cancel::HeldPrompt>,
    /// Connections cut off by a revoked grant: what they still send (before their connection
    /// has ended) is refused.
    cut_off: std::collections::HashSet<ConnId>,
}

/// Journal retention passes (`retention.rs`).
#[derive(Default)]
struct Upkeep {
    /// Another pass is due when the running one ends.
    retention_wanted: bool,
    /// Whether the journal may be over a cap, and whether a pass is running.
    journal: super::retention::Estimate,
}

/// What this session adds to the shared counts (released when it ends).
#[derive(Default)]
struct Counted {
    /// Whether this session counts as detached (live, no client) in the gauge.
    detached: bool,
    /// Turns of this session counted in `shared.turns`.
    turns: usize,
}

/// The session's state, grouped by what owns it.
pub(super) struct Session {
    id: Arc<str>,
    shared: Shared,
    // The session row (`rows.rs` writes it).
    row: SessionRow,
    /// `row.meta`: the agent's last `modes`/`configOptions`, the `mcpServers`.
    meta: meta::Meta,
    /// Session row updates on their way to the store.
    rows: rows::RowWrites,
    /// The journal position (`position.rs`; `journal.rs` does its I/O).
    position: position::Position,
    /// The agent side (`agent_side.rs`; `restore.rs`, `to_agent.rs` do its I/O).
    agent: agent_side::AgentSide,
    turn: Turn,
    // The clients (`attach.rs`, `outbox.rs`, `pending.rs`).
    outbox: Outbox,
    pending: PendingRequests,
    // Helper tasks and the session's end.
    tasks: JoinSet<TaskDone>,
    upkeep: Upkeep,
    ending: bool,
    /// What the session says of itself (`SessionHandle::status`).
    status: watch::Sender<super::LiveStatus>,
    /// What its turns spend, and its budgets (`usage.rs`).
    usage: usage::Accounting,
    /// Commands that reached the session after it decided to end: the hub opens the session
    /// again for them (`hand_back`).
    handed_back: Vec<SessionCommand>,
}

impl Session {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Box<SessionCommand>>,
        mut events: mpsc::Receiver<AgentEvent>,
        serial: u64,
    ) {
        metrics::gauge!(crate::metrics::SESSIONS_LIVE).increment(1);
        let mut counted = Counted::default();
        let shutdown = self.shared.shutdown.clone();
        let idle = self.shared.settings.idle_evict;
        let mut idle_since = Instant::now();
        loop {
            let hold = self.outbox.hold_until();
            let deadline = self.pending.next_deadline();
            let lag_check = self.outbox.lag_check_at();
            let cancel_at = self.turn.guard.next_deadline();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = commands.recv() => match cmd {
                    // The cold handlers are boxed: awaited inline, their futures would make
                    // every live session's task as big as the largest of them.
                    Some(cmd) => Box::pin(self.on_command(*cmd)).await,
                    None => break,
                },
                ev = events.recv(), if !self.position.holding() => {
                    if let Some(ev) = ev {
                        self.on_agent_burst(ev, &mut events).await
                    }
                }
                Ok(()) = self.position.durable_rx.changed() => {}
                room = self.shared.store.append_room(), if self.position.holding() => {
                    self.on_append_room(room)
                }
                _ = tokio::time::sleep(STALL_CHECK), if self.position.holding() || self.settling() => {
                    self.check_store_stall()
                }
                Some(done) = self.tasks.join_next() => {
                    if let Ok(done) = done {
                        Box::pin(self.on_task(done)).await;
                    }
                }
                _ = sleep_until(hold) => self.outbox.release_hold(),
                _ = sleep_until(deadline) => Box::pin(self.expire_pending()).await,
                _ = sleep_until(cancel_at) => Box::pin(self.cancel_deadline()).await,
                // `flush` below looks at lagging clients.
                _ = sleep_until(lag_check) => {}
                _ = tokio::time::sleep_until(idle_since + idle), if self.is_idle() => break,
                _ = lease_lost(&self.position.lease), if !self.ending => Box::pin(self.let_go()).await,
            }
            self.start_queued().await;
            self.flush().await;
            if self.ending && self.outbox.is_empty() && !self.settling() {
                break;
            }
            if !self.is_idle() {
                idle_since = Instant::now();
            }
            self.recount(&mut counted);
        }
        // Closed before the end is announced: a later send fails and its sender opens the
        // session again; what got in before is handed back with the end. `recv`, not
        // `try_recv`: a send that holds a permit still lands after `close`, and `recv` ends
        // only once no permit is out (it waits on no peer: a permit's send is immediate).
        // Commands waiting for the agent came before those that met the session ending.
        let met_the_end = std::mem::take(&mut self.handed_back);
        while let Some(cmd) = self.agent.next_deferred() {
            self.hand_back(cmd);
        }
        self.handed_back.extend(met_the_end);
        commands.close();
        while let Some(cmd) = commands.recv().await {
            self.hand_back(*cmd);
        }
        Box::pin(self.wind_down(counted, serial)).await;
    }

    /// A command for a session that is ending. After a delete the session is gone; at a
    /// shutdown nothing opens again; otherwise the command goes back to the hub with the
    /// session's end, so a resume that races a close's end is neither dropped nor refused.
    /// Commands that expect no answer and attach no one (a cancel, a detach) are moot.
    fn hand_back(&mut self, cmd: SessionCommand) {
        if self.rows.deleted {
            return self.refuse(cmd, AcpError::SessionNotFound(self.id.to_string()).into());
        }
        if self.shared.shutdown.is_cancelled() || self.handed_back.len() >= HAND_BACK_MAX {
            return self.refuse(cmd, AcpError::SessionGone.into());
        }
        if matches!(cmd, SessionCommand::Attach { .. }) || cmd.expects_answer() {
            self.handed_back.push(cmd);
        }
    }

    /// An agent event, and the events already queued behind it: one flush (and one pass of
    /// the loop) per burst of updates, not per update.
    async fn on_agent_burst(&mut self, first: AgentEvent, events: &mut mpsc::Receiver<AgentEvent>) {
        self.position.burst_ms = Some(super::now_ms());
        self.on_agent_event(first).await;
        for _ in 1..EVENT_BURST {
            if self.position.holding() {
                break;
            }
            match events.try_recv() {
                Ok(ev) => self.on_agent_event(ev).await,
                Err(_) => break,
            }
        }
        self.position.burst_ms = None;
    }

    /// Brings the running-turns count, the status and the detached gauge up to date.
    fn recount(&mut self, counted: &mut Counted) {
        let now_turns = self
            .agent
            .inflight
            .values()
            .filter(|f| matches!(f, Inflight::Prompt { .. }))
            .count();
        if now_turns != counted.turns {
            use std::sync::atomic::Ordering::Relaxed;
            self.shared.turns.fetch_add(now_turns, Relaxed);
            self.shared.turns.fetch_sub(counted.turns, Relaxed);
            counted.turns = now_turns;
            self.status.send_modify(|s| s.running = now_turns > 0);
        }
        let now_detached = self.outbox.clients_len() == 0;
        if now_detached != counted.detached {
            counted.detached = now_detached;
            let g = metrics::gauge!(crate::metrics::SESSIONS_DETACHED);
            if counted.detached {
                g.increment(1)
            } else {
                g.decrement(1)
            }
        }
    }

    /// The session's end: its counts, its last writes, its agent, its lease, the hub.
    async fn wind_down(mut self, counted: Counted, serial: u64) {
        metrics::gauge!(crate::metrics::SESSIONS_LIVE).decrement(1);
        self.shared
            .turns
            .fetch_sub(counted.turns, std::sync::atomic::Ordering::Relaxed);
        if counted.detached {
            metrics::gauge!(crate::metrics::SESSIONS_DETACHED).decrement(1);
        }
        // Row writes under way finish on their own; what is still queued is written here,
        // and what waited for it goes.
        self.tasks.detach_all();
        self.finish_rows().await;
        self.flush().await;
        let handed_back = std::mem::take(&mut self.handed_back);
        if let AgentState::Bound { agent, .. } | AgentState::Restoring { agent, .. } =
            &self.agent.state
        {
            agent.unregister(&self.id, &self.agent.events);
        }
        // The lease goes back once what was appended is settled: a peer takes the session
        // at once. A lost lease is not ours to give back (the store checks the epoch).
        if let (Some(lease), Some(cluster)) = (&self.position.lease, &self.shared.cluster) {
            let upto = self.position.last();
            let durable = self.position.durable_rx.clone();
            cluster.release(self.id.clone(), lease.epoch, durable, upto);
        }
        let _ = self
            .shared
            .hub
            .send(HubCommand::Ended {
                id: self.id.clone(),
                serial,
                owner: Arc::from(self.row.principal_id.as_str()),
                handed_back,
            })
            .await;
    }

    /// The journal stopped for a store outage and the store's writer is still stuck on a
    /// commit that may hold this session's entries: the session ends only once that commit is
    /// over, so the actor that reopens it reads the journal's true end.
    fn settling(&self) -> bool {
        self.position.settling(self.shared.store.writes_stalled())
    }

    fn is_idle(&self) -> bool {
        self.outbox.clients_len() == 0
            && self.agent.inflight.is_empty()
            && self.turn.held.is_empty()
            && self.turn.queued.is_empty()
            && self.pending.is_empty()
            && self.outbox.is_empty()
            && self.rows.is_idle()
    }

    /// Answers a client's request after what is queued for it; never waits on the client.
    fn reply(&mut self, responder: Responder, result: Result<Value, ResponseError>) {
        self.outbox.push(Out::Reply { responder, result });
    }

    /// Answers a command that will not run with `e`.
    fn refuse(&mut self, cmd: SessionCommand, e: ResponseError) {
        if let Some(r) = cmd.into_responder() {
            self.reply(r, Err(e));
        }
    }

    async fn on_command(&mut self, cmd: SessionCommand) {
        if self.ending || self.rows.closing() {
            return self.hand_back(cmd);
        }
        if needs_agent(&cmd) && !self.agent.bound() {
            if let SessionCommand::Attach { client, .. } = &cmd {
                self.agent.last_init = Some(client.init.clone());
            }
            if let AgentState::Failed(why) = &self.agent.state {
                let why = why.clone();
                self.agent.state = AgentState::Unbound;
                if self.agent.has_deferred() {
                    tracing::debug!(session = %self.id, %why, "retrying agent restore");
                }
            }
            if let Err(cmd) = self.agent.defer(cmd) {
                let e = AcpError::Internal(
                    "too many requests wait for this session's agent to start; try again".into(),
                );
                return self.refuse(*cmd, e.into());
            }
            self.ensure_agent();
            return;
        }
        if let Some(e) = self.forbidden(&cmd) {
            return self.refuse(cmd, e.into());
        }
        match cmd {
            SessionCommand::Attach {
                client,
                mode,
                responder,
            } => self.attach(client, mode, responder),
            SessionCommand::Detach { conn } => self.detach(conn).await,
            SessionCommand::Revoke { principal } => self.revoke(&principal).await,
            SessionCommand::Prompt {
                conn,
                params,
                responder,
            } => {
                self.outbox.release_hold_by(&conn);
                self.prompt(conn, params, responder).await
            }
            SessionCommand::Cancel { .. } => {
                self.cancel().await;
                self.cancel_in_outage();
            }
            SessionCommand::Relay {
                method, responder, ..
            } if method == method::QUOTA_READ => {
                let snapshot = self.quota_snapshot();
                self.reply(responder, Ok(snapshot))
            }
            SessionCommand::Relay {
                conn: _,
                method,
                params,
                responder,
            } => match self.send_in_band(&method, params).await {
                Ok(tag) => {
                    self.agent.sent(tag, Inflight::Relay { responder });
                }
                Err(e) => self.reply(responder, Err(e.into())),
            },
            SessionCommand::RelayNotification {
                conn: _,
                method,
                params,
            } => self.notify_agent(&method, params),
            SessionCommand::Fork {
                client,
                params,
                responder,
            } => self.fork(client, params, responder).await,
            SessionCommand::Close { responder, .. } => self.close(responder, false).await,
            SessionCommand::Delete { responder, .. } => self.close(responder, true).await,
        }
    }

    /// Starts a prompt's turn (`clients.rs` decided it may start now).
    async fn begin_prompt(&mut self, conn: ConnId, params: Value, responder: Responder) {
        if let Some(e) = self.budget_refusal() {
            return self.reply(responder, Err(e.into()));
        }
        self.turn.own_from = self.position.next_seq;
        if let Some(blocks) = params.get("prompt").and_then(Value::as_array) {
            for block in blocks.clone() {
                let update = json!({ "sessionId": &*self.id, "update": { "sessionUpdate": "user_message_chunk", "content": block } });
                self.journal(update, Some(conn.clone())).await;
            }
        }
        if self.turn.guard.holds_prompts() {
            // An abandoned turn may still stream: this one starts once it is over.
            let held = cancel::HeldPrompt {
                conn,
                params,
                responder,
            };
            return self.turn.held.push(held);
        }
        self.turn.conn = Some(conn);
        self.send_prompt(params, responder).await;
    }

    async fn send_prompt(&mut self, params: Value, responder: Responder) {
        if self.running_prompts().is_empty() {
            self.turn.cancel_requested = false;
        }
        match self.send_in_band(method::SESSION_PROMPT, params).await {
            Ok(tag) => {
                self.agent.sent(tag, Inflight::Prompt { responder });
            }
            Err(e) => self.reply(responder, Err(e.into())),
        }
    }

    async fn on_task(&mut self, done: TaskDone) {
        match done {
            TaskDone::AgentReady(Ok(agent)) => self.restore_step(agent, None).await,
            TaskDone::CatchUp { conn, after, page } => self.on_catch_up(conn, after, page),
            TaskDone::Row(done) => self.on_row_done(done),
            TaskDone::Retention(r) => self.retention_done(r),
            TaskDone::Usage(loaded) => self.usage_loaded(*loaded),
            TaskDone::AgentReady(Err(e)) => {
                self.agent.state = AgentState::Unbound;
                let err: ResponseError = AcpError::Agent(e).into();
                while let Some(cmd) = self.agent.next_deferred() {
                    self.refuse(cmd, err.clone());
                }
            }
            TaskDone::ClientAnswer {
                pending,
                conn,
                result,
            } => self.client_answered(pending, conn, result).await,
        }
    }
}

fn needs_agent(cmd: &SessionCommand) -> bool {
    match cmd {
        SessionCommand::Prompt { .. }
        | SessionCommand::Relay { .. }
        | SessionCommand::Fork { .. } => true,
        SessionCommand::Attach { mode, .. } => {
            matches!(mode, AttachMode::Load { .. } | AttachMode::Resume { .. })
        }
        _ => false,
    }
}

/// Rewrites `params.sessionId` for the next hop.
fn with_session_id(params: Value, id: &str) -> Value {
    match params {
        Value::Object(mut m) => {
            m.insert("sessionId".into(), Value::String(id.to_owned()));
            Value::Object(m)
        }
        other => other,
    }
}

/// Resolves when the session's lease is found lost (never without a lease).
async fn lease_lost(lease: &Option<crate::cluster::Lease>) {
    match lease {
        Some(l) => l.lost.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

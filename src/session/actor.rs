//! One session's actor: the only owner of its journal position, attached clients, running
//! turns, and the agent's requests waiting for a client.
//!
//! Every event source is one arm of the `select!` in `Session::run`. Updates are appended to
//! the journal and queued in the outbox; the outbox releases them once durable (see
//! `outbox.rs`), so nothing reaches a client that a later `session/load` could not replay.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::outbox::{Attached, Out, Outbox};
use super::pending::{Pending, PendingRequests};
use super::{
    AttachMode, Client, ConnId, HubCommand, SessionCommand, SessionHandle, Shared, now_ms,
};
use crate::acp::AcpError;
use crate::agent::{AgentError, AgentEvent, AgentHandle, AgentKey};
use crate::jsonrpc::{PeerError, Responder, ResponseError};
use crate::store::{NewEntry, SessionPatch, SessionRow, StoreError};

/// Journal entries read per page when replaying.
const REPLAY_PAGE: i64 = 1000;

pub(super) fn spawn(
    row: SessionRow,
    agent: Option<(AgentHandle, String)>,
    shared: Shared,
    serial: u64,
) -> SessionHandle {
    let (tx, rx) = mpsc::channel(256);
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let id: Arc<str> = Arc::from(row.id.as_str());
    let handle = SessionHandle {
        id: id.clone(),
        principal: Arc::from(row.principal_id.as_str()),
        tx,
    };
    let (durable, durable_rx) = watch::channel(row.last_seq);
    let mut session = Session {
        id,
        next_seq: row.last_seq + 1,
        meta: serde_json::from_str(&row.meta).unwrap_or_else(|_| json!({})),
        row,
        shared: shared.clone(),
        agent: AgentState::Unbound,
        events: ev_tx,
        durable: Arc::new(durable),
        durable_rx,
        outbox: Outbox::default(),
        inflight: std::collections::HashMap::new(),
        next_tag: 1,
        cancel_requested: false,
        turn_conn: None,
        pending: PendingRequests::default(),
        deferred: VecDeque::new(),
        tasks: JoinSet::new(),
        last_init: None,
        ending: false,
        compacting: false,
        retention_wanted: false,
    };
    if let Some((agent, agent_sid)) = agent {
        agent.register(&session.id, Some(&agent_sid), session.events.clone());
        session.agent = AgentState::Bound { agent, agent_sid };
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
    Prompt { responder: Responder },
    Relay { responder: Responder },
    Restore(Restore),
}

/// Completions of the actor's helper tasks.
enum TaskDone {
    AgentReady(Result<AgentHandle, Arc<AgentError>>),
    Retention(Result<Option<super::retention::Outcome>, StoreError>),
    ClientAnswer {
        pending: u64,
        conn: ConnId,
        result: Result<Value, PeerError>,
    },
}

pub(super) struct Session {
    id: Arc<str>,
    row: SessionRow,
    /// Parsed `row.meta`: the agent's last `modes`/`configOptions`, the `mcpServers`.
    meta: Value,
    shared: Shared,
    agent: AgentState,
    /// Given to the agent router so the agent's messages reach this actor.
    events: mpsc::Sender<AgentEvent>,
    next_seq: i64,
    durable: Arc<watch::Sender<i64>>,
    durable_rx: watch::Receiver<i64>,
    outbox: Outbox,
    inflight: std::collections::HashMap<u64, Inflight>,
    next_tag: u64,
    cancel_requested: bool,
    /// The connection whose prompt is running: the agent's requests go there first.
    turn_conn: Option<ConnId>,
    pending: PendingRequests,
    /// Commands that wait for the agent to be bound.
    deferred: VecDeque<SessionCommand>,
    tasks: JoinSet<TaskDone>,
    /// The newest client `initialize` params, to start the agent with.
    last_init: Option<Arc<Value>>,
    ending: bool,
    /// A retention pass is running.
    compacting: bool,
    /// Another pass is due when the running one ends.
    retention_wanted: bool,
}

impl Session {
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<SessionCommand>,
        mut events: mpsc::Receiver<AgentEvent>,
        serial: u64,
    ) {
        metrics::gauge!(crate::metrics::SESSIONS_LIVE).increment(1);
        // Whether this session counts as detached (live, no client) in the gauge.
        let mut detached = false;
        // Turns of this session counted in `shared.turns`.
        let mut turns = 0usize;
        let shutdown = self.shared.shutdown.clone();
        let idle = self.shared.settings.idle_evict;
        let mut idle_since = Instant::now();
        loop {
            let hold = self.outbox.hold_until();
            let deadline = self.pending.next_deadline();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd).await,
                    None => break,
                },
                ev = events.recv() => {
                    if let Some(ev) = ev {
                        self.on_agent_event(ev).await;
                    }
                }
                Ok(()) = self.durable_rx.changed() => {}
                Some(done) = self.tasks.join_next() => {
                    if let Ok(done) = done {
                        self.on_task(done).await;
                    }
                }
                _ = sleep_until(hold) => self.outbox.release_hold(),
                _ = sleep_until(deadline) => self.expire_pending().await,
                _ = tokio::time::sleep_until(idle_since + idle), if self.is_idle() => break,
            }
            self.flush().await;
            if self.ending && self.outbox.is_empty() {
                break;
            }
            if !self.is_idle() {
                idle_since = Instant::now();
            }
            let now_turns = self
                .inflight
                .values()
                .filter(|f| matches!(f, Inflight::Prompt { .. }))
                .count();
            if now_turns != turns {
                use std::sync::atomic::Ordering::Relaxed;
                self.shared.turns.fetch_add(now_turns, Relaxed);
                self.shared.turns.fetch_sub(turns, Relaxed);
                turns = now_turns;
            }
            let now_detached = self.outbox.clients_len() == 0;
            if now_detached != detached {
                detached = now_detached;
                let g = metrics::gauge!(crate::metrics::SESSIONS_DETACHED);
                if detached {
                    g.increment(1)
                } else {
                    g.decrement(1)
                }
            }
        }
        metrics::gauge!(crate::metrics::SESSIONS_LIVE).decrement(1);
        self.shared
            .turns
            .fetch_sub(turns, std::sync::atomic::Ordering::Relaxed);
        if detached {
            metrics::gauge!(crate::metrics::SESSIONS_DETACHED).decrement(1);
        }
        self.flush().await;
        if let AgentState::Bound { agent, .. } | AgentState::Restoring { agent, .. } = &self.agent {
            agent.unregister(&self.id);
        }
        let _ = self
            .shared
            .hub
            .send(HubCommand::Ended {
                id: self.id.clone(),
                serial,
            })
            .await;
    }

    fn is_idle(&self) -> bool {
        self.outbox.clients_len() == 0
            && self.inflight.is_empty()
            && self.pending.is_empty()
            && self.outbox.is_empty()
    }

    async fn on_command(&mut self, cmd: SessionCommand) {
        if needs_agent(&cmd) && !matches!(self.agent, AgentState::Bound { .. }) {
            if let SessionCommand::Attach { client, .. } = &cmd {
                self.last_init = Some(client.init.clone());
            }
            if let AgentState::Failed(why) = &self.agent {
                let why = why.clone();
                self.agent = AgentState::Unbound;
                if !self.deferred.is_empty() {
                    tracing::debug!(session = %self.id, %why, "retrying agent restore");
                }
            }
            self.deferred.push_back(cmd);
            self.ensure_agent();
            return;
        }
        match cmd {
            SessionCommand::Attach {
                client,
                mode,
                responder,
            } => self.attach(client, mode, responder).await,
            SessionCommand::Detach { conn } => {
                self.outbox.detach(&conn);
                if self.turn_conn.as_ref() == Some(&conn) {
                    self.turn_conn = None;
                }
            }
            SessionCommand::Prompt {
                conn,
                params,
                responder,
            } => self.prompt(conn, params, responder).await,
            SessionCommand::Cancel => self.cancel().await,
            SessionCommand::Relay {
                method,
                params,
                responder,
            } => match self.send_in_band(&method, params).await {
                Ok(tag) => {
                    self.inflight.insert(tag, Inflight::Relay { responder });
                }
                Err(e) => responder.respond(Err(e.into())).await,
            },
            SessionCommand::RelayNotification { method, params } => {
                if let AgentState::Bound { agent, agent_sid } = &self.agent {
                    let _ = agent
                        .peer
                        .notify(&method, Some(with_session_id(params, agent_sid)))
                        .await;
                }
            }
            SessionCommand::Close { responder } => self.close(responder, false).await,
            SessionCommand::Delete { responder } => self.close(responder, true).await,
        }
    }

    /// Asks the pool for the agent, unless that is already under way.
    fn ensure_agent(&mut self) {
        if !matches!(self.agent, AgentState::Unbound) {
            return;
        }
        let init = self
            .last_init
            .clone()
            .unwrap_or_else(|| Arc::new(json!({ "protocolVersion": 1 })));
        let key = AgentKey {
            principal: self.row.principal_id.clone(),
            profile: self.row.agent.clone(),
        };
        let pool = self.shared.pool.clone();
        self.agent = AgentState::Starting;
        self.tasks
            .spawn(async move { TaskDone::AgentReady(pool.get(key, init).await) });
    }

    /// Starts the next restore step on `agent`, or binds/fails when none is left.
    async fn restore_step(&mut self, agent: AgentHandle, after: Option<Restore>) {
        let old = self.row.agent_session_id.clone();
        let next = match after {
            None if old.is_some() && agent.supports_resume() => Some(Restore::Resume),
            None | Some(Restore::Resume) if old.is_some() && agent.supports_load() => {
                Some(Restore::Load)
            }
            Some(Restore::New) => None,
            _ => Some(Restore::New),
        };
        let Some(step) = next else {
            self.restore_failed("the agent could not re-create the session".into())
                .await;
            return;
        };
        agent.register(&self.id, old.as_deref(), self.events.clone());
        let mut params = json!({
            "cwd": self.row.cwd,
            "mcpServers": self.meta.get("mcpServers").cloned().unwrap_or_else(|| json!([])),
        });
        if let Ok(Value::Array(dirs)) = serde_json::from_str::<Value>(&self.row.additional_dirs)
            && !dirs.is_empty()
        {
            params["additionalDirectories"] = Value::Array(dirs);
        }
        let method = match step {
            Restore::Resume => "session/resume",
            Restore::Load => "session/load",
            Restore::New => "session/new",
        };
        if step != Restore::New {
            params["sessionId"] = json!(old);
        }
        let tag = self.tag();
        match agent.request_in_band(method, params, &self.id, tag).await {
            Ok(_) => {
                self.inflight.insert(tag, Inflight::Restore(step));
                self.agent = AgentState::Restoring { agent };
            }
            Err(_) => self.restore_failed("the agent exited".into()).await,
        }
    }

    async fn restore_done(&mut self, step: Restore, result: Result<Value, ResponseError>) {
        let AgentState::Restoring { agent, .. } =
            std::mem::replace(&mut self.agent, AgentState::Unbound)
        else {
            return;
        };
        match result {
            Ok(r) => {
                let agent_sid = match step {
                    Restore::New => match r.get("sessionId").and_then(Value::as_str) {
                        Some(s) => s.to_owned(),
                        None => {
                            return self
                                .restore_failed("session/new answer without sessionId".into())
                                .await;
                        }
                    },
                    _ => self.row.agent_session_id.clone().unwrap_or_default(),
                };
                agent.register(&self.id, Some(&agent_sid), self.events.clone());
                for key in ["modes", "configOptions"] {
                    if let Some(v) = r.get(key) {
                        self.meta[key] = v.clone();
                    }
                }
                self.row.agent_session_id = Some(agent_sid.clone());
                let patch = SessionPatch {
                    agent_session_id: Some(Some(agent_sid.clone())),
                    meta: Some(self.meta.to_string()),
                    closed: Some(false),
                    ..self.patch()
                };
                self.save(patch).await;
                tracing::info!(session = %self.id, ?step, "agent session restored");
                self.agent = AgentState::Bound { agent, agent_sid };
                self.run_deferred().await;
            }
            Err(e) => {
                tracing::debug!(session = %self.id, ?step, error = %e, "restore step failed");
                self.agent = AgentState::Restoring {
                    agent: agent.clone(),
                };
                Box::pin(self.restore_step(agent, Some(step))).await;
            }
        }
    }

    async fn restore_failed(&mut self, why: String) {
        tracing::warn!(session = %self.id, %why, "cannot restore the agent session");
        self.agent = AgentState::Failed(why.clone());
        while let Some(cmd) = self.deferred.pop_front() {
            cmd.reject(AcpError::AgentExited(why.clone()).into()).await;
        }
    }

    async fn run_deferred(&mut self) {
        while matches!(self.agent, AgentState::Bound { .. }) {
            let Some(cmd) = self.deferred.pop_front() else {
                break;
            };
            Box::pin(self.on_command(cmd)).await;
        }
    }

    async fn attach(&mut self, client: Client, mode: AttachMode, responder: Option<Responder>) {
        self.last_init = Some(client.init.clone());
        let conn = client.conn.clone();
        let current = self.next_seq - 1;
        let (sent_upto, reply, hold) = match mode {
            AttachMode::New { result } => (0, Some(result), true),
            AttachMode::Implicit => (current, None, false),
            AttachMode::Resume { params } => {
                self.adopt_client_params(&params).await;
                (current, Some(self.load_result()), true)
            }
            AttachMode::Load { params } => {
                self.adopt_client_params(&params).await;
                match self.replay(&client, 0).await {
                    Ok(upto) => (upto, Some(self.load_result()), true),
                    Err(e) => {
                        if let Some(r) = responder {
                            r.respond(Err(AcpError::from(e).into())).await;
                        }
                        return;
                    }
                }
            }
            AttachMode::After { after_seq } => match self.replay(&client, after_seq).await {
                Ok(upto) => (upto, Some(json!({ "lastSeq": upto })), false),
                Err(e) => {
                    if let Some(r) = responder {
                        r.respond(Err(AcpError::from(e).into())).await;
                    }
                    return;
                }
            },
        };
        self.outbox.attach(Attached { client, sent_upto });
        if let (Some(r), Some(result)) = (responder, reply) {
            r.respond(Ok(result)).await;
        }
        if hold {
            self.outbox.hold_for(self.shared.settings.bootstrap_delay);
        }
        // Requests the agent made while nobody was attached go to the newcomer.
        for id in self.pending.waiting() {
            self.dispatch(id, Some(&conn));
        }
    }

    /// Sends the journal after `after_seq` to one client; returns the last seq sent.
    async fn replay(&mut self, client: &Client, after_seq: i64) -> Result<i64, StoreError> {
        let mut upto = after_seq.max(0);
        loop {
            let page = self
                .shared
                .store
                .journal_after(&self.id, upto, REPLAY_PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            upto = last.seq;
            let n = page.len() as i64;
            for e in page {
                if client.peer.send_raw(e.body).await.is_err() {
                    return Ok(upto);
                }
            }
            if n < REPLAY_PAGE {
                break;
            }
        }
        Ok(upto)
    }

    /// A load/resume carries the client's cwd and MCP servers; they are the ones to use now.
    async fn adopt_client_params(&mut self, params: &Value) {
        let mut patch = SessionPatch {
            closed: Some(false),
            ..self.patch()
        };
        if let Some(cwd) = params.get("cwd").and_then(Value::as_str)
            && cwd != self.row.cwd
        {
            self.row.cwd = cwd.to_owned();
            patch.cwd = Some(cwd.to_owned());
        }
        if let Some(m) = params.get("mcpServers") {
            self.meta["mcpServers"] = m.clone();
            patch.meta = Some(self.meta.to_string());
        }
        self.save(patch).await;
    }

    fn load_result(&self) -> Value {
        let mut r = json!({});
        for key in ["modes", "configOptions"] {
            if let Some(v) = self.meta.get(key).filter(|v| !v.is_null()) {
                r[key] = v.clone();
            }
        }
        r
    }

    async fn prompt(&mut self, conn: ConnId, params: Value, responder: Responder) {
        if let Some(blocks) = params.get("prompt").and_then(Value::as_array) {
            for block in blocks.clone() {
                let update = json!({ "sessionId": &*self.id, "update": { "sessionUpdate": "user_message_chunk", "content": block } });
                self.journal(update, Some(conn.clone())).await;
            }
        }
        self.turn_conn = Some(conn);
        if self
            .inflight
            .values()
            .all(|f| !matches!(f, Inflight::Prompt { .. }))
        {
            self.cancel_requested = false;
        }
        match self.send_in_band("session/prompt", params).await {
            Ok(tag) => {
                self.inflight.insert(tag, Inflight::Prompt { responder });
            }
            Err(e) => responder.respond(Err(e.into())).await,
        }
    }

    /// Sends a session-scoped request to the bound agent; its answer comes as an event.
    async fn send_in_band(&mut self, method: &str, params: Value) -> Result<u64, AcpError> {
        let AgentState::Bound { agent, agent_sid } = &self.agent else {
            return Err(AcpError::AgentExited("no agent process".into()));
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let params = with_session_id(params, agent_sid);
        match agent.request_in_band(method, params, &self.id, tag).await {
            Ok(_) => Ok(tag),
            Err(_) => {
                self.agent = AgentState::Unbound;
                Err(AcpError::AgentExited("its connection closed".into()))
            }
        }
    }

    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag - 1
    }

    async fn cancel(&mut self) {
        self.cancel_requested = true;
        if let AgentState::Bound { agent, agent_sid } = &self.agent {
            let params = json!({ "sessionId": agent_sid });
            let _ = agent.peer.notify("session/cancel", Some(params)).await;
        }
        // The client must answer pending permission requests `cancelled`; acpd does it for
        // the clients it relayed them to, and withdraws them there.
        for p in self.pending.take_permissions() {
            p.answer_cancelled().await;
        }
    }

    async fn close(&mut self, responder: Responder, delete: bool) {
        // Closing cancels the running turn as `session/cancel` would.
        if self
            .inflight
            .values()
            .any(|f| matches!(f, Inflight::Prompt { .. }))
        {
            self.cancel().await;
        }
        for (_, f) in self.inflight.drain() {
            if let Inflight::Prompt { responder } = f {
                self.outbox.push(Out::Reply {
                    responder,
                    result: Ok(json!({ "stopReason": "cancelled" })),
                });
            }
        }
        let method = if delete {
            "session/delete"
        } else {
            "session/close"
        };
        if let AgentState::Bound { agent, agent_sid } = &self.agent {
            let supported = if delete {
                agent.supports_delete()
            } else {
                agent.supports_close()
            };
            if supported {
                let _ = agent
                    .request_in_band(method, json!({ "sessionId": agent_sid }), &self.id, 0)
                    .await;
            }
            agent.unregister(&self.id);
        }
        self.agent = AgentState::Unbound;
        for p in self.pending.drain() {
            p.answer_cancelled().await;
        }
        let result = if delete {
            self.shared.store.delete_session(&self.id).await.map(|_| ())
        } else {
            self.shared
                .store
                .update_session(
                    &self.id,
                    &SessionPatch {
                        closed: Some(true),
                        ..self.patch()
                    },
                )
                .await
        };
        let reply = result
            .map(|_| json!({}))
            .map_err(|e| AcpError::from(e).into());
        self.outbox.push(Out::Reply {
            responder,
            result: reply,
        });
        self.ending = true;
    }

    async fn on_agent_event(&mut self, ev: AgentEvent) {
        match ev {
            AgentEvent::Notification { method, params } => {
                if matches!(self.agent, AgentState::Restoring { .. }) {
                    // The agent replaying its own history: acpd's journal already has it.
                    return;
                }
                if method == "session/update" {
                    self.journal(params, None).await;
                } else {
                    let params = with_session_id(params, &self.id);
                    let text =
                        json!({ "jsonrpc": "2.0", "method": method, "params": params }).to_string();
                    self.outbox.push(Out::Raw(text.into()));
                }
            }
            AgentEvent::Request(req) => {
                if matches!(self.agent, AgentState::Restoring { .. }) {
                    req.responder
                        .respond(Err(ResponseError::internal(
                            "the session is being restored",
                        )))
                        .await;
                    return;
                }
                let params = req.params.unwrap_or(Value::Null);
                // Rewrite the agent's session id; a request without one stays without.
                let params = if params.get("sessionId").is_some() {
                    with_session_id(params, &self.id)
                } else {
                    params
                };
                let deadline = Instant::now() + self.shared.settings.pending_request_timeout;
                let id =
                    self.pending
                        .insert(Pending::new(req.method, params, req.responder, deadline));
                self.outbox.push(Out::Request(id));
            }
            AgentEvent::Response { tag, result } => match self.inflight.remove(&tag) {
                Some(Inflight::Prompt { responder }) => {
                    let result = match result {
                        Err(_) if self.cancel_requested => Ok(json!({ "stopReason": "cancelled" })),
                        r => r,
                    };
                    let reason = match &result {
                        Ok(v) => v
                            .get("stopReason")
                            .and_then(Value::as_str)
                            .unwrap_or("unknown")
                            .to_owned(),
                        Err(_) => "error".to_owned(),
                    };
                    metrics::counter!(crate::metrics::PROMPTS_TOTAL, "stop_reason" => reason)
                        .increment(1);
                    self.save(self.patch()).await;
                    self.outbox.push(Out::Reply { responder, result });
                    self.retention();
                }
                Some(Inflight::Relay { responder }) => {
                    self.outbox.push(Out::Reply { responder, result })
                }
                Some(Inflight::Restore(step)) => self.restore_done(step, result).await,
                None => {}
            },
            AgentEvent::Exited { status } => self.agent_exited(status).await,
        }
    }

    async fn agent_exited(&mut self, status: String) {
        tracing::warn!(session = %self.id, %status, "agent exited under the session");
        let was_restoring = matches!(self.agent, AgentState::Restoring { .. });
        self.agent = AgentState::Unbound;
        let cancelled = self.cancel_requested;
        for (_, f) in self.inflight.drain() {
            match f {
                Inflight::Prompt { responder } => {
                    let result = if cancelled {
                        Ok(json!({ "stopReason": "cancelled" }))
                    } else {
                        Err(AcpError::AgentExited(status.clone()).into())
                    };
                    self.outbox.push(Out::Reply { responder, result });
                }
                Inflight::Relay { responder } => {
                    self.outbox.push(Out::Reply {
                        responder,
                        result: Err(AcpError::AgentExited(status.clone()).into()),
                    });
                }
                Inflight::Restore(_) => {}
            }
        }
        if was_restoring {
            self.restore_failed(format!("the agent exited ({status})"))
                .await;
        }
        for p in self.pending.drain() {
            p.withdraw();
        }
    }

    async fn on_task(&mut self, done: TaskDone) {
        match done {
            TaskDone::AgentReady(Ok(agent)) => self.restore_step(agent, None).await,
            TaskDone::Retention(r) => {
                self.compacting = false;
                if self.retention_wanted {
                    self.retention();
                }
                match r {
                    Ok(Some(o)) => tracing::info!(
                        session = %self.id,
                        before = o.before,
                        after = o.after,
                        dropped_oldest = o.dropped_oldest,
                        "journal compacted"
                    ),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(session = %self.id, error = %e, "journal retention failed")
                    }
                }
            }
            TaskDone::AgentReady(Err(e)) => {
                self.agent = AgentState::Unbound;
                let err: ResponseError = AcpError::Agent(e).into();
                while let Some(cmd) = self.deferred.pop_front() {
                    cmd.reject(err.clone()).await;
                }
            }
            TaskDone::ClientAnswer {
                pending,
                conn,
                result,
            } => match result {
                Err(PeerError::Disconnected) => {
                    // That client went away: the request waits for the next one.
                    self.pending
                        .unassign(pending, self.shared.settings.pending_request_timeout);
                    if let Some(next) = self.outbox.pick_client(None).filter(|c| *c != conn) {
                        self.dispatch(pending, Some(&next));
                    }
                }
                Ok(v) => {
                    if let Some(outcome) = v
                        .get("outcome")
                        .filter(|_| self.pending.is_permission(pending))
                    {
                        tracing::info!(target: "acpd::audit", session = %self.id, conn = %conn, %outcome, "permission decision");
                    }
                    self.pending.answer(pending, Ok(v)).await
                }
                Err(PeerError::Remote(e)) => self.pending.answer(pending, Err(e)).await,
            },
        }
    }

    /// Starts a retention pass after a turn, unless one is running or no cap is set.
    fn retention(&mut self) {
        let (entries, bytes) = (
            self.shared.settings.journal_max_entries,
            self.shared.settings.journal_max_bytes,
        );
        if entries == 0 && bytes == 0 {
            return;
        }
        // One pass at a time; a turn that ends during a pass gets another pass after it.
        self.retention_wanted = true;
        if self.compacting {
            return;
        }
        self.compacting = true;
        self.retention_wanted = false;
        let (store, id) = (self.shared.store.clone(), self.id.clone());
        // Compact what the turns wrote once it is all committed.
        let (mut durable, upto) = (self.durable_rx.clone(), self.next_seq - 1);
        self.tasks.spawn(async move {
            let _ = durable.wait_for(|d| *d >= upto).await;
            TaskDone::Retention(super::retention::enforce(store, id, entries, bytes).await)
        });
    }

    /// Relays a pending agent request to a client, if one is attached.
    fn dispatch(&mut self, id: u64, prefer: Option<&ConnId>) {
        let target = prefer
            .cloned()
            .or_else(|| self.outbox.pick_client(self.turn_conn.as_ref()));
        let Some(client) = target.and_then(|c| self.outbox.client(&c)) else {
            return;
        };
        let Some((method, params)) = self.pending.assign(id, client.conn.clone()) else {
            return;
        };
        let conn = client.conn.clone();
        let peer = client.peer.clone();
        let abort = self.tasks.spawn(async move {
            let result = peer.request(&method, Some(params)).await;
            TaskDone::ClientAnswer {
                pending: id,
                conn,
                result,
            }
        });
        self.pending.set_abort(id, abort);
    }

    async fn expire_pending(&mut self) {
        for p in self.pending.take_expired(Instant::now()) {
            tracing::info!(session = %self.id, method = %p.method, "agent request expired with no client attached");
            p.answer_cancelled().await;
        }
    }

    /// Journals one `session/update` and queues it for the attached clients.
    async fn journal(&mut self, params: Value, exclude: Option<ConnId>) {
        let Value::Object(mut params) = params else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        params.insert("sessionId".into(), Value::String(self.id.to_string()));
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["acpd"] = json!({ "seq": seq });
        let kind = params
            .get("update")
            .and_then(|u| u.get("sessionUpdate"))
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned();
        self.observe(&kind, &params).await;
        let text: Arc<str> =
            json!({ "jsonrpc": "2.0", "method": "session/update", "params": params })
                .to_string()
                .into();
        let entry = NewEntry {
            session_id: self.id.clone(),
            seq,
            kind: kind.into(),
            body: text.clone(),
            at_ms: now_ms(),
        };
        if let Err(e) = self.shared.store.append(entry, self.durable.clone()).await {
            tracing::error!(session = %self.id, seq, error = %e, "journal append failed");
        }
        self.outbox.push(Out::Update { seq, text, exclude });
    }

    /// Keeps the session row in step with updates that change it.
    async fn observe(&mut self, kind: &str, params: &serde_json::Map<String, Value>) {
        let update = params.get("update");
        let field = |k: &str| update.and_then(|u| u.get(k));
        match kind {
            "session_info_update" => {
                if let Some(t) = field("title") {
                    let title = t.as_str().map(str::to_owned);
                    self.row.title = title.clone();
                    self.save(SessionPatch {
                        title: Some(title),
                        ..self.patch()
                    })
                    .await;
                }
            }
            "current_mode_update" => {
                if let Some(m) = field("currentModeId").and_then(Value::as_str) {
                    if let Some(modes) = self.meta.get_mut("modes").filter(|m| m.is_object()) {
                        modes["currentModeId"] = json!(m);
                    }
                    let patch = SessionPatch {
                        mode_id: Some(Some(m.to_owned())),
                        meta: Some(self.meta.to_string()),
                        ..self.patch()
                    };
                    self.save(patch).await;
                }
            }
            "config_option_update" => {
                if let Some(opts) = field("configOptions") {
                    self.meta["configOptions"] = opts.clone();
                    self.save(SessionPatch {
                        meta: Some(self.meta.to_string()),
                        ..self.patch()
                    })
                    .await;
                }
            }
            _ => {}
        }
    }

    fn patch(&self) -> SessionPatch {
        SessionPatch {
            updated_at_ms: now_ms(),
            ..Default::default()
        }
    }

    async fn save(&mut self, patch: SessionPatch) {
        if let Err(e) = self.shared.store.update_session(&self.id, &patch).await {
            tracing::error!(session = %self.id, error = %e, "cannot update the session row");
        }
    }

    async fn flush(&mut self) {
        let durable = *self.durable_rx.borrow_and_update();
        for id in self.outbox.flush(durable).await {
            self.dispatch(id, None);
        }
    }
}

fn needs_agent(cmd: &SessionCommand) -> bool {
    match cmd {
        SessionCommand::Prompt { .. } | SessionCommand::Relay { .. } => true,
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

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

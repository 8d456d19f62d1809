//! The router of one hosted agent: owns the map from the agent's session ids to session
//! actors and forwards what the agent sends, never waiting on one session.
//!
//! Each route has a bounded backlog for what its session has no room for yet, drained by a
//! permit task as the session takes events. A session never waits on a client, so it falls
//! behind only when the journal (the store, shared by every session) is slower than the agent
//! streams: then the router stops reading the agent's stdout while a backlog is over
//! `PAUSE_AT` — the agent is slowed to what the store can keep, nothing is dropped — and reads
//! on below `RESUME_AT`. A session that takes nothing for `ROUTE_STALL` while its backlog is
//! full is told the agent is gone for it (it re-creates its agent side on its next command),
//! so one stuck session never holds the agent's other sessions for long.
//!
//! Across sessions the router holds no more than `held::HELD_MAX` updates of the agent at a
//! time: at that count it stops reading the agent until the sessions have taken half, so
//! with a thousand sessions streaming the agent waits in its pipe, not behind a thousand
//! queues (`held.rs`). A session that takes nothing for `ROUTE_STALL` while the router waits
//! so is cut the same way.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::held::{Held, HeldOutput};
use super::{EARLY_LIMIT, KILL_GRACE, Process, RouterCommand};
use crate::agent::AgentEvent;
use acpd_wire::{Incoming, RawNotification, ResponseError};

mod over;
#[cfg(test)]
mod tests;

use over::Over;

/// Events held for one session before the agent's stdout is no longer read (its own queue
/// holds 1024 more).
const PAUSE_AT: usize = 8192;
/// Reading goes on once every backlog is below this.
const RESUME_AT: usize = 4096;
/// How long a session over `PAUSE_AT` may take nothing before it is detached from the agent.
const ROUTE_STALL: Duration = Duration::from_secs(10);
/// Most messages of the agent routed in one pass of the router's loop.
const ROUTE_BURST: usize = 256;

/// One session as the router sees it.
struct Route {
    tx: mpsc::Sender<AgentEvent>,
    /// What the session had no room for yet, in order; a permit task waits for room.
    backlog: VecDeque<AgentEvent>,
    /// Which registration of the route this is (a permit is for one registration's channel).
    generation: u64,
    /// When the session last took an event from its backlog (or the backlog started).
    moved_at: Instant,
    /// The agent's id of the session, its key in `by_agent_sid`: so a route leaves that map
    /// without a scan of every session of the agent.
    agent_sid: Option<String>,
}

/// A permit task's result: room for one event on a route's channel.
type Room = (
    String,
    u64,
    Result<mpsc::OwnedPermit<AgentEvent>, SendError<()>>,
);

pub(super) struct Router {
    agent: String,
    tasks: TaskTracker,
    /// acpd session id -> its actor.
    routes: HashMap<String, Route>,
    /// One permit task per route with a backlog.
    waits: JoinSet<Room>,
    /// Registrations so far.
    registrations: u64,
    /// The agent's session id -> acpd session id.
    by_agent_sid: HashMap<String, String>,
    /// The session the agent spoke about last: where a request without a `sessionId` (an
    /// extension method, say) most likely belongs.
    last_route: Option<String>,
    /// Messages for session ids not registered yet (the agent spoke before its response).
    early: HashMap<String, Vec<AgentEvent>>,
    /// Answers to in-band requests of routes not registered yet, by route. A session registers
    /// before it asks, but the registration and the answer come on different queues: a busy
    /// router can find both ready and take the answer first, and a registration sent from a
    /// task (`AgentHandle::to_router`, full queue) can come after it.
    answers: HashMap<String, Vec<AgentEvent>>,
    /// URL-mode elicitations by `elicitationId` -> the session that relayed them: their
    /// `elicitation/complete` names no session.
    elicitations: HashMap<String, String>,
    /// Routes whose backlog is over `PAUSE_AT`: while any is, the agent's stdout is not read.
    over: Over,
    /// The agent's updates handed to sessions and not taken yet.
    held: HeldOutput,
    /// Since when `held` is full and the agent's stdout is not read.
    starved: Option<Instant>,
}

impl Router {
    pub(super) fn new(agent: &str, tasks: TaskTracker) -> Router {
        Router {
            agent: agent.to_owned(),
            tasks,
            routes: HashMap::new(),
            waits: JoinSet::new(),
            registrations: 0,
            by_agent_sid: HashMap::new(),
            last_route: None,
            early: HashMap::new(),
            answers: HashMap::new(),
            elicitations: HashMap::new(),
            over: Over::default(),
            held: HeldOutput::default(),
            starved: None,
        }
    }

    pub(super) async fn run(
        mut self,
        mut process: Process,
        mut incoming: mpsc::Receiver<Incoming>,
        mut commands: mpsc::Receiver<RouterCommand>,
        exited: CancellationToken,
        io_cancel: CancellationToken,
        shutdown: CancellationToken,
    ) {
        metrics::gauge!(crate::metrics::AGENT_PROCESSES).increment(1);
        // One clock for the stall check: a sleep made afresh each turn of the loop would be
        // pushed back by every other event (another session's room, say) and never fire.
        let mut stall_check = tokio::time::interval(ROUTE_STALL / 4);
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let status = loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    process.kill().await;
                    break "acpd shut down".to_owned();
                }
                status = process.wait() => {
                    // What the agent wrote before it died still counts: route it before
                    // telling sessions it is gone (bounded: a grandchild may hold stdout).
                    let drain = async {
                        while let Some(m) = incoming.recv().await {
                            self.route(m);
                        }
                    };
                    let _ = tokio::time::timeout(KILL_GRACE, drain).await;
                    break status;
                }
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    // Every handle is gone: nobody can use this agent any more.
                    None => {
                        process.kill().await;
                        break "no longer used".to_owned();
                    }
                },
                Some(Ok((route, generation, room))) = self.waits.join_next() => {
                    self.on_room(route, generation, room)
                }
                _ = self.held.room(), if self.starved.is_some() => {
                    if !self.held.full() {
                        self.starved = None;
                    }
                }
                _ = stall_check.tick(), if !self.over.is_empty() || self.starved.is_some() => {
                    self.detach_stalled()
                }
                msg = incoming.recv(), if self.over.is_empty() && self.starved.is_none() => match msg {
                    Some(m) => self.route_burst(m, &mut incoming),
                    None => break stdout_closed(&mut process).await,
                },
            }
        };
        tracing::warn!(agent = %self.agent, %status, "agent process ended");
        metrics::counter!(crate::metrics::AGENT_EXITS_TOTAL).increment(1);
        metrics::gauge!(crate::metrics::AGENT_PROCESSES).decrement(1);
        exited.cancel();
        io_cancel.cancel();
        self.tell_sessions(status);
    }

    fn on_command(&mut self, cmd: RouterCommand) {
        match cmd {
            RouterCommand::Register {
                route,
                agent_session_id,
                events,
            } => self.register(route, agent_session_id, events),
            RouterCommand::Active { route } => self.last_route = Some(route),
            RouterCommand::Unregister { route, events } => {
                if !self
                    .routes
                    .get(&route)
                    .is_some_and(|r| r.tx.same_channel(&events))
                {
                    return;
                }
                if let Some(r) = self.routes.remove(&route) {
                    self.forget_agent_sid(&route, r.agent_sid);
                }
                self.over.remove(&route);
            }
        }
    }

    /// Routes a message from the agent, and what else is ready with it: one pass of the loop
    /// per burst.
    fn route_burst(&mut self, first: Incoming, incoming: &mut mpsc::Receiver<Incoming>) {
        self.route(first);
        for _ in 1..ROUTE_BURST {
            if !self.over.is_empty() || self.held.full() {
                break;
            }
            match incoming.try_recv() {
                Ok(m) => self.route(m),
                Err(_) => break,
            }
        }
        if self.held.full() && self.starved.is_none() {
            self.starved = Some(Instant::now());
        }
    }

    /// The agent ended with `status`: every session hears of it.
    fn tell_sessions(&mut self, status: String) {
        self.waits.abort_all();
        // Each session gets what is held for it, then the news; a task each, so no session
        // waits for another.
        for (_, route) in self.routes.drain() {
            let status = status.clone();
            self.tasks.spawn(async move {
                for ev in route.backlog {
                    if route.tx.send(ev).await.is_err() {
                        return;
                    }
                }
                let _ = route.tx.send(AgentEvent::Exited { status }).await;
            });
        }
    }

    /// Hands an event to a session without waiting: straight into its queue when there is
    /// room and nothing is held for it, else behind what is held.
    fn deliver(&mut self, route: &str, mut ev: AgentEvent) {
        let Some(r) = self.routes.get_mut(route) else {
            return;
        };
        if let AgentEvent::Notification(_, share) = &mut ev {
            *share = self.held.hold();
        }
        if !r.backlog.is_empty() {
            r.backlog.push_back(ev);
            if r.backlog.len() >= PAUSE_AT && self.over.insert(route) {
                tracing::info!(agent = %self.agent, session = %route, "a session is behind its agent (the journal is slower than the agent streams); pausing the agent's output");
            }
            return;
        }
        match r.tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(ev)) => {
                r.backlog.push_back(ev);
                r.moved_at = Instant::now();
                self.wait_for_room(route);
            }
            // The session ended; its Unregister is on the way.
            Err(TrySendError::Closed(_)) => {}
        }
    }

    fn wait_for_room(&mut self, route: &str) {
        let Some(r) = self.routes.get(route) else {
            return;
        };
        let (tx, route, generation) = (r.tx.clone(), route.to_owned(), r.generation);
        self.waits
            .spawn(async move { (route, generation, tx.reserve_owned().await) });
    }

    /// Room on a route: what is held for it goes, as far as there is room.
    fn on_room(
        &mut self,
        route: String,
        generation: u64,
        room: Result<mpsc::OwnedPermit<AgentEvent>, SendError<()>>,
    ) {
        let Some(r) = self.routes.get_mut(&route) else {
            return;
        };
        // A permit for an earlier registration's channel: wait on the current one.
        if generation != r.generation {
            drop(room);
            if !r.backlog.is_empty() {
                self.wait_for_room(&route);
            }
            return;
        }
        let Ok(permit) = room else {
            r.backlog.clear();
            return;
        };
        let Some(ev) = r.backlog.pop_front() else {
            return;
        };
        permit.send(ev);
        r.moved_at = Instant::now();
        let mut more = false;
        while let Some(ev) = r.backlog.pop_front() {
            match r.tx.try_send(ev) {
                Ok(()) => {}
                Err(TrySendError::Full(ev)) => {
                    r.backlog.push_front(ev);
                    more = true;
                    break;
                }
                Err(TrySendError::Closed(_)) => {
                    r.backlog.clear();
                    break;
                }
            }
        }
        if r.backlog.len() < RESUME_AT {
            self.over.remove(&route);
        }
        if more {
            self.wait_for_room(&route);
        }
    }

    /// Detaches the sessions over `PAUSE_AT` that took nothing for `ROUTE_STALL`, and when the
    /// agent has not been read for `ROUTE_STALL` because `held` is full, the session holding
    /// the most of it.
    fn detach_stalled(&mut self) {
        if self.starved.is_some_and(|t| t.elapsed() >= ROUTE_STALL) {
            let most = self
                .routes
                .iter()
                .max_by_key(|(_, r)| queued(r) + r.backlog.len());
            if let Some((route, r)) = most {
                // Its queue's shares may never be given back: no longer counted.
                self.held.forget(queued(r));
                let route = route.clone();
                self.overflow(&route);
            }
            self.starved = self.held.full().then(Instant::now);
        }
        let stalled: Vec<String> = self
            .over
            .iter()
            .filter(|r| {
                self.routes
                    .get(*r)
                    .is_none_or(|r| r.moved_at.elapsed() >= ROUTE_STALL)
            })
            .cloned()
            .collect();
        for route in stalled {
            self.overflow(&route);
        }
    }

    /// A session that takes nothing while its agent waits: what is held for it is dropped
    /// and it is told the agent is gone for it (it re-creates its agent side on its next
    /// command), so the agent's other sessions go on.
    fn overflow(&mut self, route: &str) {
        // Counted before it is logged: whoever reads the log finds it counted.
        metrics::counter!(crate::metrics::SESSIONS_CUT_FROM_AGENT_TOTAL).increment(1);
        self.over.remove(route);
        tracing::error!(agent = %self.agent, session = %route, "a session took nothing from its agent for {ROUTE_STALL:?}; detaching it from the agent");
        if let Some(mut r) = self.routes.remove(route) {
            self.forget_agent_sid(route, r.agent_sid.take());
            let status = "the session stopped taking the agent's output".to_owned();
            self.tasks.spawn(async move {
                let _ = r.tx.send(AgentEvent::Exited { status }).await;
            });
        }
    }

    /// A session's (re-)registration: a new channel; what was held for its earlier
    /// registration still goes first, and so does what the agent said about its id before.
    fn register(
        &mut self,
        route: String,
        agent_session_id: Option<String>,
        events: mpsc::Sender<AgentEvent>,
    ) {
        let (backlog, mut agent_sid) = match self.routes.remove(&route) {
            Some(r) => (r.backlog, r.agent_sid),
            None => (VecDeque::new(), None),
        };
        let waiting = !backlog.is_empty();
        if let Some(asid) = &agent_session_id
            && agent_sid.as_ref() != Some(asid)
        {
            self.forget_agent_sid(&route, agent_sid.take());
        }
        self.registrations += 1;
        self.routes.insert(
            route.clone(),
            Route {
                tx: events,
                backlog,
                generation: self.registrations,
                moved_at: Instant::now(),
                agent_sid: agent_session_id.clone().or(agent_sid),
            },
        );
        if waiting {
            self.wait_for_room(&route);
        }
        if let Some(asid) = agent_session_id {
            for ev in self.early.remove(&asid).unwrap_or_default() {
                self.deliver(&route, ev);
            }
            self.by_agent_sid.insert(asid, route.clone());
        }
        // After what the agent said of the session before answering: wire order.
        for ev in self.answers.remove(&route).unwrap_or_default() {
            self.deliver(&route, ev);
        }
    }

    /// Drops `route`'s entry of `by_agent_sid`, unless the agent's id now names another
    /// session.
    fn forget_agent_sid(&mut self, route: &str, agent_sid: Option<String>) {
        if let Some(asid) = agent_sid
            && self.by_agent_sid.get(&asid).is_some_and(|r| r == route)
        {
            self.by_agent_sid.remove(&asid);
        }
    }

    fn route(&mut self, msg: Incoming) {
        let r = match msg {
            Incoming::Response {
                route,
                tag,
                mut result,
            } => {
                // The box the peer delivered it in goes on in the event: the error is reworded
                // in place (`Null` only holds the slot meanwhile).
                let taken = std::mem::replace(&mut *result, Ok(Value::Null));
                *result = taken.map_err(|e| crate::agent::login::auth_hint(e, &self.agent));
                let answer = AgentEvent::Response { tag, result };
                if self.routes.contains_key(&route) {
                    self.deliver(&route, answer);
                } else {
                    hold(&mut self.answers, route.clone(), answer);
                }
                self.last_route = Some(route);
                return;
            }
            Incoming::Notification(n) => return self.route_notification(n),
            Incoming::Request(r) => r,
        };
        // Boxed by the peer already: the events carry that box on.
        if r.method == acpd_protocol::method::ELICITATION_CREATE {
            self.note_elicitation(&r);
        }
        let Some(sid) = r.params.as_ref().and_then(session_id_of) else {
            let target = self
                .last_route
                .clone()
                .filter(|route| self.routes.contains_key(route));
            match target {
                Some(route) => self.deliver(&route, AgentEvent::Request(r)),
                None => {
                    tracing::debug!(agent = %self.agent, method = %r.method, "agent request with no session to route it to");
                    let e = ResponseError::method_not_found(&r.method);
                    // Answered on the agent's link; a task, so the router never waits.
                    self.tasks.spawn(r.responder.respond(Err(e)));
                }
            }
            return;
        };
        if self.aim(&sid) {
            self.deliver_last(AgentEvent::Request(r));
        } else {
            hold(&mut self.early, sid, AgentEvent::Request(r));
        }
    }

    /// The hot path: an update's `sessionId` is read off the member spans the peer found, and
    /// looked up borrowed; nothing is allocated unless the session is not registered yet.
    fn route_notification(&mut self, n: RawNotification) {
        let Some(sid) = notification_session_id(&n) else {
            if let Some(route) = self.elicitation_of(&n) {
                return self.deliver(&route, AgentEvent::Notification(n, Held::none()));
            }
            tracing::debug!(agent = %self.agent, "agent notification without a sessionId dropped");
            return;
        };
        if self.aim(&sid) {
            self.deliver_last(AgentEvent::Notification(n, Held::none()));
        } else {
            let sid = sid.into_owned();
            hold(
                &mut self.early,
                sid,
                AgentEvent::Notification(n, Held::none()),
            );
        }
    }

    /// Remembers which session a URL-mode elicitation goes to (bounded, like `early`).
    fn note_elicitation(&mut self, r: &acpd_wire::IncomingRequest) {
        let params = r.params.as_ref();
        let Some(id) = params
            .and_then(|p| p.get("elicitationId"))
            .and_then(Value::as_str)
        else {
            return;
        };
        let route = match params.and_then(session_id_of) {
            Some(sid) => self.by_agent_sid.get(&sid).cloned(),
            None => self.last_route.clone(),
        };
        if let Some(route) = route {
            if self.elicitations.len() > EARLY_LIMIT {
                self.elicitations.clear();
            }
            self.elicitations.insert(id.to_owned(), route);
        }
    }

    /// The session an `elicitation/complete` is about (it names its elicitation only).
    fn elicitation_of(&mut self, n: &RawNotification) -> Option<String> {
        if n.method() != acpd_protocol::method::ELICITATION_COMPLETE {
            return None;
        }
        let params = n.params_value()?;
        let id = params.get("elicitationId")?.as_str()?;
        self.elicitations.remove(id)
    }

    /// Points `last_route` at the session the agent calls `agent_sid`; false when no
    /// registered session has that id (yet).
    fn aim(&mut self, agent_sid: &str) -> bool {
        let routes = &self.routes;
        let Some(route) = self
            .by_agent_sid
            .get(agent_sid)
            .filter(|r| routes.contains_key(*r))
        else {
            return false;
        };
        // Set only when it changes: a streaming turn allocates nothing here.
        if self.last_route.as_ref() != Some(route) {
            self.last_route = Some(route.clone());
        }
        true
    }

    /// Delivers to `last_route` (borrowed out of it while delivering, not cloned).
    fn deliver_last(&mut self, event: AgentEvent) {
        let last = self.last_route.take();
        if let Some(route) = &last {
            self.deliver(route, event);
        }
        self.last_route = last;
    }
}

/// Keeps `event` for `key` until it is registered, within `EARLY_LIMIT` keys and events each
/// (a key that never registers must not grow the map for ever).
fn hold(held: &mut HashMap<String, Vec<AgentEvent>>, key: String, event: AgentEvent) {
    if held.len() > EARLY_LIMIT {
        held.clear();
    }
    let q = held.entry(key).or_default();
    if q.len() < EARLY_LIMIT {
        q.push(event);
    }
}

/// Events in a route's queue, not taken yet.
fn queued(r: &Route) -> usize {
    r.tx.max_capacity() - r.tx.capacity()
}

/// The `sessionId` of an agent's notification: from the member spans the peer found when it
/// read the frame, or for params it could not index, a scan that stops at that member.
fn notification_session_id(n: &RawNotification) -> Option<Cow<'_, str>> {
    match n.members() {
        Some(m) => m.string("sessionId"),
        None => acpd_wire::str_member(n.params()?, "sessionId"),
    }
}

fn session_id_of(params: &Value) -> Option<String> {
    params
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The agent closed its stdout: its exit status, waited for a little (bounded: it may live on
/// with its stdout closed).
async fn stdout_closed(process: &mut Process) -> String {
    match tokio::time::timeout(KILL_GRACE, process.wait()).await {
        Ok(s) => s,
        Err(_) => {
            process.kill().await;
            "closed its stdout".to_owned()
        }
    }
}

//! A session's outbox: what is owed to attached clients, in order, released only once
//! durable (write-before-send) and not while a bootstrap hold is on.
//!
//! Each attached client is sent to through its connection's own bounded queue (the `Peer`'s,
//! `try_send_raw`, no task of the session's in between), so the session actor never waits on
//! a socket. A client whose queue fills (the agent streams faster than the
//! client reads) *lags*: live updates skip it and it is fed from the journal instead, a page at
//! a time as its queue drains, with its other messages held back in order until it has caught
//! up. Memory stays bounded, the agent is never slowed, and every other client and session goes
//! on. A lagging client that takes nothing off its queue for `slow_client_cutoff` (a setting)
//! is cut off (it can reconnect and replay from the journal).
//!
//! An agent's request relayed to a client (`ask`) takes the same path as its updates and
//! answers, so it never overtakes an update the agent sent before it, live, lagging or on
//! re-attach.
//!
//! `session/load` and `_acpd/session/attach` replay through the same path: the client starts
//! out lagging behind `after`, is fed journal pages by tasks as its queue drains, and the
//! answer to its request is held behind the replay. A connection has one queue for as long as
//! it lives, re-attaches included, so its frames never interleave; an attach never sends it a seq twice (a load replays
//! the whole history again, formed by `compaction::Replay`: merged, the state after it).
//!
//! A `session/load` replays the history merged per message, then the session's state
//! (commands, mode, config options) once, before its answer; an `_acpd/session/attach` after a
//! seq replays every seq after it, one by one (tests/it
//! `load_resume::load_replays_the_compacted_history_then_the_state_once_and_attach_every_seq`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

mod writer;

use super::capabilities::{self, Need};
use super::{Client, ConnId};
use acpd_store::JournalEntry;
use acpd_wire::{Responder, ResponseError};
use writer::{Cause, ClientOut, Writer, reply};

/// How often lagging clients are looked at (queue drained? stalled?).
const LAG_CHECK: Duration = Duration::from_millis(20);
/// Journal entries read per catch-up page.
pub(super) const CATCH_UP_PAGE: i64 = 2048;

pub(super) enum Out {
    /// A journaled `session/update`; `exclude` already has it (its own prompt). A client
    /// without `need` (`capabilities::Need::of_update`) skips it.
    Update {
        seq: i64,
        text: Arc<str>,
        exclude: Option<ConnId>,
        need: Option<Need>,
    },
    /// A message for every attached client (but `except`, and those without `need`) that is
    /// not journaled.
    Raw {
        text: Arc<str>,
        except: Option<ConnId>,
        need: Option<Need>,
    },
    /// The answer to a client's request, after everything queued before it.
    Reply {
        responder: Responder,
        result: Result<Value, ResponseError>,
    },
    /// An agent request to relay to a client, by pending id.
    Request(u64),
}

pub(super) struct Attached {
    pub client: Client,
    /// The highest seq this client has: what comes after it is replayed from the journal.
    pub after: i64,
    /// The answer to the request that attached it, if any.
    pub reply: Option<(Responder, Result<Value, ResponseError>)>,
    /// The answer goes after the replay (`session/load`, attach) rather than first.
    pub reply_after_replay: bool,
    /// Replay from `after` even what this connection has been sent (a load shows the whole
    /// history again); otherwise a connection is never sent a seq twice.
    pub resend: bool,
    /// Updates are held this long once the answer is out (the bootstrap hold).
    pub hold: Duration,
}

/// A journal page to read for a lagging client: entries after `after`.
pub(super) struct CatchUp {
    pub conn: ConnId,
    pub after: i64,
}

pub(super) struct Outbox {
    items: VecDeque<Out>,
    clients: Vec<Writer>,
    hold_until: Option<Instant>,
    /// The highest update seq that has left `items`.
    flushed_upto: i64,
    /// The last seq journaled before this actor started (a fork's copied history).
    journaled_before: i64,
    /// Answers to detached clients run here, so shutdown waits for them.
    tasks: TaskTracker,
}

impl Outbox {
    /// `journaled`: the last seq journaled before this actor started; it left long ago.
    pub fn new(tasks: TaskTracker, journaled: i64) -> Outbox {
        Outbox {
            items: VecDeque::new(),
            clients: Vec::new(),
            hold_until: None,
            flushed_upto: journaled,
            journaled_before: journaled,
            tasks,
        }
    }

    pub fn push(&mut self, out: Out) {
        self.items.push_back(out);
    }

    /// Nothing is owed: no item waits, and no lagging client holds a message back (a close's
    /// answer held behind a client's catch-up must still reach it before the actor ends).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
            && self
                .clients
                .iter()
                .all(|c| c.lag.as_ref().is_none_or(|l| l.held.is_empty()))
    }

    pub fn clients_len(&self) -> usize {
        self.clients.len()
    }

    pub fn hold_until(&self) -> Option<Instant> {
        self.hold_until
    }

    pub fn release_hold(&mut self) {
        self.hold_until = None;
    }

    /// `conn` prompted this session, so it has registered it: the hold that waits for that
    /// (`hold_for`) has nothing left to wait for, when `conn` is the only client (with others
    /// attached, the hold may be for one of them, and stays). Without this a prompt sent at
    /// once after `session/new` waited out the whole delay for its first update and answer.
    pub fn release_hold_by(&mut self, conn: &ConnId) {
        if let [only] = self.clients.as_slice()
            && only.client.conn == *conn
        {
            self.hold_until = None;
        }
    }

    /// Holds back updates for `d`: Zed drops updates for a session it has not registered,
    /// and it registers a session only some time after the response (zed-industries/zed#60199).
    pub fn hold_for(&mut self, d: Duration) {
        if !d.is_zero() {
            self.hold_until = Some(Instant::now() + d);
        }
    }

    /// Where the creator of this session starts: after what was journaled before its actor
    /// started. Nothing for a new session; a fork's copied history, which its creator has
    /// (it is its parent's), is not sent to it again.
    pub fn creator_from(&self) -> i64 {
        self.journaled_before
    }

    /// Where an attach that asks for live updates only (implicit, resume) starts a
    /// connection: at `current` (the last seq given out) when it is new here; where it is
    /// when it is attached already. Updates still queued for it (held by the bootstrap hold,
    /// or not yet durable) are its own: a `session/prompt` that overtook the connection's
    /// filing of its `session/new` (an implicit attach) must not make it skip them.
    pub fn live_from(&self, conn: &ConnId, current: i64) -> i64 {
        self.writer(conn).map_or(current, |c| c.sent_upto)
    }

    /// The seq an attach after `after` replays up to: the answer `{lastSeq}` of
    /// `_acpd/session/attach`, which never sends a connection a seq twice.
    pub fn replay_upto(&self, conn: &ConnId, after: i64) -> i64 {
        let sent = self.writer(conn).map_or(0, |c| c.sent_upto);
        after.max(sent).max(self.flushed_upto)
    }

    /// Most sessions have one client: the first gets a `Vec` of one (a first `push` makes
    /// room for four, which every live session would hold).
    fn push_client(&mut self, w: Writer) {
        if self.clients.capacity() == 0 {
            self.clients.reserve_exact(1);
        }
        self.clients.push(w);
    }

    /// Adds a client, or updates a connection already attached (what it has been sent stays;
    /// its queue is its connection's, so nothing is reordered), and queues the answer.
    pub fn attach(&mut self, mut a: Attached) {
        let first = if a.reply_after_replay {
            None
        } else {
            a.reply.take()
        };
        let i = match self
            .clients
            .iter()
            .position(|c| c.client.conn == a.client.conn)
        {
            Some(i) => {
                let w = &mut self.clients[i];
                w.client = a.client;
                w.sent_upto = if a.resend {
                    a.after
                } else {
                    w.sent_upto.max(a.after)
                };
                if let Some((responder, result)) = first {
                    let upto = w.sent_upto;
                    w.send_or_hold(upto, ClientOut::Reply(Box::new((responder, result))));
                    self.hold_for(a.hold);
                    return;
                }
                i
            }
            None => {
                let mut w = writer::new(a.client, a.after);
                if let Some((responder, result)) = first {
                    // First, before any catch-up (held if the connection's queue is full).
                    let upto = w.sent_upto;
                    w.send_or_hold(upto, reply(responder, result));
                    self.hold_for(a.hold);
                    // Updates it should get may have left `items` already (a new session's
                    // first update can be durable before its creator is attached).
                    if w.sent_upto < self.flushed_upto {
                        w.start_lag(Cause::Attach);
                    }
                    self.push_client(w);
                    return;
                }
                self.push_client(w);
                self.clients.len() - 1
            }
        };
        // Load or attach: the journal after `after`, then the answer.
        let upto = self.flushed_upto;
        let w = &mut self.clients[i];
        let Some(reply_out) = a.reply.map(|(r, res)| reply(r, res)) else {
            if w.sent_upto < upto && w.lag.is_none() {
                w.start_lag(Cause::Attach);
            }
            return;
        };
        if w.sent_upto >= upto && w.lag.is_none() {
            w.send_or_hold(upto, reply_out);
            self.hold_for(a.hold);
            return;
        }
        let lag = match w.lag.as_mut() {
            Some(l) => &mut **l,
            None => w.start_lag(Cause::Attach),
        };
        lag.held.push_back((upto, reply_out));
        lag.replay = Some((upto, a.hold));
        // A load forms its replay (an attach mid-load leaves the load's form in place).
        if a.resend {
            lag.form = Some(Default::default());
        }
    }

    /// Removes a client; returns it if it was attached.
    pub fn detach(&mut self, conn: &ConnId) -> Option<Client> {
        let i = self.clients.iter().position(|c| &c.client.conn == conn)?;
        Some(self.clients.remove(i).client)
    }

    /// The attached clients, oldest first.
    pub fn clients(&self) -> impl Iterator<Item = &Client> {
        self.clients.iter().map(|c| &c.client)
    }

    pub fn client(&self, conn: &ConnId) -> Option<&Client> {
        self.writer(conn).map(|c| &c.client)
    }

    fn writer(&self, conn: &ConnId) -> Option<&Writer> {
        self.clients.iter().find(|c| &c.client.conn == conn)
    }

    /// Drops the queued updates after `seq`: the journal stopped below them, so they will never
    /// be durable and must never be sent. A reply queued behind a dropped update (a turn's end,
    /// say) would vouch for what is lost: it answers `err` instead. The rest stays, in order.
    pub fn discard_updates_after(&mut self, seq: i64, err: &ResponseError) {
        let mut lost = false;
        self.items.retain_mut(|o| match o {
            Out::Update { seq: s, .. } if *s > seq => {
                lost = true;
                false
            }
            Out::Reply { result, .. } if lost => {
                *result = Err(err.clone());
                true
            }
            _ => true,
        });
    }

    /// Sends everything that may go now, up to the first agent request: returns it to
    /// dispatch (then call again).
    pub async fn flush(&mut self, durable: i64) -> Vec<u64> {
        let mut requests = vec![];
        if self.hold_until.is_some_and(|t| Instant::now() >= t) {
            self.hold_until = None;
        }
        while let Some(front) = self.items.front() {
            if self.hold_until.is_some() {
                break;
            }
            if let Out::Update { seq, .. } = front
                && *seq > durable
            {
                break;
            }
            let Some(item) = self.items.pop_front() else {
                break;
            };
            match item {
                Out::Update {
                    seq,
                    text,
                    exclude,
                    need,
                } => {
                    self.flushed_upto = self.flushed_upto.max(seq);
                    for c in &mut self.clients {
                        // A lagging client gets this from the journal.
                        if c.lag.is_some() || c.sent_upto >= seq {
                            continue;
                        }
                        if exclude.as_ref() != Some(&c.client.conn)
                            && capabilities::allows(need, c.client.caps())
                            && c.queue(ClientOut::Raw(text.clone())).is_err()
                        {
                            c.start_lag(Cause::Behind);
                            continue;
                        }
                        c.sent_upto = seq;
                    }
                }
                Out::Raw { text, except, need } => {
                    let upto = self.flushed_upto;
                    for c in &mut self.clients {
                        if except.as_ref() == Some(&c.client.conn)
                            || !capabilities::allows(need, c.client.caps())
                        {
                            continue;
                        }
                        c.send_or_hold(upto, ClientOut::Raw(text.clone()));
                    }
                }
                Out::Reply { responder, result } => {
                    // Behind what is queued for the client that asked, if it is attached.
                    let upto = self.flushed_upto;
                    match self
                        .clients
                        .iter_mut()
                        .find(|c| responder.is_for(&c.client.peer))
                    {
                        Some(c) => {
                            c.send_or_hold(upto, ClientOut::Reply(Box::new((responder, result))))
                        }
                        None => {
                            self.tasks.spawn(responder.respond(result));
                        }
                    }
                }
                // Dispatched before anything queued after it leaves: the request goes to
                // its clients behind exactly the updates that preceded it.
                Out::Request(id) => {
                    requests.push(id);
                    break;
                }
            }
        }
        requests
    }

    /// Sends an agent's request to `conn`, behind every update that has left `items` (held
    /// in order while the client lags). Dropped when `conn` is not attached (its answer
    /// handle then says the client is gone).
    pub fn ask(&mut self, conn: &ConnId, req: acpd_wire::LaneRequest) {
        let upto = self.flushed_upto;
        if let Some(c) = self.clients.iter_mut().find(|c| &c.client.conn == conn) {
            c.send_or_hold(upto, ClientOut::Request(Box::new(req)));
        }
    }

    /// When the actor should next look at its lagging clients.
    pub fn lag_check_at(&self) -> Option<Instant> {
        self.clients
            .iter()
            .any(|c| c.lag.as_ref().is_some_and(|l| !l.reading))
            .then(|| Instant::now() + LAG_CHECK)
    }

    /// Cuts off lagging clients that stopped reading, and returns the journal pages to read for
    /// those whose queue has drained enough to take one.
    /// `cutoff`: how long a lagging client may hand nothing to its connection.
    pub fn lagging(&mut self, cutoff: Duration) -> Vec<CatchUp> {
        let mut reads = vec![];
        let mut stalled = vec![];
        for c in &mut self.clients {
            let Some(lag) = c.lag.as_mut() else { continue };
            let taken = c.client.peer.taken();
            if taken != lag.taken {
                lag.taken = taken;
                lag.moved_at = Instant::now();
            } else if lag.moved_at.elapsed() > cutoff {
                stalled.push(c.client.conn.clone());
                continue;
            }
            let drained = c.client.peer.queue_half_empty();
            // Catch-up obeys the bootstrap hold like live updates do, except a replay whose
            // answer is still to come (the hold starts after that answer).
            let held = self.hold_until.is_some() && lag.replay.is_none();
            if !lag.reading && drained && !held {
                lag.reading = true;
                lag.read_upto = self.flushed_upto;
                reads.push(CatchUp {
                    conn: c.client.conn.clone(),
                    after: c.sent_upto,
                });
            }
        }
        for conn in stalled {
            if let Some(c) = self.clients.iter().find(|c| c.client.conn == conn) {
                tracing::warn!(conn = %conn, "client cannot keep up; disconnecting it (it can reload from the journal)");
                c.client.peer.close();
            }
            // Its connection ends and detaches it from the session as any other would.
            self.detach(&conn);
        }
        reads
    }

    /// Queues a page read from the journal for a lagging client, then what was held for it;
    /// ends the lag once the client is level with the live stream. `complete`: the page is
    /// shorter than asked, so the journal holds nothing more (retention may have merged the
    /// seqs in between away).
    /// `after`: where the read started; a page for an earlier position (the client re-attached
    /// meanwhile) is dropped and read again.
    pub fn caught_up(
        &mut self,
        conn: &ConnId,
        after: i64,
        page: Vec<JournalEntry>,
        complete: bool,
    ) {
        let upto = self.flushed_upto;
        let Some(c) = self.clients.iter_mut().find(|c| &c.client.conn == conn) else {
            return;
        };
        let Some(lag) = c.lag.as_mut() else { return };
        lag.reading = false;
        if after != c.sent_upto {
            return;
        }
        let read_upto = lag.read_upto;
        // Entries not yet flushed live are sent live once the lag ends.
        let past = page.iter().any(|e| e.seq > upto);
        let mut page = page;
        page.retain(|e| e.seq <= upto);
        // A load's replay is formed (`compaction::Replay`); other catch-up goes per seq.
        let (page, formed_upto) = match lag.form.as_mut() {
            Some(form) => {
                let formed = form.page(after, page, past || complete);
                (formed.entries, formed.upto)
            }
            None => (page, after),
        };
        let mut full = false;
        for e in page {
            if e.seq <= c.sent_upto {
                continue;
            }
            // A gated kind the client did not declare is skipped in replay as live.
            if !capabilities::allows(Need::of_update(&e.kind), c.client.caps()) {
                c.sent_upto = e.seq;
                continue;
            }
            if c.queue(ClientOut::Raw(e.body)).is_err() {
                full = true;
                break;
            }
            c.sent_upto = e.seq;
        }
        if !full {
            c.sent_upto = c.sent_upto.max(formed_upto);
            // Nothing is left in the journal up to `upto` (or up to what it had at the read).
            if past {
                c.sent_upto = c.sent_upto.max(upto);
            } else if complete {
                c.sent_upto = c.sent_upto.max(read_upto);
            }
        }
        c.state_after_replay();
        c.release_held();
        let Some(lag) = c.lag.as_mut() else { return };
        let mut hold = None;
        if let Some((at, d)) = lag.replay
            && lag.held.front().is_none_or(|(u, _)| *u > at)
            && c.sent_upto >= at
        {
            lag.replay = None;
            hold = Some(d);
        }
        if c.sent_upto >= upto && lag.held.is_empty() {
            c.lag = None;
        }
        if let Some(d) = hold {
            self.hold_for(d);
        }
    }
}

#[cfg(test)]
mod tests;

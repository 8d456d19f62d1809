//! A session's outbox: what is owed to attached clients, in order, released only once
//! durable (write-before-send) and not while a bootstrap hold is on.
//!
//! Each attached client has its own writer task fed by a bounded queue, so the session actor
//! never waits on a socket. A client whose queue fills (the agent streams faster than the
//! client reads) *lags*: live updates skip it and it is fed from the journal instead, a page at
//! a time as its queue drains, with its other messages held back in order until it has caught
//! up. Memory stays bounded, the agent is never slowed, and every other client and session goes
//! on. A lagging client that takes nothing off its queue for `slow_client_cutoff` (a setting)
//! is cut off (it can reconnect and replay from the journal).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Client, ConnId};
use acpd_wire::{Responder, ResponseError};

/// Messages queued for one client before it counts as too slow and is disconnected.
const CLIENT_QUEUE: usize = 4096;
/// Bytes queued for one client before it counts as too slow.
const CLIENT_QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// How often lagging clients are looked at (queue drained? stalled?).
const LAG_CHECK: Duration = Duration::from_millis(20);
/// Journal entries read per catch-up page.
pub(super) const CATCH_UP_PAGE: i64 = 512;

pub(super) enum Out {
    /// A journaled `session/update`; `exclude` already has it (its own prompt).
    Update {
        seq: i64,
        text: Arc<str>,
        exclude: Option<ConnId>,
    },
    /// A message for every attached client that is not journaled.
    Raw(Arc<str>),
    /// The answer to a client's request, after everything queued before it.
    Reply {
        responder: Responder,
        result: Result<Value, ResponseError>,
    },
    /// An agent request to relay to a client, by pending id.
    Request(u64),
}

/// What a client's writer task sends, in order.
enum ClientOut {
    Raw(Arc<str>),
    /// Boxed: it is the large variant, and full queues hand messages back by value.
    Reply(Box<(Responder, Result<Value, ResponseError>)>),
}

pub(super) struct Attached {
    pub client: Client,
    /// The highest seq this client has been sent (by replay or live).
    pub sent_upto: i64,
}

/// One attached client and its writer task. Dropping it closes the queue: the task sends
/// what is queued (a close or delete answer may be last) and ends; if the connection is gone
/// it ends at the first failed send.
struct Writer {
    client: Client,
    sent_upto: i64,
    tx: mpsc::Sender<ClientOut>,
    /// Counters the writer task updates; only their bounds and movement matter.
    progress: Arc<Progress>,
    /// Set while the client is fed from the journal instead of live.
    lag: Option<Lag>,
}

#[derive(Default)]
struct Progress {
    /// Bytes queued and not yet handed to the connection.
    queued: AtomicUsize,
    /// Messages handed to the connection so far.
    handed: AtomicU64,
}

struct Lag {
    /// `progress.handed` when last looked at, and when it last moved.
    handed: u64,
    moved_at: Instant,
    /// A journal page is being read for this client.
    reading: bool,
    /// Non-journal messages for the client, in order, each after the updates up to its seq.
    held: VecDeque<(i64, ClientOut)>,
}

/// A journal page to read for a lagging client: entries after `after`.
pub(super) struct CatchUp {
    pub conn: ConnId,
    pub after: i64,
}

#[derive(Default)]
pub(super) struct Outbox {
    items: VecDeque<Out>,
    clients: Vec<Writer>,
    hold_until: Option<Instant>,
    /// The highest update seq that has left `items`.
    flushed_upto: i64,
}

impl Outbox {
    pub fn push(&mut self, out: Out) {
        self.items.push_back(out);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
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

    /// Holds back updates for `d`: Zed drops updates for a session it has not registered,
    /// and it registers a session only some time after the response (zed-industries/zed#60199).
    pub fn hold_for(&mut self, d: Duration) {
        if !d.is_zero() {
            self.hold_until = Some(Instant::now() + d);
        }
    }

    /// Adds a client (replacing an earlier attachment of the same connection) and starts its
    /// writer.
    pub fn attach(&mut self, a: Attached) {
        self.clients.retain(|c| c.client.conn != a.client.conn);
        let (tx, mut rx) = mpsc::channel(CLIENT_QUEUE);
        let peer = a.client.peer.clone();
        let progress = Arc::new(Progress::default());
        let p = progress.clone();
        tokio::spawn(async move {
            while let Some(out) = rx.recv().await {
                match out {
                    ClientOut::Raw(text) => {
                        let n = text.len();
                        let ok = peer.send_raw(text.to_string()).await.is_ok();
                        p.queued.fetch_sub(n, Ordering::Relaxed);
                        if !ok {
                            break;
                        }
                    }
                    ClientOut::Reply(reply) => {
                        let (responder, result) = *reply;
                        responder.respond(result).await
                    }
                }
                p.handed.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut w = Writer {
            client: a.client,
            sent_upto: a.sent_upto,
            tx,
            progress,
            lag: None,
        };
        // Updates it should get have already left `items` (a new session's first update can
        // be durable before its creator is attached): it catches up from the journal.
        if w.sent_upto < self.flushed_upto {
            w.start_lag();
        }
        self.clients.push(w);
    }

    pub fn detach(&mut self, conn: &ConnId) {
        self.clients.retain(|c| &c.client.conn != conn);
    }

    /// The client to send an agent request to: `prefer` if attached, else the newest.
    pub fn pick_client(&self, prefer: Option<&ConnId>) -> Option<ConnId> {
        if let Some(p) = prefer
            && self.clients.iter().any(|c| &c.client.conn == p)
        {
            return Some(p.clone());
        }
        self.clients.last().map(|c| c.client.conn.clone())
    }

    pub fn client(&self, conn: &ConnId) -> Option<&Client> {
        self.clients
            .iter()
            .find(|c| &c.client.conn == conn)
            .map(|c| &c.client)
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

    /// Sends everything that may go now; returns the agent requests to dispatch.
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
                Out::Update { seq, text, exclude } => {
                    self.flushed_upto = self.flushed_upto.max(seq);
                    for c in &mut self.clients {
                        // A lagging client gets this from the journal.
                        if c.lag.is_some() || c.sent_upto >= seq {
                            continue;
                        }
                        if exclude.as_ref() != Some(&c.client.conn)
                            && queue_out(&c.tx, &c.progress, ClientOut::Raw(text.clone())).is_err()
                        {
                            c.start_lag();
                            continue;
                        }
                        c.sent_upto = seq;
                    }
                }
                Out::Raw(text) => {
                    let upto = self.flushed_upto;
                    for c in &mut self.clients {
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
                            tokio::spawn(responder.respond(result));
                        }
                    }
                }
                Out::Request(id) => requests.push(id),
            }
        }
        requests
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
            let handed = c.progress.handed.load(Ordering::Relaxed);
            if handed != lag.handed {
                lag.handed = handed;
                lag.moved_at = Instant::now();
            } else if lag.moved_at.elapsed() > cutoff {
                stalled.push(c.client.conn.clone());
                continue;
            }
            let drained = c.tx.capacity() > CLIENT_QUEUE / 2
                && c.progress.queued.load(Ordering::Relaxed) < CLIENT_QUEUE_BYTES / 2;
            // Catch-up obeys the bootstrap hold like live updates do.
            if !lag.reading && drained && self.hold_until.is_none() {
                lag.reading = true;
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
            self.detach(&conn);
        }
        reads
    }

    /// Queues a page read from the journal for a lagging client, then what was held for it;
    /// ends the lag once the client is level with the live stream.
    pub fn caught_up(&mut self, conn: &ConnId, page: Vec<(i64, Arc<str>)>) {
        let upto = self.flushed_upto;
        let Some(c) = self.clients.iter_mut().find(|c| &c.client.conn == conn) else {
            return;
        };
        let Some(lag) = c.lag.as_mut() else { return };
        lag.reading = false;
        for (seq, text) in page {
            // Entries not yet flushed live are sent live once the lag ends.
            if seq <= c.sent_upto || seq > upto {
                continue;
            }
            if queue_out(&c.tx, &c.progress, ClientOut::Raw(text)).is_err() {
                break;
            }
            c.sent_upto = seq;
        }
        c.release_held();
        if c.sent_upto >= upto
            && let Some(lag) = &c.lag
            && lag.held.is_empty()
        {
            c.lag = None;
        }
    }
}

impl Writer {
    fn start_lag(&mut self) -> &mut Lag {
        tracing::info!(conn = %self.client.conn, seq = self.sent_upto, "client lags; feeding it from the journal");
        self.lag.insert(Lag {
            handed: self.progress.handed.load(Ordering::Relaxed),
            moved_at: Instant::now(),
            reading: false,
            held: VecDeque::new(),
        })
    }

    /// Queues a message that is not journaled, or holds it (in order) while the client lags.
    fn send_or_hold(&mut self, upto: i64, out: ClientOut) {
        if let Some(lag) = &mut self.lag {
            lag.held.push_back((upto, out));
        } else if let Err(out) = queue_out(&self.tx, &self.progress, out) {
            self.start_lag().held.push_back((upto, out));
        }
    }

    /// Queues the held messages whose updates the client has been sent.
    fn release_held(&mut self) {
        let Some(lag) = &mut self.lag else { return };
        while let Some((upto, _)) = lag.held.front() {
            if *upto > self.sent_upto {
                break;
            }
            let Some((upto, out)) = lag.held.pop_front() else {
                break;
            };
            if let Err(out) = queue_out(&self.tx, &self.progress, out) {
                lag.held.push_front((upto, out));
                break;
            }
        }
    }
}

/// Queues without waiting unless the queue is full (by count or bytes). A closed queue counts
/// as sent: its connection is gone and the Detach command follows.
fn queue_out(tx: &mpsc::Sender<ClientOut>, p: &Progress, out: ClientOut) -> Result<(), ClientOut> {
    let n = match &out {
        ClientOut::Raw(t) => t.len(),
        ClientOut::Reply(..) => 0,
    };
    if p.queued.load(Ordering::Relaxed) + n > CLIENT_QUEUE_BYTES {
        return Err(out);
    }
    match tx.try_send(out) {
        Ok(()) => {
            p.queued.fetch_add(n, Ordering::Relaxed);
            Ok(())
        }
        Err(mpsc::error::TrySendError::Full(out)) => Err(out),
        Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
    }
}

//! A session's outbox: what is owed to attached clients, in order, released only once
//! durable (write-before-send) and not while a bootstrap hold is on.
//!
//! Each attached client has its own writer task fed by a bounded queue, so the session actor
//! never waits on a socket: a client that cannot keep up fills its queue and is cut off
//! (it reconnects and replays from the journal), while every other client and session goes on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Client, ConnId};
use crate::jsonrpc::{Responder, ResponseError};

/// Messages queued for one client before it counts as too slow and is disconnected.
const CLIENT_QUEUE: usize = 4096;
/// Bytes queued for one client before it counts as too slow.
const CLIENT_QUEUE_BYTES: usize = 8 * 1024 * 1024;

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
    Reply(Responder, Result<Value, ResponseError>),
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
    /// Bytes queued and not yet handed to the connection; the writer task takes off what it
    /// sends. A counter, not shared state: only its bound matters.
    queued: Arc<AtomicUsize>,
}

#[derive(Default)]
pub(super) struct Outbox {
    items: VecDeque<Out>,
    clients: Vec<Writer>,
    hold_until: Option<Instant>,
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
        let queued = Arc::new(AtomicUsize::new(0));
        let sent = queued.clone();
        tokio::spawn(async move {
            while let Some(out) = rx.recv().await {
                match out {
                    ClientOut::Raw(text) => {
                        let n = text.len();
                        let ok = peer.send_raw(text.to_string()).await.is_ok();
                        sent.fetch_sub(n, Ordering::Relaxed);
                        if !ok {
                            break;
                        }
                    }
                    ClientOut::Reply(responder, result) => responder.respond(result).await,
                }
            }
        });
        self.clients.push(Writer {
            client: a.client,
            sent_upto: a.sent_upto,
            tx,
            queued,
        });
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

    /// Sends everything that may go now; returns the agent requests to dispatch.
    pub async fn flush(&mut self, durable: i64) -> Vec<u64> {
        let mut requests = vec![];
        if self.hold_until.is_some_and(|t| Instant::now() >= t) {
            self.hold_until = None;
        }
        let mut slow: Vec<ConnId> = vec![];
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
                    for c in &mut self.clients {
                        if c.sent_upto < seq && exclude.as_ref() != Some(&c.client.conn) {
                            queue(c, ClientOut::Raw(text.clone()), &mut slow);
                        }
                        c.sent_upto = c.sent_upto.max(seq);
                    }
                }
                Out::Raw(text) => {
                    for c in &mut self.clients {
                        queue(c, ClientOut::Raw(text.clone()), &mut slow);
                    }
                }
                Out::Reply { responder, result } => {
                    // Behind what is queued for the client that asked, if it is attached.
                    match self
                        .clients
                        .iter_mut()
                        .find(|c| responder.is_for(&c.client.peer))
                    {
                        Some(c) => queue(c, ClientOut::Reply(responder, result), &mut slow),
                        None => {
                            tokio::spawn(responder.respond(result));
                        }
                    }
                }
                Out::Request(id) => requests.push(id),
            }
        }
        for conn in slow {
            if let Some(c) = self.clients.iter().find(|c| c.client.conn == conn) {
                tracing::warn!(conn = %conn, "client cannot keep up; disconnecting it (it can reload from the journal)");
                c.client.peer.close();
            }
            self.detach(&conn);
        }
        requests
    }
}

/// Queues for one client without waiting; a full queue marks the client slow.
fn queue(c: &mut Writer, out: ClientOut, slow: &mut Vec<ConnId>) {
    let n = match &out {
        ClientOut::Raw(t) => t.len(),
        ClientOut::Reply(..) => 0,
    };
    if c.queued.load(Ordering::Relaxed) + n > CLIENT_QUEUE_BYTES {
        if !slow.contains(&c.client.conn) {
            slow.push(c.client.conn.clone());
        }
        return;
    }
    match c.tx.try_send(out) {
        Ok(()) => {
            c.queued.fetch_add(n, Ordering::Relaxed);
        }
        Err(mpsc::error::TrySendError::Full(_)) => {
            if !slow.contains(&c.client.conn) {
                slow.push(c.client.conn.clone());
            }
        }
        // The writer ended: its connection is gone; the Detach command follows.
        Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

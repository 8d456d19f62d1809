//! A session's outbox: what is owed to attached clients, in order, released only once
//! durable (write-before-send) and not while a bootstrap hold is on.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Client, ConnId};
use crate::jsonrpc::{Responder, ResponseError};

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

pub(super) struct Attached {
    pub client: Client,
    /// The highest seq this client has been sent (by replay or live).
    pub sent_upto: i64,
}

#[derive(Default)]
pub(super) struct Outbox {
    items: VecDeque<Out>,
    clients: Vec<Attached>,
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

    /// Adds a client (replacing an earlier attachment of the same connection).
    pub fn attach(&mut self, a: Attached) {
        self.clients.retain(|c| c.client.conn != a.client.conn);
        self.clients.push(a);
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
                    let mut dead = vec![];
                    for c in &mut self.clients {
                        if c.sent_upto < seq
                            && exclude.as_ref() != Some(&c.client.conn)
                            && c.client.peer.send_raw(text.to_string()).await.is_err()
                        {
                            dead.push(c.client.conn.clone());
                        }
                        c.sent_upto = c.sent_upto.max(seq);
                    }
                    self.clients.retain(|c| !dead.contains(&c.client.conn));
                }
                Out::Raw(text) => {
                    for c in &self.clients {
                        let _ = c.client.peer.send_raw(text.to_string()).await;
                    }
                }
                Out::Reply { responder, result } => responder.respond(result).await,
                Out::Request(id) => requests.push(id),
            }
        }
        requests
    }
}

//! Requests the agent made (permission, fs, terminal, extensions) that wait for a client.
//! Each is relayed to one attached client; if that client goes away it waits for the next,
//! up to a deadline, and it is always answered exactly once.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::ConnId;
use acpd_wire::{Responder, ResponseError};

const PERMISSION: &str = "session/request_permission";

pub(super) struct Pending {
    pub method: String,
    params: Value,
    responder: Responder,
    /// When a request nobody is handling gives up.
    deadline: Instant,
    /// The client it is relayed to, if any.
    assigned: Option<ConnId>,
    /// Aborting the relay task withdraws the request at the client (`$/cancel_request`).
    abort: Option<AbortHandle>,
}

impl Pending {
    pub fn new(method: String, params: Value, responder: Responder, deadline: Instant) -> Pending {
        Pending {
            method,
            params,
            responder,
            deadline,
            assigned: None,
            abort: None,
        }
    }

    /// Ends the request without a client's answer: a permission is `cancelled` (as ACP
    /// requires on cancel), anything else an error. Withdraws it at the client.
    pub async fn answer_cancelled(self) {
        if let Some(a) = &self.abort {
            a.abort();
        }
        let result = if self.method == PERMISSION {
            Ok(json!({ "outcome": { "outcome": "cancelled" } }))
        } else {
            Err(ResponseError::internal(
                "no client answered the request in time",
            ))
        };
        self.responder.respond(result).await;
    }

    /// Withdraws it at the client; the agent that asked is gone.
    pub fn withdraw(self) {
        if let Some(a) = &self.abort {
            a.abort();
        }
    }
}

#[derive(Default)]
pub(super) struct PendingRequests {
    items: BTreeMap<u64, Pending>,
    next: u64,
}

impl PendingRequests {
    pub fn insert(&mut self, p: Pending) -> u64 {
        self.next += 1;
        self.items.insert(self.next, p);
        self.next
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Ids of the requests no client is handling, oldest first.
    pub fn waiting(&self) -> Vec<u64> {
        self.items
            .iter()
            .filter(|(_, p)| p.assigned.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Marks it relayed to `conn`; returns what to send, unless it is already relayed.
    pub fn assign(&mut self, id: u64, conn: ConnId) -> Option<(String, Value)> {
        let p = self.items.get_mut(&id)?;
        if p.assigned.is_some() {
            return None;
        }
        p.assigned = Some(conn);
        Some((p.method.clone(), p.params.clone()))
    }

    pub fn set_abort(&mut self, id: u64, abort: AbortHandle) {
        if let Some(p) = self.items.get_mut(&id) {
            p.abort = Some(abort);
        }
    }

    /// Its client went away: it waits again, with a fresh deadline.
    pub fn unassign(&mut self, id: u64, timeout: std::time::Duration) {
        if let Some(p) = self.items.get_mut(&id) {
            p.assigned = None;
            p.abort = None;
            p.deadline = Instant::now() + timeout;
        }
    }

    pub async fn answer(&mut self, id: u64, result: Result<Value, ResponseError>) {
        if let Some(p) = self.items.remove(&id) {
            p.responder.respond(result).await;
        }
    }

    pub fn is_permission(&self, id: u64) -> bool {
        self.items.get(&id).is_some_and(|p| p.method == PERMISSION)
    }

    pub fn take_permissions(&mut self) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .items
            .iter()
            .filter(|(_, p)| p.method == PERMISSION)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.items.remove(&id))
            .collect()
    }

    pub fn drain(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.items).into_values().collect()
    }

    /// The earliest deadline among requests no client is handling.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.items
            .values()
            .filter(|p| p.assigned.is_none())
            .map(|p| p.deadline)
            .min()
    }

    pub fn take_expired(&mut self, now: Instant) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .items
            .iter()
            .filter(|(_, p)| p.assigned.is_none() && p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.items.remove(&id))
            .collect()
    }
}

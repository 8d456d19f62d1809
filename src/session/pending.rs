//! Requests the agent made (permission, elicitation, fs, terminal, extensions) that wait for
//! a client. A question (permission, elicitation) is relayed to every attached controller
//! that can take it, anything else to one client (`capabilities::route`); who answers is the
//! `claim::Claim`'s decision. If every client asked goes away it waits for the next, up to a
//! deadline (an elicitation does not wait), and it is always answered exactly once.

use crate::error::AcpError;
use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::ConnId;
use super::capabilities::{self, Need};
use super::claim::{Answer, Claim, Step};
use super::roles::PERMISSION;
use acpd_protocol::method::ELICITATION_CREATE;
use acpd_wire::{Responder, ResponseError};

pub(super) struct Pending {
    pub method: String,
    params: Value,
    /// The client capability it needs (`capabilities::Need::of_request`).
    need: Option<Need>,
    responder: Responder,
    /// When a request nobody is handling gives up.
    deadline: Instant,
    /// Who it was sent to and who may still answer.
    claim: Claim,
    /// Aborting a relay task withdraws the request at its client (`$/cancel_request`).
    aborts: Vec<(ConnId, AbortHandle)>,
}

impl Pending {
    pub fn new(method: String, params: Value, responder: Responder, deadline: Instant) -> Pending {
        Pending {
            need: Need::of_request(&method, &params),
            method,
            params,
            responder,
            deadline,
            claim: Claim::default(),
            aborts: Vec::new(),
        }
    }

    fn withdraw_at(&mut self, conns: &[ConnId]) {
        self.aborts.retain(|(c, a)| {
            let gone = conns.contains(c);
            if gone {
                a.abort();
            }
            !gone
        });
    }

    /// Ends the request without a client's answer: a permission is `cancelled` (as ACP
    /// requires on cancel), an elicitation `cancel`, anything else an error. Withdraws it at
    /// the client.
    pub async fn answer_cancelled(self) {
        for (_, a) in &self.aborts {
            a.abort();
        }
        let result = match self.method.as_str() {
            PERMISSION => Ok(json!({ "outcome": { "outcome": "cancelled" } })),
            ELICITATION_CREATE => Ok(json!({ "action": "cancel" })),
            _ => Err(AcpError::NoAnswer.into()),
        };
        // Never awaited: an agent that stops reading must not hold up its session.
        self.responder.respond_now(result);
    }

    /// Ends the request because no attached controller can take it (`capabilities::Route::Refuse`):
    /// an elicitation nobody was asked is `decline`d, one whose clients all left is
    /// `cancel`led; an `fs`/`terminal` request is an error naming the capability.
    fn refuse(self) {
        let result = match (self.method.as_str(), self.need) {
            (ELICITATION_CREATE, _) if self.claim.was_tried_by_anyone() => {
                Ok(json!({ "action": "cancel" }))
            }
            (ELICITATION_CREATE, _) => Ok(json!({ "action": "decline" })),
            (_, need) => Err(AcpError::Undeclared {
                method: self.method.clone(),
                need: need.map_or("", Need::name),
            }
            .into()),
        };
        self.responder.respond_now(result);
    }

    /// Withdraws it at the client; the agent that asked is gone.
    pub fn withdraw(self) {
        for (_, a) in &self.aborts {
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

    pub fn method(&self, id: u64) -> Option<&str> {
        self.items.get(&id).map(|p| p.method.as_str())
    }

    pub fn params(&self, id: u64) -> Option<&Value> {
        self.items.get(&id).map(|p| &p.params)
    }

    /// The client capability it needs.
    pub fn need(&self, id: u64) -> Option<Need> {
        self.items.get(&id).and_then(|p| p.need)
    }

    /// Answers it now, no attached controller being able to (`Pending::refuse`).
    pub fn refuse(&mut self, id: u64) {
        if let Some(p) = self.items.remove(&id) {
            p.refuse();
        }
    }

    /// Some client has it now.
    pub fn is_asked(&self, id: u64) -> bool {
        self.items.get(&id).is_some_and(|p| p.claim.is_asked())
    }

    /// `conn` was sent it once (it is not sent it again).
    pub fn was_tried(&self, id: u64, conn: &ConnId) -> bool {
        self.items.get(&id).is_some_and(|p| p.claim.was_tried(conn))
    }

    /// Every request's id, oldest first.
    pub fn ids(&self) -> Vec<u64> {
        self.items.keys().copied().collect()
    }

    /// Marks it relayed to `conn`; returns what to send, unless `conn` has it already.
    pub fn assign(&mut self, id: u64, conn: ConnId) -> Option<(String, Value)> {
        let p = self.items.get_mut(&id)?;
        if !p.claim.ask(&conn) {
            return None;
        }
        Some((p.method.clone(), p.params.clone()))
    }

    pub fn set_abort(&mut self, id: u64, conn: ConnId, abort: AbortHandle) {
        if let Some(p) = self.items.get_mut(&id) {
            p.aborts.push((conn, abort));
        }
    }

    /// `conn` answered (or went away): the claim decides. `Decide`/`Forward` send `result`
    /// to the agent (and withdraw the other copies); `Reroute` starts a fresh deadline.
    pub async fn answer(
        &mut self,
        id: u64,
        conn: &ConnId,
        answer: Answer,
        result: Result<Value, ResponseError>,
        timeout: std::time::Duration,
    ) -> Step {
        let Some(p) = self.items.get_mut(&id) else {
            return Step::Ignore;
        };
        let step = p.claim.answer(conn, answer);
        p.aborts.retain(|(c, _)| c != conn);
        match &step {
            Step::Decide { withdraw } => {
                p.withdraw_at(withdraw);
                if let Some(p) = self.items.remove(&id) {
                    p.responder.respond_now(result);
                }
            }
            Step::Forward => {
                if let Some(p) = self.items.remove(&id) {
                    p.responder.respond_now(result);
                }
            }
            Step::Reroute => p.deadline = Instant::now() + timeout,
            Step::Wait | Step::Ignore => {}
        }
        step
    }

    /// The requests `conn` was asked and has not answered (it detached).
    pub fn asked_of(&self, conn: &ConnId) -> Vec<u64> {
        self.items
            .iter()
            .filter(|(_, p)| p.aborts.iter().any(|(c, _)| c == conn))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Withdraws the copy at `conn` (it detached; its relay task would end on its own only
    /// with its connection).
    pub fn withdraw_from(&mut self, id: u64, conn: &ConnId) {
        if let Some(p) = self.items.get_mut(&id) {
            p.withdraw_at(std::slice::from_ref(conn));
        }
    }

    /// The questions for the user (permissions, elicitations), which a `session/cancel`
    /// answers `cancelled`.
    pub fn take_questions(&mut self) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .items
            .iter()
            .filter(|(_, p)| capabilities::fans_out(&p.method))
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
            .filter(|p| !p.claim.is_asked())
            .map(|p| p.deadline)
            .min()
    }

    pub fn take_expired(&mut self, now: Instant) -> Vec<Pending> {
        let ids: Vec<u64> = self
            .items
            .iter()
            .filter(|(_, p)| !p.claim.is_asked() && p.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.items.remove(&id))
            .collect()
    }
}

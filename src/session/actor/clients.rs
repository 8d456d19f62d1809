//! Several clients on one session: who may steer it (roles), prompts that come while a turn
//! runs (queued or refused), agent requests sent to the right clients and claimed by the
//! first valid answer, and presence. The decisions are `roles.rs` and `claim.rs`; this moves
//! the messages.

use acpd_protocol::method;
use serde_json::{Value, json};

use super::{Session, TaskDone};
use crate::error::AcpError;
use crate::session::capabilities::{self, Candidate, Need, Route};
use crate::session::claim::{self, Step};
use crate::session::outbox::Out;
use crate::session::roles::{self, PERMISSION, PromptStep, Role};
use crate::session::{Client, ConnId, SessionCommand};
use acpd_wire::{PeerError, Responder, ResponseError};

const PRESENCE: &str = method::ACPD_SESSION_PRESENCE;
const RESOLVED: &str = method::ACPD_SESSION_REQUEST_RESOLVED;

impl Session {
    /// The command is one only a controller may send, and its client is attached as an
    /// observer: the error to answer (a notification is dropped, logged).
    pub(super) fn forbidden(&self, cmd: &SessionCommand) -> Option<AcpError> {
        if let SessionCommand::Attach { client, .. } = cmd
            && self.turn.cut_off.contains(&client.conn)
        {
            return Some(AcpError::SessionNotFound(self.id.to_string()));
        }
        let conn = cmd.steered_by()?;
        if self.turn.cut_off.contains(conn) {
            return Some(AcpError::SessionNotFound(self.id.to_string()));
        }
        let client = self.outbox.client(conn)?;
        if client.role.may_steer() {
            return None;
        }
        let method = match cmd {
            SessionCommand::Prompt { .. } => method::SESSION_PROMPT,
            SessionCommand::Cancel { .. } => method::SESSION_CANCEL,
            SessionCommand::Relay { method, .. }
            | SessionCommand::RelayNotification { method, .. } => method,
            SessionCommand::Fork { .. } => method::SESSION_FORK,
            SessionCommand::Close { .. } => method::SESSION_CLOSE,
            SessionCommand::Delete { .. } => method::SESSION_DELETE,
            SessionCommand::Attach { .. }
            | SessionCommand::Detach { .. }
            | SessionCommand::Revoke { .. } => return None,
        };
        tracing::info!(session = %self.id, conn = %conn, %method, "refused: the client is an observer");
        Some(AcpError::Observer(method.to_owned()))
    }

    /// A controller's prompt: starts now, or waits for the running turn, or is refused
    /// (`busy_prompts`).
    pub(super) async fn prompt(&mut self, conn: ConnId, params: Value, responder: Responder) {
        // Until the session's past spending is read, a prompt waits as if a turn ran.
        let busy = !self.running_prompts().is_empty()
            || !self.turn.queued.is_empty()
            || !self.usage.ready();
        match roles::prompt_step(busy, self.shared.settings.busy_prompts) {
            PromptStep::Start => self.begin_prompt(conn, params, responder).await,
            PromptStep::Queue => {
                tracing::debug!(session = %self.id, conn = %conn, "prompt queued behind the running turn");
                self.turn.queued.push_back(super::cancel::HeldPrompt {
                    conn,
                    params,
                    responder,
                });
            }
            PromptStep::Refuse => self.reply(responder, Err(AcpError::Busy.into())),
        }
    }

    /// Starts the queued prompts' next turn once nothing runs and the last turn's answer is
    /// out (after every event).
    pub(super) async fn start_queued(&mut self) {
        while self.running_prompts().is_empty()
            && !self.turn.guard.holds_prompts()
            && !self.rows.answers_parked()
            && self.usage.ready()
        {
            let Some(next) = self.turn.queued.pop_front() else {
                break;
            };
            // Boxed: cold, and `start_queued` is awaited inline on every pass of the loop.
            Box::pin(self.begin_prompt(next.conn, next.params, next.responder)).await;
        }
    }

    /// Queued prompts never start: each is answered `result` (a cancel: `cancelled`).
    pub(super) fn answer_queued(&mut self, result: Result<Value, ResponseError>) {
        for q in std::mem::take(&mut self.turn.queued) {
            self.reply(q.responder, result.clone());
        }
    }

    /// A client left: its unanswered agent requests move to other controllers, the others
    /// are told.
    pub(super) async fn detach(&mut self, conn: ConnId) {
        let gone = self.outbox.detach(&conn);
        if self.turn.conn.as_ref() == Some(&conn) {
            self.turn.conn = None;
        }
        for id in self.pending.asked_of(&conn) {
            self.pending.withdraw_from(id, &conn);
            self.client_answered(id, conn.clone(), Err(PeerError::Disconnected))
                .await;
        }
        if let Some(c) = gone {
            self.presence("detached", &c);
        }
    }

    /// A grant was revoked: the grantee's clients are closed (their connections end) and
    /// detached now, so nothing more reaches them and nothing of theirs is taken.
    pub(super) async fn revoke(&mut self, principal: &str) {
        let theirs: Vec<(ConnId, acpd_wire::PeerHandle)> = self
            .outbox
            .clients()
            .filter(|c| &*c.principal == principal)
            .map(|c| (c.conn.clone(), c.peer.clone()))
            .collect();
        for (conn, peer) in theirs {
            self.turn.cut_off.insert(conn.clone());
            tracing::warn!(target: "acpd::audit", session = %self.id, conn = %conn, %principal, "grant revoked: client cut off");
            peer.close();
            self.detach(conn).await;
        }
    }

    /// Tells the other clients that `who` attached or detached, with who is attached now.
    pub(super) fn presence(&mut self, event: &str, who: &Client) {
        let clients: Vec<Value> = self.outbox.clients().map(Client::describe).collect();
        self.status.send_modify(|s| s.clients = clients.clone());
        // Nobody else to tell (the usual `session/new`): no text is built.
        if !self.outbox.clients().any(|c| c.conn != who.conn) {
            return;
        }
        let text = json!({ "jsonrpc": "2.0", "method": PRESENCE, "params": {
            "sessionId": &*self.id,
            "event": event,
            "client": who.describe(),
            "clients": clients,
        }});
        self.outbox.push(Out::Raw {
            text: text.to_string().into(),
            except: Some(who.conn.clone()),
            need: None,
        });
    }

    /// Relays a pending agent request to the attached controllers `capabilities::route` picks (none
    /// attached: it waits for one), or answers it now when none can take it.
    pub(super) fn dispatch(&mut self, id: u64) {
        let Some(method) = self.pending.method(id).map(str::to_owned) else {
            return;
        };
        let need = self.pending.need(id);
        let candidates: Vec<Candidate> = self
            .outbox
            .clients()
            .filter(|c| c.role == Role::Controller)
            .map(|c| Candidate {
                conn: &c.conn,
                caps: c.caps(),
                tried: self.pending.was_tried(id, &c.conn),
            })
            .collect();
        let asked = self.pending.is_asked(id);
        match capabilities::route(&method, need, asked, self.turn.conn.as_ref(), &candidates) {
            Route::Ask(targets) => {
                for conn in targets {
                    self.relay(id, conn);
                }
            }
            Route::Wait => {}
            Route::Refuse => {
                let need = need.map_or("", Need::name);
                tracing::info!(session = %self.id, %method, need, "no attached controller can take the agent's request; answered at once");
                self.pending.refuse(id);
            }
        }
    }

    fn relay(&mut self, id: u64, conn: ConnId) {
        let Some(peer) = self.outbox.client(&conn).map(|c| c.peer.clone()) else {
            return;
        };
        let Some((method, params)) = self.pending.assign(id, conn.clone()) else {
            return;
        };
        // In the client's one ordered queue (`Outbox::ask`), behind the updates before it.
        let (req, answer) = peer.lane_request(&method, Some(params));
        self.outbox.ask(&conn, req);
        let answered_by = conn.clone();
        let abort = self.tasks.spawn(async move {
            let result = answer.wait().await;
            TaskDone::ClientAnswer {
                pending: id,
                conn: answered_by,
                result,
            }
        });
        self.pending.set_abort(id, conn, abort);
    }

    /// A client's answer to an agent request (or its going away): the claim decides whether
    /// it goes to the agent; a question decided is announced to every other client.
    pub(super) async fn client_answered(
        &mut self,
        id: u64,
        conn: ConnId,
        result: Result<Value, PeerError>,
    ) {
        let Some(method) = self.pending.method(id).map(str::to_owned) else {
            return;
        };
        let answer = claim::judge(&method, &result);
        let resolved = self.resolved_params(id, &method, &result);
        let asked = (method == PERMISSION)
            .then(|| self.pending.params(id).cloned())
            .flatten();
        let outcome = result.as_ref().ok().and_then(|v| v.get("outcome")).cloned();
        let result = result.map_err(|e| match e {
            PeerError::Remote(e) => e,
            PeerError::Disconnected => AcpError::ClientLeft("went away").into(),
        });
        let timeout = self.shared.settings.pending_request_timeout;
        let step = self
            .pending
            .answer(id, &conn, answer, result, timeout)
            .await;
        match (step, resolved) {
            (Step::Decide { .. }, Some(mut params)) => {
                let by = self.outbox.client(&conn).map(Client::describe);
                if let (Some(asked), Some(outcome)) = (&asked, &outcome) {
                    let who = by.clone().unwrap_or_else(|| json!({ "conn": &*conn }));
                    self.record_decision(asked, outcome, Some(who));
                }
                params["decidedBy"] = json!(by);
                tracing::info!(target: "acpd::audit", session = %self.id, conn = %conn, %method, outcome = %params["outcome"], "question decided");
                let text = json!({ "jsonrpc": "2.0", "method": RESOLVED, "params": params });
                self.outbox.push(Out::Raw {
                    text: text.to_string().into(),
                    except: Some(conn),
                    need: None,
                });
            }
            (Step::Reroute, _) => {
                tracing::info!(session = %self.id, conn = %conn, "agent request moves on: its client went away");
                self.dispatch(id);
            }
            _ => {}
        }
    }

    /// What the others are told when a question (`capabilities::fans_out`) is decided by `result`:
    /// the permission's `outcome`, the elicitation's `action` (never its content).
    fn resolved_params(
        &self,
        id: u64,
        method: &str,
        result: &Result<Value, PeerError>,
    ) -> Option<Value> {
        if !capabilities::fans_out(method) {
            return None;
        }
        let asked = self.pending.params(id)?;
        let answer = result.as_ref().ok();
        let mut params = json!({ "sessionId": &*self.id, "method": method });
        if method == PERMISSION {
            params["toolCallId"] = json!(asked.pointer("/toolCall/toolCallId"));
            params["outcome"] = json!(answer.and_then(|v| v.get("outcome")));
        } else {
            params["toolCallId"] = json!(asked.get("toolCallId"));
            params["elicitationId"] = json!(asked.get("elicitationId"));
            params["outcome"] = json!({ "action": answer.and_then(|v| v.get("action")) });
        }
        Some(params)
    }
}

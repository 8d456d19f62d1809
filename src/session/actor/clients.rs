//! Several clients on one session: who may steer it (roles), prompts that come while a turn
//! runs (queued or refused), agent requests sent to the right clients and claimed by the
//! first valid answer, and presence. The decisions are `roles.rs` and `claim.rs`; this moves
//! the messages.

use acpd_protocol::method;
use serde_json::{Value, json};

use super::{Session, TaskDone};
use crate::error::AcpError;
use crate::session::claim::{Answer, Step};
use crate::session::outbox::Out;
use crate::session::roles::{self, Candidate, PERMISSION, PromptStep, Role};
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
            self.begin_prompt(next.conn, next.params, next.responder)
                .await;
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
        });
    }

    /// Relays a pending agent request to the clients `roles::targets` picks among the
    /// attached controllers it was not sent to yet (none attached: it waits for one).
    pub(super) fn dispatch(&mut self, id: u64) {
        let Some(method) = self.pending.method(id).map(str::to_owned) else {
            return;
        };
        if method != PERMISSION && self.pending.is_asked(id) {
            return;
        }
        let controllers: Vec<&Client> = self
            .outbox
            .clients()
            .filter(|c| c.role == Role::Controller && !self.pending.was_tried(id, &c.conn))
            .collect();
        let candidates: Vec<Candidate> = controllers
            .iter()
            .map(|c| Candidate {
                conn: &c.conn,
                caps: c.caps(),
            })
            .collect();
        let targets = roles::targets(&method, self.turn.conn.as_ref(), &candidates);
        for conn in targets {
            self.relay(id, conn);
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
    /// it goes to the agent; a permission decided is announced to every other client.
    pub(super) async fn client_answered(
        &mut self,
        id: u64,
        conn: ConnId,
        result: Result<Value, PeerError>,
    ) {
        let permission = self.pending.is_permission(id);
        let answer = match &result {
            Err(PeerError::Disconnected) => Answer::Gone,
            Ok(v) if !permission || v.get("outcome").is_some_and(Value::is_object) => Answer::Valid,
            _ => Answer::Invalid,
        };
        let tool_call = self
            .pending
            .params(id)
            .and_then(|p| p.pointer("/toolCall/toolCallId"))
            .cloned();
        let outcome = result.as_ref().ok().and_then(|v| v.get("outcome")).cloned();
        let asked = permission
            .then(|| self.pending.params(id).cloned())
            .flatten();
        let result = result.map_err(|e| match e {
            PeerError::Remote(e) => e,
            PeerError::Disconnected => AcpError::ClientLeft("went away").into(),
        });
        let timeout = self.shared.settings.pending_request_timeout;
        let step = self
            .pending
            .answer(id, &conn, answer, result, timeout)
            .await;
        match step {
            Step::Decide { .. } if permission => {
                let by = self.outbox.client(&conn).map(Client::describe);
                if let (Some(asked), Some(outcome)) = (&asked, &outcome) {
                    let who = by.clone().unwrap_or_else(|| json!({ "conn": &*conn }));
                    self.record_decision(asked, outcome, Some(who));
                }
                tracing::info!(target: "acpd::audit", session = %self.id, conn = %conn, outcome = ?outcome, "permission decision");
                let text = json!({ "jsonrpc": "2.0", "method": RESOLVED, "params": {
                    "sessionId": &*self.id,
                    "method": PERMISSION,
                    "toolCallId": tool_call,
                    "outcome": outcome,
                    "decidedBy": by,
                }});
                self.outbox.push(Out::Raw {
                    text: text.to_string().into(),
                    except: Some(conn),
                });
            }
            Step::Reroute => {
                tracing::info!(session = %self.id, conn = %conn, "agent request moves on: its client went away");
                self.dispatch(id);
            }
            _ => {}
        }
    }
}

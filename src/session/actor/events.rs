//! What the agent sends about the session: updates (journaled), other notifications and its
//! requests (queued for a client, relayed to one, expired), answers to in-band requests (a
//! turn's end), its exit.

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{AgentState, Inflight, Session, with_session_id};
use crate::agent::AgentEvent;
use crate::error::AcpError;
use crate::session::capabilities::Need;
use crate::session::outbox::Out;
use crate::session::pending::Pending;
use acpd_protocol::method;
use acpd_wire::{IncomingRequest, RawNotification, Responder, ResponseError};

impl Session {
    pub(super) async fn on_agent_event(&mut self, ev: AgentEvent) {
        match ev {
            AgentEvent::Notification(n, _taken) => self.on_agent_notification(n).await,
            AgentEvent::Request(req) => self.on_agent_request(*req),
            // Boxed, as are the other cold awaits under the actor's loop: inline, the largest
            // of them sets the size of every live session's task (the update path stays inline).
            AgentEvent::Response { tag, result } => {
                Box::pin(self.on_agent_response(tag, *result)).await
            }
            AgentEvent::Exited { status } => Box::pin(self.agent_exited(status)).await,
        }
    }

    async fn on_agent_notification(&mut self, n: RawNotification) {
        if matches!(self.agent.state, AgentState::Restoring { .. }) {
            // The agent replaying its own history: acpd's journal already has it.
            return;
        }
        if n.method() == method::SESSION_UPDATE {
            if self.turn.guard.late_update() {
                // Late output of a turn acpd ended (`cancel.rs`).
                return;
            }
            self.journal_raw(&n, None).await;
        } else if n.method() == method::ACPD_SESSION_USAGE {
            // The agent's report to acpd (the built-in agent's, per model call): not relayed.
            Box::pin(self.on_usage_report(&n.params_value().unwrap_or(Value::Null))).await;
        } else {
            let params = n.params_value().unwrap_or(Value::Null);
            let need = Need::of_notification(n.method());
            // `elicitation/complete` names its elicitation, not a session: it goes as it came
            // (a session id the agent added is still rewritten to acpd's).
            let params = if n.method() == method::ELICITATION_COMPLETE
                && params.get("sessionId").is_none()
            {
                params
            } else {
                with_session_id(params, &self.id)
            };
            let text =
                json!({ "jsonrpc": "2.0", "method": n.method(), "params": params }).to_string();
            self.outbox.push(Out::Raw {
                text: text.into(),
                except: None,
                need,
            });
        }
    }

    fn on_agent_request(&mut self, req: IncomingRequest) {
        if matches!(self.agent.state, AgentState::Restoring { .. }) {
            // The agent's own request (answered on the agent's link, not a client's).
            let e = AcpError::Restoring.into();
            req.responder.respond_now(Err(e));
            return;
        }
        if self.turn.guard.late_update() {
            // A request of a turn acpd ended (`cancel.rs`): no client is asked, and a
            // permission is `cancelled` (an elicitation `cancel`), as ACP has it after a cancel.
            let result = match req.method.as_str() {
                method::SESSION_REQUEST_PERMISSION => {
                    Ok(json!({ "outcome": { "outcome": "cancelled" } }))
                }
                method::ELICITATION_CREATE => Ok(json!({ "action": "cancel" })),
                _ => Err(AcpError::TurnCancelled.into()),
            };
            req.responder.respond_now(result);
            return;
        }
        let Some(req) = self.auto_approve(req) else {
            return;
        };
        let params = req.params.unwrap_or(Value::Null);
        // Rewrite the agent's session id; a request without one stays without.
        let params = if params.get("sessionId").is_some() {
            with_session_id(params, &self.id)
        } else {
            params
        };
        let deadline = Instant::now() + self.shared.settings.pending_request_timeout;
        if self.outbox.clients_len() == 0 {
            tracing::info!(session = %self.id, method = %req.method, "agent request waits for a client to attach");
        }
        let id = self
            .pending
            .insert(Pending::new(req.method, params, req.responder, deadline));
        self.outbox.push(Out::Request(id));
    }

    async fn on_agent_response(&mut self, tag: u64, result: Result<Value, ResponseError>) {
        match self.agent.answered(tag) {
            Some(Inflight::Prompt { responder }) => {
                self.usage_answered(&result);
                let result = match self.judge_answer(tag, result).await {
                    Some(Err(_)) if self.turn.cancel_requested => {
                        Ok(json!({ "stopReason": "cancelled" }))
                    }
                    Some(r) => r,
                    None => return,
                };
                self.end_turn(responder, result);
            }
            Some(Inflight::Relay { responder }) => {
                self.outbox.push(Out::Reply { responder, result })
            }
            Some(Inflight::Fork {
                responder,
                client,
                params,
            }) => self.fork_answered(responder, client, params, result),
            Some(Inflight::Restore(step)) => self.restore_done(step, result).await,
            // The late answer of a turn acpd answered itself.
            None => {
                let _ = self.judge_answer(tag, result).await;
            }
        }
    }

    /// The end of a prompt turn: counted, the client answered once the turn's row updates (its
    /// title, say) are written. The row's `updated_at` needs no write of its own: every
    /// journal commit moves it (`acpd_store::Store::append`), and the turn journaled its
    /// prompt at least.
    pub(super) fn end_turn(&mut self, responder: Responder, result: Result<Value, ResponseError>) {
        self.turn_spent();
        let reason = crate::metrics::stop_reason_label(&result);
        metrics::counter!(crate::metrics::PROMPTS_TOTAL, "stop_reason" => reason).increment(1);
        self.after_rows(Out::Reply { responder, result });
        self.retention();
    }

    pub(super) async fn agent_exited(&mut self, status: String) {
        tracing::warn!(session = %self.id, %status, "agent exited under the session");
        self.guard_reset(Err(AcpError::AgentExited(status.clone()).into()));
        let was_restoring = matches!(self.agent.state, AgentState::Restoring { .. });
        self.agent.state = AgentState::Unbound;
        let cancelled = self.turn.cancel_requested;
        self.turn_spent();
        for (_, f) in self.agent.inflight.drain() {
            match f {
                Inflight::Prompt { responder } => {
                    let result = if cancelled {
                        Ok(json!({ "stopReason": "cancelled" }))
                    } else {
                        Err(AcpError::AgentExited(status.clone()).into())
                    };
                    self.outbox.push(Out::Reply { responder, result });
                }
                Inflight::Relay { responder } | Inflight::Fork { responder, .. } => {
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

    pub(super) async fn expire_pending(&mut self) {
        for p in self.pending.take_expired(Instant::now()) {
            tracing::info!(session = %self.id, method = %p.method, "agent request expired with no client attached");
            p.answer_cancelled().await;
        }
    }
}

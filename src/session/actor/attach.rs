//! Clients coming and going: attach (new, load with replay, resume, attach after a seq,
//! implicit), and the session's own end (`session/cancel`, `session/close`, `session/delete`).

use serde_json::{Value, json};

use super::{AgentState, Inflight, Session};
use crate::error::AcpError;
use crate::session::outbox::{Attached, Out};
use crate::session::{AttachMode, Client};
use acpd_store::{SessionPatch, StoreError};
use acpd_wire::Responder;

/// Journal entries read per page when replaying.
const REPLAY_PAGE: i64 = 1000;

impl Session {
    pub(super) async fn attach(
        &mut self,
        client: Client,
        mode: AttachMode,
        responder: Option<Responder>,
    ) {
        self.last_init = Some(client.init.clone());
        let conn = client.conn.clone();
        let current = self.next_seq - 1;
        let (sent_upto, reply, hold) = match mode {
            AttachMode::New { result } => (0, Some(result), true),
            AttachMode::Implicit => (current, None, false),
            AttachMode::Resume { params } => {
                self.adopt_client_params(&params).await;
                (current, Some(self.load_result()), true)
            }
            AttachMode::Load { params } => {
                self.adopt_client_params(&params).await;
                match self.replay(&client, 0).await {
                    Ok(upto) => (upto, Some(self.load_result()), true),
                    Err(e) => {
                        if let Some(r) = responder {
                            r.respond(Err(AcpError::from(e).into())).await;
                        }
                        return;
                    }
                }
            }
            AttachMode::After { after_seq } => match self.replay(&client, after_seq).await {
                Ok(upto) => (upto, Some(json!({ "lastSeq": upto })), false),
                Err(e) => {
                    if let Some(r) = responder {
                        r.respond(Err(AcpError::from(e).into())).await;
                    }
                    return;
                }
            },
        };
        self.outbox.attach(Attached { client, sent_upto });
        if let (Some(r), Some(result)) = (responder, reply) {
            r.respond(Ok(result)).await;
        }
        if hold {
            self.outbox.hold_for(self.shared.settings.bootstrap_delay);
        }
        // Requests the agent made while nobody was attached go to the newcomer.
        for id in self.pending.waiting() {
            self.dispatch(id, Some(&conn));
        }
    }

    /// Sends the journal after `after_seq` to one client; returns the last seq sent.
    pub(super) async fn replay(
        &mut self,
        client: &Client,
        after_seq: i64,
    ) -> Result<i64, StoreError> {
        let mut upto = after_seq.max(0);
        loop {
            let page = self
                .shared
                .store
                .journal_after(&self.id, upto, REPLAY_PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            upto = last.seq;
            let n = page.len() as i64;
            for e in page {
                if client.peer.send_raw(e.body).await.is_err() {
                    return Ok(upto);
                }
            }
            if n < REPLAY_PAGE {
                break;
            }
        }
        Ok(upto)
    }

    /// A load/resume carries the client's cwd and MCP servers; they are the ones to use now.
    pub(super) async fn adopt_client_params(&mut self, params: &Value) {
        let mut patch = SessionPatch {
            closed: Some(false),
            ..self.patch()
        };
        if let Some(cwd) = params.get("cwd").and_then(Value::as_str)
            && cwd != self.row.cwd
        {
            self.row.cwd = cwd.to_owned();
            patch.cwd = Some(cwd.to_owned());
        }
        if let Some(m) = params.get("mcpServers") {
            self.meta["mcpServers"] = m.clone();
            patch.meta = Some(self.meta.to_string());
        }
        self.save(patch).await;
    }

    pub(super) fn load_result(&self) -> Value {
        let mut r = json!({});
        for key in ["modes", "configOptions"] {
            if let Some(v) = self.meta.get(key).filter(|v| !v.is_null()) {
                r[key] = v.clone();
            }
        }
        r
    }

    pub(super) async fn cancel(&mut self) {
        self.cancel_requested = true;
        if let AgentState::Bound { agent, agent_sid } = &self.agent {
            let params = json!({ "sessionId": agent_sid });
            let _ = agent.peer.notify("session/cancel", Some(params)).await;
        }
        // The client must answer pending permission requests `cancelled`; acpd does it for
        // the clients it relayed them to, and withdraws them there.
        for p in self.pending.take_permissions() {
            p.answer_cancelled().await;
        }
    }

    pub(super) async fn close(&mut self, responder: Responder, delete: bool) {
        // Closing cancels the running turn as `session/cancel` would.
        if self
            .inflight
            .values()
            .any(|f| matches!(f, Inflight::Prompt { .. }))
        {
            self.cancel().await;
        }
        for (_, f) in self.inflight.drain() {
            if let Inflight::Prompt { responder } = f {
                self.outbox.push(Out::Reply {
                    responder,
                    result: Ok(json!({ "stopReason": "cancelled" })),
                });
            }
        }
        let method = if delete {
            "session/delete"
        } else {
            "session/close"
        };
        if let AgentState::Bound { agent, agent_sid } = &self.agent {
            let supported = if delete {
                agent.supports_delete()
            } else {
                agent.supports_close()
            };
            if supported {
                let _ = agent
                    .request_in_band(method, json!({ "sessionId": agent_sid }), &self.id, 0)
                    .await;
            }
            agent.unregister(&self.id);
        }
        self.agent = AgentState::Unbound;
        for p in self.pending.drain() {
            p.answer_cancelled().await;
        }
        let result = if delete {
            self.shared.store.delete_session(&self.id).await.map(|_| ())
        } else {
            self.shared
                .store
                .update_session(
                    &self.id,
                    &SessionPatch {
                        closed: Some(true),
                        ..self.patch()
                    },
                )
                .await
        };
        let reply = result
            .map(|_| json!({}))
            .map_err(|e| AcpError::from(e).into());
        self.outbox.push(Out::Reply {
            responder,
            result: reply,
        });
        self.ending = true;
    }
}

//! Clients coming and going: attach (new, load with replay, resume, attach after a seq,
//! implicit), and the session's own end (`session/cancel`, `session/close`, `session/delete`).

use acpd_protocol::method;
use std::time::Duration;

use serde_json::{Value, json};

use super::{AgentState, Inflight, Session};
use crate::error::AcpError;
use crate::session::outbox::{Attached, Out};
use crate::session::{AttachMode, Client};
use acpd_store::SessionPatch;
use acpd_wire::Responder;

impl Session {
    /// Attaches a client. A replay (`session/load`, `_acpd/session/attach`) is not sent from
    /// here: the client starts out lagging behind it and is fed journal pages by tasks as its
    /// queue drains (`outbox.rs`), with the answer held behind the replay. So a client that
    /// stops reading during a replay holds up nothing but itself.
    pub(super) fn attach(
        &mut self,
        client: Client,
        mode: AttachMode,
        responder: Option<Responder>,
    ) {
        self.agent.last_init = Some(client.init.clone());
        let conn = client.conn.clone();
        // Announced to the others when it is new here or its role changed.
        let announce = self
            .outbox
            .client(&conn)
            .is_none_or(|c| c.role != client.role)
            .then(|| client.clone());
        let current = self.position.last();
        let live_from = self.outbox.live_from(&conn, current);
        let bootstrap = self.shared.settings.bootstrap_delay;
        let resend = matches!(mode, AttachMode::Load { .. });
        // A client that claims to have seen more than the journal holds would silently miss
        // every update up to its number: it is told, with the journal's end. It stays
        // attached as an implicit attach would (live updates from now on; the connection
        // counts it as attached), so attaching again from the end replays nothing twice.
        let (mode, responder) = match mode {
            AttachMode::After { after_seq, .. } if after_seq > current => {
                if let Some(r) = responder {
                    let e = AcpError::AttachBeyondEnd {
                        after_seq,
                        last_seq: current,
                    };
                    self.reply(r, Err(e.into()));
                }
                (AttachMode::Implicit, None)
            }
            mode => (mode, responder),
        };
        let (after, result, reply_after_replay, hold) = match mode {
            AttachMode::New { result } => {
                (self.outbox.creator_from(), Some(result), false, bootstrap)
            }
            AttachMode::Implicit => (live_from, None, false, Duration::ZERO),
            AttachMode::Resume { params } => {
                self.adopt_client_params(&client, &params);
                (live_from, Some(self.load_result()), false, bootstrap)
            }
            AttachMode::Load { params } => {
                self.adopt_client_params(&client, &params);
                (0, Some(self.load_result()), true, bootstrap)
            }
            AttachMode::After {
                after_seq,
                mcp_servers,
            } => {
                let result = self.after_result(&client, after_seq, mcp_servers);
                (after_seq, Some(result), true, Duration::ZERO)
            }
        };
        let reply = match (responder, result) {
            (Some(r), Some(result)) => Some((r, Ok(result))),
            _ => None,
        };
        self.outbox.attach(Attached {
            client,
            after,
            reply,
            reply_after_replay,
            resend,
            hold,
        });
        if let Some(c) = announce {
            self.presence("attached", &c);
        }
        // Requests the agent made while nobody was attached go to the newcomer, and a
        // controller is asked the open permissions too.
        for id in self.pending.ids() {
            self.dispatch(id);
        }
    }

    /// The answer to `_acpd/session/attach` (after a seq): the journal's end as this client
    /// will have it, its role and who else is attached.
    fn after_result(
        &mut self,
        client: &Client,
        after_seq: i64,
        mcp_servers: Option<Value>,
    ) -> Value {
        // acp-shim re-attaching after a daemon restart: it serves the session's
        // tunnelled servers again.
        if let Some(m) = mcp_servers.filter(|_| client.carries_mcp()) {
            self.shared.mcp.carry(&self.id, &client.peer, &m);
        }
        let conn = &client.conn;
        let upto = self.outbox.replay_upto(conn, after_seq);
        let mut clients: Vec<Value> = self
            .outbox
            .clients()
            .filter(|c| c.conn != *conn)
            .map(Client::describe)
            .collect();
        clients.push(client.describe());
        json!({
            "lastSeq": upto,
            "role": client.role.as_str(),
            "clients": clients,
        })
    }

    /// A load/resume carries the client's cwd and MCP servers; they are the ones to use now,
    /// and its tunnelled ones are served by this client (the agent, if it lives on, keeps
    /// the URLs it has: they resolve through the new carrier).
    pub(super) fn adopt_client_params(&mut self, client: &Client, params: &Value) {
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
            let policy = &self.shared.settings.mcp_policy;
            let stored =
                crate::session::mcp::stored_for_agent(&self.row.agent, Some(m), policy, &self.id);
            patch.meta = Some(self.meta.update(|meta| meta["mcpServers"] = stored));
            if client.carries_mcp() {
                self.shared.mcp.carry(&self.id, &client.peer, m);
            }
        }
        self.save(patch);
    }

    pub(super) fn load_result(&self) -> Value {
        let mut r = json!({});
        let mut meta = self.meta.value();
        for key in ["modes", "configOptions"] {
            if let Some(v) = meta.get_mut(key).filter(|v| !v.is_null()) {
                r[key] = v.take();
            }
        }
        r
    }

    pub(super) async fn cancel(&mut self) {
        for p in self.cancel_turn() {
            p.answer_cancelled().await;
        }
    }

    /// `cancel` up to the pending questions, which it returns for the caller to answer
    /// (a synchronous caller, `usage.rs`, has a task answer them).
    pub(super) fn cancel_turn(&mut self) -> Vec<crate::session::pending::Pending> {
        self.turn.cancel_requested = true;
        self.guard_cancel();
        // A cancel ends the session's activity: the prompts queued behind the turn too.
        self.answer_queued(Ok(json!({ "stopReason": "cancelled" })));
        self.notify_agent(method::SESSION_CANCEL, json!({}));
        // The client must answer pending permission requests `cancelled` (an elicitation:
        // `cancel`); acpd does it for the clients it relayed them to, and withdraws them there.
        self.pending.take_questions()
    }

    pub(super) async fn close(&mut self, responder: Responder, delete: bool) {
        // Closing cancels the running turn as `session/cancel` would.
        if self
            .agent
            .inflight
            .values()
            .any(|f| matches!(f, Inflight::Prompt { .. }))
        {
            self.cancel().await;
        }
        for (_, f) in self.agent.inflight.drain() {
            if let Inflight::Prompt { responder } = f {
                self.outbox.push(Out::Reply {
                    responder,
                    result: Ok(json!({ "stopReason": "cancelled" })),
                });
            }
        }
        self.guard_reset(Ok(json!({ "stopReason": "cancelled" })));
        let method = if delete {
            method::SESSION_DELETE
        } else {
            method::SESSION_CLOSE
        };
        if let AgentState::Bound { agent, agent_sid } = &self.agent.state {
            let supported = if delete {
                agent.supports_delete()
            } else {
                agent.supports_close()
            };
            if supported {
                let params = json!({ "sessionId": agent_sid });
                // Never awaited; a full queue is dropped here (the session is closing).
                let _ = agent.try_request_in_band(method, params, &self.id, 0);
            }
            agent.unregister(&self.id, &self.agent.events);
        }
        self.agent.state = AgentState::Unbound;
        self.shared.mcp.end(&self.id);
        for p in self.pending.drain() {
            p.answer_cancelled().await;
        }
        // Written after the row updates before it; answered when done (`rows.rs`).
        self.rows.close = Some((responder, delete));
        self.write_rows();
    }
}

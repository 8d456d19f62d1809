//! Re-creating the agent side of a session: ask the pool for the agent process, then
//! `session/resume`, else `session/load` (its replay dropped), else `session/new`, each step an
//! in-band request whose answer arrives in order with the agent's updates.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{AgentState, Inflight, Restore, Session, TaskDone};
use crate::agent::{AgentHandle, AgentKey};
use crate::error::AcpError;
use acpd_store::SessionPatch;
use acpd_wire::ResponseError;

impl Session {
    /// Asks the pool for the agent, unless that is already under way.
    pub(super) fn ensure_agent(&mut self) {
        if !matches!(self.agent.state, AgentState::Unbound) {
            return;
        }
        let init = self
            .agent
            .last_init
            .clone()
            .unwrap_or_else(|| Arc::new(json!({ "protocolVersion": 1 })));
        let key = AgentKey {
            principal: self.row.principal_id.clone(),
            profile: self.row.agent.clone(),
        };
        let pool = self.shared.pool.clone();
        self.agent.state = AgentState::Starting;
        self.tasks
            .spawn(async move { TaskDone::AgentReady(pool.get(key, init).await) });
    }

    /// Starts the next restore step on `agent`, or binds/fails when none is left.
    pub(super) async fn restore_step(&mut self, agent: AgentHandle, after: Option<Restore>) {
        let old = self.row.agent_session_id.clone();
        let next = match after {
            None if old.is_some() && agent.supports_resume() => Some(Restore::Resume),
            None | Some(Restore::Resume) if old.is_some() && agent.supports_load() => {
                Some(Restore::Load)
            }
            Some(Restore::New) => None,
            _ => Some(Restore::New),
        };
        let Some(step) = next else {
            self.restore_failed("the agent could not re-create the session".into())
                .await;
            return;
        };
        agent.register(&self.id, old.as_deref(), self.agent.events.clone());
        // Stored in their `acpd-mcp:` form: tunnelled servers get loopback URLs of this
        // daemon, served by the session's carrier (the shim that re-attached with them).
        let servers = crate::session::mcp::stored_for_agent(
            &self.row.agent,
            self.meta.value().get("mcpServers"),
            &self.shared.settings.mcp_policy,
            &self.id,
        );
        let mut params = json!({
            "cwd": self.row.cwd,
            "mcpServers": self.shared.mcp.for_agent(&self.id, &servers).await,
        });
        if let Ok(Value::Array(dirs)) = serde_json::from_str::<Value>(&self.row.additional_dirs)
            && !dirs.is_empty()
        {
            params["additionalDirectories"] = Value::Array(dirs);
        }
        let method = match step {
            Restore::Resume => method::SESSION_RESUME,
            Restore::Load => method::SESSION_LOAD,
            Restore::New => method::SESSION_NEW,
        };
        if step != Restore::New {
            params["sessionId"] = json!(old);
        }
        let tag = super::next_tag();
        match agent.try_request_in_band(method, params, &self.id, tag) {
            Ok(_) => {
                self.agent.sent(tag, Inflight::Restore(step));
                self.agent.state = AgentState::Restoring { agent };
            }
            Err(e) => {
                if e == acpd_wire::QueueError::Full {
                    self.agent.state = AgentState::Restoring { agent };
                    self.cut_agent();
                }
                self.restore_failed("the agent exited".into()).await
            }
        }
    }

    pub(super) async fn restore_done(
        &mut self,
        step: Restore,
        result: Result<Value, ResponseError>,
    ) {
        let AgentState::Restoring { agent, .. } =
            std::mem::replace(&mut self.agent.state, AgentState::Unbound)
        else {
            return;
        };
        match result {
            Ok(r) => {
                let agent_sid = match step {
                    Restore::New => match r.get("sessionId").and_then(Value::as_str) {
                        Some(s) => s.to_owned(),
                        None => {
                            return self
                                .restore_failed("session/new answer without sessionId".into())
                                .await;
                        }
                    },
                    _ => self.row.agent_session_id.clone().unwrap_or_default(),
                };
                agent.register(&self.id, Some(&agent_sid), self.agent.events.clone());
                let meta = self.meta.update(|meta| {
                    for key in ["modes", "configOptions"] {
                        if let Some(v) = r.get(key) {
                            meta[key] = v.clone();
                        }
                    }
                });
                self.row.agent_session_id = Some(agent_sid.clone());
                let patch = SessionPatch {
                    agent_session_id: Some(Some(agent_sid.clone())),
                    meta: Some(meta),
                    closed: Some(false),
                    ..self.patch()
                };
                self.save(patch);
                tracing::info!(session = %self.id, ?step, "agent session restored");
                self.agent.state = AgentState::Bound { agent, agent_sid };
                self.run_deferred().await;
            }
            Err(e) => {
                tracing::debug!(session = %self.id, ?step, error = %e, "restore step failed");
                self.agent.state = AgentState::Restoring {
                    agent: agent.clone(),
                };
                Box::pin(self.restore_step(agent, Some(step))).await;
            }
        }
    }

    pub(super) async fn restore_failed(&mut self, why: String) {
        tracing::warn!(session = %self.id, %why, "cannot restore the agent session");
        self.agent.state = AgentState::Failed(why.clone());
        while let Some(cmd) = self.agent.next_deferred() {
            self.refuse(cmd, AcpError::AgentExited(why.clone()).into());
        }
    }

    pub(super) async fn run_deferred(&mut self) {
        while self.agent.bound() {
            let Some(cmd) = self.agent.next_deferred() else {
                break;
            };
            Box::pin(self.on_command(cmd)).await;
        }
    }
}

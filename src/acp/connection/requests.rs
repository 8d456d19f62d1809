//! A client's requests, dispatched by method to one handler per concern: the handshake
//! (`initialize`, in `connection.rs`), making and listing sessions, attaching to one
//! (`session/load|resume`, `_acpd/session/attach`), sharing one, the commands of a session
//! (prompt, fork, close, delete; modes, config options and extensions are relayed to its
//! agent), and what is no session's (the agent's: `authenticate`, its own extensions).

use std::sync::Arc;

use acpd_protocol::Method;
use serde_json::{Value, json};

use super::{Connection, Done, MAX_HANDLERS};
use crate::acp::params::{self, ParamsError};
use crate::error::AcpError;
use crate::session::roles::Role;
use crate::session::{AttachMode, SessionCommand};
use acpd_wire::{IncomingRequest, Responder};

impl Connection {
    pub(super) async fn on_request(&mut self, req: IncomingRequest) {
        let IncomingRequest {
            method,
            params,
            responder,
            cancelled: _,
        } = req;
        let params = params.unwrap_or_else(|| json!({}));
        tracing::debug!(%method, "request");
        if let Err(e) = self.admit() {
            return responder.respond(Err(e.into())).await;
        }
        let known = Method::parse(&method);
        if known == Some(Method::Initialize) {
            return self.initialize(params, responder);
        }
        let Some(init) = self.init.clone() else {
            return responder
                .respond(Err(AcpError::NotInitialized.into()))
                .await;
        };
        if let Err(e) = self.check_params(&method, known, &params) {
            return responder.respond(Err(AcpError::from(e).into())).await;
        }
        match known {
            Some(Method::SessionNew) => self.new_session(&init, params, responder),
            Some(Method::SessionList) => self.list_sessions(init, params, responder),
            Some(Method::AcpdSessionShare) => self.share_session(params, responder),
            Some(m @ (Method::SessionLoad | Method::SessionResume | Method::AcpdSessionAttach)) => {
                self.attach(m, init, params, responder).await
            }
            _ => match params::session_id(&params) {
                Some(sid) => {
                    let cmd = self.session_command(&sid, known, method, &init, params, responder);
                    self.send_session(sid, cmd, &init).await
                }
                // Not about a session: the agent's business (authenticate, logout, extensions).
                None => self.call_agent(init, method, params, responder).await,
            },
        }
    }

    /// The connection's rate limit and its handler tasks: what a request over them earns.
    fn admit(&mut self) -> Result<(), AcpError> {
        if !self.rate.admit() {
            return Err(AcpError::RateLimited);
        }
        if self.handlers.len() >= MAX_HANDLERS {
            return Err(AcpError::TooManyInFlight);
        }
        Ok(())
    }

    /// The params' shapes, and the directories a session may use: checked before anything
    /// reaches a session or the agent.
    fn check_params(
        &self,
        method: &str,
        known: Option<Method>,
        p: &Value,
    ) -> Result<(), ParamsError> {
        params::check(method, p)?;
        if let Some(
            Method::SessionNew | Method::SessionLoad | Method::SessionResume | Method::SessionFork,
        ) = known
        {
            params::check_roots(&self.ctx.config.fs_roots, &self.ctx.principal_name, p)?;
        }
        Ok(())
    }

    /// `session/new`: the hub makes the session, with this connection attached.
    fn new_session(&mut self, init: &Arc<Value>, params: Value, responder: Responder) {
        let client = self.client(init, Role::Controller);
        let (hub, principal) = (self.ctx.hub.clone(), self.ctx.principal.clone());
        let profile = self.ctx.profile.clone();
        self.handlers.spawn(async move {
            match hub
                .create(&principal, &profile, client, params, responder)
                .await
            {
                Ok(h) => Done::Created(h),
                Err((e, r)) => {
                    r.respond(Err(e.into())).await;
                    Done::Nothing
                }
            }
        });
    }

    /// `session/list`: the journal's sessions, with the agent's titles where it has them.
    fn list_sessions(&mut self, init: Arc<Value>, params: Value, responder: Responder) {
        let cwd = params.get("cwd").and_then(Value::as_str).map(str::to_owned);
        let cursor = params
            .get("cursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let profile = (!params::all_profiles(&params)).then(|| self.ctx.profile.clone());
        let (agent, name) = (self.agent(init), self.ctx.profile.clone());
        let (hub, principal) = (self.ctx.hub.clone(), self.ctx.principal.clone());
        self.handlers.spawn(async move {
            // The agent's own list may have titles acpd's journal lacks.
            let agent = agent.await.ok().map(|a| (a, name));
            let list = hub
                .list(&principal, profile.as_deref(), cwd, cursor, agent)
                .await;
            responder.respond(list.map_err(Into::into)).await;
            Done::Nothing
        });
    }

    /// `_acpd/session/share` (`share.rs`).
    fn share_session(&mut self, params: Value, responder: Responder) {
        let (hub, principal) = (self.ctx.hub.clone(), self.ctx.principal.clone());
        self.handlers.spawn(async move {
            crate::acp::share::answer(&hub, &principal, &params, responder).await;
            Done::Nothing
        });
    }

    /// `session/load`, `session/resume`, `_acpd/session/attach`: an explicit attach, with
    /// the role asked for.
    async fn attach(&mut self, m: Method, init: Arc<Value>, params: Value, responder: Responder) {
        let (sid, role, mode) = match attach_request(m, params) {
            Ok(r) => r,
            Err(e) => return responder.respond(Err(AcpError::from(e).into())).await,
        };
        self.roles.insert(sid.clone(), role);
        let cmd = SessionCommand::Attach {
            client: self.client(&init, self.role_in(&sid)),
            mode,
            responder: Some(responder),
        };
        self.send_session(sid, cmd, &init).await;
    }

    /// A request about session `sid` as the command its actor takes: a prompt, the
    /// lifecycle (fork, close, delete), or anything else (modes, config options, models,
    /// extensions) relayed to its agent.
    fn session_command(
        &self,
        sid: &str,
        known: Option<Method>,
        method: String,
        init: &Arc<Value>,
        params: Value,
        responder: Responder,
    ) -> SessionCommand {
        let conn = self.ctx.conn_id.clone();
        match known {
            Some(Method::SessionPrompt) => SessionCommand::Prompt {
                conn,
                params,
                responder,
            },
            Some(Method::SessionFork) => SessionCommand::Fork {
                client: self.client(init, self.role_in(sid)),
                params,
                responder,
            },
            Some(Method::SessionClose) => SessionCommand::Close {
                conn: Some(conn),
                responder,
            },
            Some(Method::SessionDelete) => SessionCommand::Delete {
                conn: Some(conn),
                responder,
            },
            _ => SessionCommand::Relay {
                conn,
                method,
                params,
                responder,
            },
        }
    }
}

/// What an attach asks for: the session, the role, and what to replay.
fn attach_request(m: Method, params: Value) -> Result<(String, Role, AttachMode), ParamsError> {
    let sid = params::session_id(&params).ok_or(ParamsError::Missing("sessionId"))?;
    let role = params::attach_role(m.as_str(), &params)?;
    let mode = match m {
        Method::SessionLoad => AttachMode::Load { params },
        Method::SessionResume => AttachMode::Resume { params },
        _ => match params.get("afterSeq").map(Value::as_i64) {
            None | Some(Some(0..)) => AttachMode::After {
                after_seq: params.get("afterSeq").and_then(Value::as_i64).unwrap_or(0),
                mcp_servers: params.get("mcpServers").cloned(),
            },
            Some(_) => return Err(ParamsError::AfterSeq),
        },
    };
    Ok((sid, role, mode))
}

//! One session of the built-in agent: a task that owns its settings and, between turns, its
//! transcript. A prompt starts a turn task that borrows the transcript and gives it back;
//! cancel fires the turn's token; the state file is written after every turn and change.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::client::ClientLink;
use super::content;
use super::mcp_consent;
use super::options;
use super::state::{self, SavedSession, Settings};
use super::tools::Roots;
use super::tools::mcp::McpHub;
use super::turn::{self, StopReason, TurnCtx, TurnError, TurnKind};
use acpd_wire::{Responder, ResponseError, code};

/// Zed drops updates for a session it has not registered; commands come this long after
/// the new/load/resume response (zed-industries/zed#60199).
const COMMANDS_DELAY: Duration = Duration::from_millis(100);

pub enum SessionCmd {
    /// Answers a session/new|load|resume; `replay` sends the history first.
    Start {
        responder: Responder,
        result: Value,
        replay: bool,
        params: Value,
        /// The `mcpServers` to connect (replacing the current ones).
        mcp_servers: Option<Vec<Value>>,
    },
    Prompt {
        params: Value,
        responder: Responder,
    },
    Cancel,
    SetMode {
        mode: String,
        responder: Responder,
    },
    SetConfig {
        id: String,
        value: String,
        responder: Responder,
    },
    Close {
        responder: Responder,
        delete: bool,
    },
}

/// Why a session task ended: idle sessions hand back commands that raced with the exit.
pub struct Ended {
    pub id: Arc<str>,
    pub leftover: Vec<SessionCmd>,
}

type TurnResult = (SavedSession, Result<StopReason, TurnError>);

pub struct Session {
    id: Arc<str>,
    shared: Arc<Shared>,
    client: ClientLink,
    roots: Roots,
    /// `None` while a turn holds the transcript.
    saved: Option<SavedSession>,
    settings: watch::Sender<Settings>,
    turn: Option<(CancellationToken, Responder)>,
    turns: JoinSet<TurnResult>,
    /// What the running turn's model calls spent (`TurnCtx::spent`).
    spent: watch::Sender<Option<crate::provider::Usage>>,
    commands_at: Option<Instant>,
    mcp: McpHub,
    mcp_connected: bool,
    /// Told to the user at the next prompt (e.g. an MCP server that did not start).
    warnings: Vec<String>,
}

impl Session {
    pub fn new(id: Arc<str>, shared: Arc<Shared>, mut saved: SavedSession) -> Session {
        options::reconcile(&shared.config, &mut saved.settings);
        let roots = Roots::new(&saved.cwd, &saved.additional_dirs, &shared.config.data_dir);
        let client = ClientLink::new(shared.peer.clone(), id.clone());
        let (settings, _) = watch::channel(saved.settings.clone());
        Session {
            id,
            shared,
            client,
            roots,
            saved: Some(saved),
            settings,
            turn: None,
            turns: JoinSet::new(),
            spent: watch::Sender::new(None),
            commands_at: None,
            mcp: McpHub::default(),
            mcp_connected: false,
            warnings: vec![],
        }
    }

    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<SessionCmd>,
        shutdown: CancellationToken,
    ) -> Ended {
        let idle = self.shared.config.idle_unload;
        let mut idle_since = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = rx.recv() => match cmd {
                    Some(SessionCmd::Close { responder, delete }) => {
                        self.close(responder, delete).await;
                        rx.close();
                        std::mem::take(&mut self.mcp).shutdown().await;
                        return Ended { id: self.id.clone(), leftover: drain(&mut rx) };
                    }
                    Some(cmd) => self.on_command(cmd).await,
                    None => break,
                },
                Some(done) = self.turns.join_next() => {
                    match done {
                        Ok(r) => self.turn_done(r).await,
                        Err(e) => {
                            tracing::error!(session = %self.id, error = %e, "turn task failed");
                            if let Some((_, responder)) = self.turn.take() {
                                responder.respond(Err(ResponseError::internal("the turn failed"))).await;
                            }
                            // The transcript went down with the turn: the last saved one is next.
                            match state::load(&self.shared.config.state_dir, &self.id).await {
                                Ok(mut saved) => {
                                    saved.settings = self.settings.borrow().clone();
                                    self.saved = Some(saved);
                                }
                                Err(e) => {
                                    tracing::error!(session = %self.id, error = %e, "cannot reload the session state");
                                    break;
                                }
                            }
                        }
                    }
                }
                _ = sleep_until(self.commands_at) => {
                    self.commands_at = None;
                    self.client.update(json!({
                        "sessionUpdate": "available_commands_update",
                        "availableCommands": options::available_commands(&self.shared.config),
                    })).await;
                }
                _ = tokio::time::sleep_until(idle_since + idle), if self.turn.is_none() => {
                    rx.close();
                    std::mem::take(&mut self.mcp).shutdown().await;
                    return Ended { id: self.id.clone(), leftover: drain(&mut rx) };
                }
            }
            if self.turn.is_some() {
                idle_since = Instant::now();
            }
        }
        // Shutdown: the running turn stops and its transcript is saved.
        self.cancel_turn().await;
        std::mem::take(&mut self.mcp).shutdown().await;
        Ended {
            id: self.id.clone(),
            leftover: vec![],
        }
    }

    async fn on_command(&mut self, cmd: SessionCmd) {
        match cmd {
            SessionCmd::Start {
                responder,
                mut result,
                replay,
                params,
                mcp_servers,
            } => {
                self.adopt(&params).await;
                if let Some(servers) = mcp_servers {
                    if let Some(saved) = self.saved.as_mut() {
                        saved.mcp_servers = servers;
                    }
                    // A server the user must be asked about waits for the first prompt: asked
                    // now, the question would hold up the answer the client waits for.
                    if self.mcp_needs_asking() {
                        std::mem::take(&mut self.mcp).shutdown().await;
                        self.mcp_connected = false;
                    } else {
                        self.connect_mcp().await;
                    }
                }
                let s = self.settings.borrow().clone();
                result["modes"] = options::modes(&s);
                result["configOptions"] = options::config_options(&self.shared.config, &s);
                if replay && let Some(saved) = &self.saved {
                    for u in content::replay(&saved.messages, &self.roots) {
                        self.client.update(u).await;
                    }
                }
                responder.respond(Ok(result)).await;
                self.commands_at = Some(Instant::now() + COMMANDS_DELAY);
            }
            SessionCmd::Prompt { params, responder } => self.prompt(params, responder).await,
            SessionCmd::Cancel => {
                if let Some((cancel, _)) = &self.turn {
                    cancel.cancel();
                }
            }
            SessionCmd::SetMode { mode, responder } => {
                let r = self.set_option("mode", &mode).await.map(|_| json!({}));
                responder.respond(r).await;
            }
            SessionCmd::SetConfig {
                id,
                value,
                responder,
            } => {
                let r = self
                    .set_option(&id, &value)
                    .await
                    .map(|opts| json!({ "configOptions": opts }));
                responder.respond(r).await;
            }
            SessionCmd::Close { .. } => {}
        }
    }

    /// A load/resume brings the client's current cwd, directories and tools.
    async fn adopt(&mut self, params: &Value) {
        let Some(saved) = self.saved.as_mut() else {
            return;
        };
        let mut changed = false;
        if let Some(cwd) = params.get("cwd").and_then(Value::as_str)
            && std::path::Path::new(cwd) != saved.cwd
        {
            saved.cwd = cwd.into();
            changed = true;
        }
        if let Some(dirs) = params
            .get("additionalDirectories")
            .and_then(Value::as_array)
        {
            saved.additional_dirs = dirs
                .iter()
                .filter_map(Value::as_str)
                .map(Into::into)
                .collect();
            changed = true;
        }
        if let Ok(Some(tools)) = super::tools::parse_client_tools(params) {
            saved.client_tools = tools;
            changed = true;
        }
        if changed {
            self.roots = Roots::new(
                &saved.cwd,
                &saved.additional_dirs,
                &self.shared.config.data_dir,
            );
            self.save().await;
        }
    }

    fn mcp_needs_asking(&self) -> bool {
        self.saved.as_ref().is_some_and(|saved| {
            let policy = &self.shared.config.mcp_policy;
            !mcp_consent::plan(policy, &saved.mcp_servers, &saved.remembered)
                .ask
                .is_empty()
        })
    }

    /// (Re)connects the MCP servers of the saved state that the stdio policy (or the user)
    /// lets start.
    async fn connect_mcp(&mut self) {
        let Some(saved) = self.saved.as_mut() else {
            return;
        };
        let plan = mcp_consent::plan(
            &self.shared.config.mcp_policy,
            &saved.mcp_servers,
            &saved.remembered,
        );
        let (allowed, refused) = mcp_consent::ask(&self.client, plan, &mut saved.remembered).await;
        for w in &refused {
            tracing::warn!(target: "acpd::audit", session = %self.id, "{w}");
        }
        self.warnings.extend(refused);
        let servers = Value::Array(allowed);
        let cwd = saved.cwd.clone();
        std::mem::take(&mut self.mcp).shutdown().await;
        let (hub, warnings) = McpHub::connect(
            &servers,
            &cwd,
            &self.shared.http,
            self.shared.config.mcp_connect_timeout,
        )
        .await;
        for w in &warnings {
            tracing::warn!(session = %self.id, "{w}");
        }
        self.warnings.extend(warnings);
        self.mcp = hub;
        self.mcp_connected = true;
        self.save().await;
    }

    async fn prompt(&mut self, params: Value, responder: Responder) {
        if self.turn.is_some() {
            let e = ResponseError::invalid_request("a prompt is already running in this session");
            return responder.respond(Err(e)).await;
        }
        let Some(prompt) = params.get("prompt").and_then(Value::as_array).cloned() else {
            return responder
                .respond(Err(ResponseError::invalid_params(
                    "prompt must be an array",
                )))
                .await;
        };
        let kind = match options::slash_command(&prompt) {
            Some((name, arg)) if name == "mode" || name == "model" => {
                let text = match self.set_option(&name, &arg).await {
                    Ok(_) => format!("{name} set to {arg}"),
                    Err(e) => e.message,
                };
                self.client
                    .update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": text } }))
                    .await;
                return responder
                    .respond(Ok(json!({ "stopReason": "end_turn" })))
                    .await;
            }
            Some((name, _)) if name == "compact" => TurnKind::Compact,
            _ => TurnKind::Prompt(prompt),
        };
        if !self.mcp_connected {
            self.connect_mcp().await;
        }
        for w in std::mem::take(&mut self.warnings) {
            let text = format!("⚠ {w}\n\n");
            self.client
                .update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": text } }))
                .await;
        }
        let Some(saved) = self.saved.take() else {
            return responder
                .respond(Err(ResponseError::internal("the session state is busy")))
                .await;
        };
        let cancel = CancellationToken::new();
        let ctx = TurnCtx {
            client: self.client.clone(),
            config: self.shared.config.clone(),
            http: self.shared.model_http.clone(),
            caps: self.shared.caps,
            roots: self.roots.clone(),
            settings: self.settings.subscribe(),
            cancel: cancel.clone(),
            mcp: self.mcp.tools.clone(),
            spent: self.spent.clone(),
        };
        self.spent.send_replace(None);
        self.turns.spawn(turn::run(ctx, saved, kind));
        self.turn = Some((cancel, responder));
    }

    async fn turn_done(&mut self, (mut saved, result): TurnResult) {
        saved.settings = self.settings.borrow().clone();
        self.saved = Some(saved);
        self.save().await;
        let Some((_, responder)) = self.turn.take() else {
            return;
        };
        let reply = match result {
            Ok(stop) => Ok(match self.spent.send_replace(None) {
                Some(u) => json!({ "stopReason": stop, "usage": u.to_acp() }),
                None => json!({ "stopReason": stop }),
            }),
            Err(TurnError::Auth(m)) => Err(ResponseError::new(
                code::AUTH_REQUIRED,
                "Authentication required",
            )
            .with_data(json!({ "message": m }))),
            Err(TurnError::Provider(m)) => {
                tracing::warn!(session = %self.id, error = %m, "model call failed");
                Err(ResponseError::new(code::INTERNAL_ERROR, m))
            }
        };
        responder.respond(reply).await;
    }

    /// Stops a running turn and waits for its transcript.
    async fn cancel_turn(&mut self) {
        if let Some((cancel, _)) = &self.turn {
            cancel.cancel();
        }
        while let Some(done) = self.turns.join_next().await {
            if let Ok(r) = done {
                self.turn_done(r).await;
            }
        }
    }

    async fn set_option(&mut self, id: &str, value: &str) -> Result<Value, ResponseError> {
        let mut s = self.settings.borrow().clone();
        options::set_option(&self.shared.config, &mut s, id, value)
            .map_err(ResponseError::invalid_params)?;
        let mode_changed = s.mode != self.settings.borrow().mode;
        self.settings.send_replace(s.clone());
        if let Some(saved) = self.saved.as_mut() {
            saved.settings = s.clone();
        }
        self.save().await;
        if mode_changed {
            self.client
                .update(json!({ "sessionUpdate": "current_mode_update", "currentModeId": s.mode }))
                .await;
        }
        let opts = options::config_options(&self.shared.config, &s);
        self.client
            .update(json!({ "sessionUpdate": "config_option_update", "configOptions": opts }))
            .await;
        Ok(opts)
    }

    async fn close(&mut self, responder: Responder, delete: bool) {
        self.cancel_turn().await;
        let r = if delete {
            state::delete(&self.shared.config.state_dir, &self.id).await
        } else {
            Ok(())
        };
        if let Err(e) = r {
            tracing::warn!(session = %self.id, error = %e, "cannot delete the session state");
        }
        responder.respond(Ok(json!({}))).await;
    }

    async fn save(&mut self) {
        if let Some(saved) = &self.saved
            && let Err(e) = state::save(&self.shared.config.state_dir, &self.id, saved).await
        {
            tracing::error!(session = %self.id, error = %e, "cannot save the session state");
        }
    }
}

fn drain(rx: &mut mpsc::Receiver<SessionCmd>) -> Vec<SessionCmd> {
    let mut out = vec![];
    while let Ok(c) = rx.try_recv() {
        out.push(c);
    }
    out
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

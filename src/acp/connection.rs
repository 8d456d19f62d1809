//! One client connection: its JSON-RPC peer, the ACP methods it calls, and the sessions it
//! is attached to. Whatever the transport, every client runs this.
//!
//! Commands for a session are sent from the loop itself, in arrival order, from the first
//! one on: while the session is being opened (a handler task asks the hub) its commands wait
//! in the connection's queue for it, so a `session/cancel` can never overtake the
//! `session/prompt` before it. Anything slow (starting an agent, opening a session) runs as a
//! handler task whose result comes back to the loop.

use acpd_protocol::method;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod agent_call;
mod grant;
mod requests;
use agent_call::AgentCalls;

use super::rate::RateLimit;
use crate::agent::{AgentHandle, AgentKey, WeakAgentHandle};
use crate::config::BusyPrompts;
use crate::config::Config;
use crate::error::AcpError;
use crate::session::roles::Role;
use crate::session::{AttachMode, Client, ConnId, SessionCommand, SessionHandle, SessionHub};
use acpd_wire::{Incoming, Link, Notification, PeerHandle, Responder, ResponseError};

/// Who is on the other end and what they may reach.
#[derive(Clone)]
pub struct ConnectionCtx {
    pub conn_id: ConnId,
    /// The authenticated principal; sessions of others are invisible.
    pub principal: String,
    /// Its name, for the per-principal settings (`roots`).
    pub principal_name: String,
    pub config: Arc<Config>,
    /// The agent profile this connection picked.
    pub profile: String,
    pub hub: SessionHub,
    /// Sustained requests per second this connection may send (0: no limit).
    pub max_requests_per_second: u32,
    /// acp-shim's `acpd-mcp:` servers may be tunnelled over this connection (WebSocket
    /// upgrades only: the transport acp-shim uses).
    pub mcp_tunnel: bool,
    /// The client is acp-shim (its resumable link): a terminal auth method may name its
    /// `--login` (`initialize::login_offer`).
    pub via_shim: bool,
}

/// Runs one connection until its link closes or `shutdown` fires.
pub async fn run(link: Link, ctx: ConnectionCtx, shutdown: CancellationToken) {
    let span = tracing::info_span!("conn", id = %ctx.conn_id, principal = %ctx.principal, agent = %ctx.profile);
    // Boxed: inline, the loop's future sat in the caller's task next to the arguments it was
    // built from and the span's wrapper, a copy of each (5.2 KB, where the loop is 2.3 KB).
    Box::pin(run_inner(link, ctx, shutdown))
        .instrument(span)
        .await
}

async fn run_inner(link: Link, ctx: ConnectionCtx, shutdown: CancellationToken) {
    let (peer, mut incoming, peer_task) = acpd_wire::spawn(link, shutdown.child_token());
    tracing::debug!("connected");
    metrics::counter!(crate::metrics::CONNECTIONS_TOTAL).increment(1);
    metrics::gauge!(crate::metrics::CONNECTIONS_LIVE).increment(1);
    let mut conn = Connection {
        rate: RateLimit::new(ctx.max_requests_per_second),
        ctx,
        peer,
        init: None,
        sessions: HashMap::new(),
        roles: HashMap::new(),
        caps: HashMap::new(),
        handlers: JoinSet::new(),
        calls: AgentCalls::new(),
        flooded: false,
    };
    while !conn.flooded {
        tokio::select! {
            msg = incoming.recv() => match msg {
                // Boxed: inline, the handlers' futures would make every idle connection's
                // task as big as the largest of them.
                Some(Incoming::Request(req)) => Box::pin(conn.on_request(*req)).await,
                Some(Incoming::Notification(n)) => Box::pin(conn.on_notification(n.into_notification())).await,
                Some(Incoming::Response { .. }) => {}
                None => break,
            },
            Some(done) = conn.handlers.join_next() => match done {
                Ok(Done::Created(handle)) => {
                    let sid = handle.id.to_string();
                    Box::pin(conn.opened(sid, Ok((handle, None)))).await;
                }
                Ok(Done::Opened { sid, result }) => Box::pin(conn.opened(sid, result)).await,
                Ok(Done::Reached(agent)) => conn.calls.reached(agent),
                Ok(Done::Nothing) | Err(_) => {}
            }
        }
    }
    if conn.flooded {
        Box::pin(conn.close_flooded()).await;
    }
    // A closed socket detaches; it does not cancel. Turns go on and are journaled.
    for (_, slot) in conn.sessions.drain() {
        if let Slot::Attached(h) = slot {
            let _ = h
                .send(SessionCommand::Detach {
                    conn: conn.ctx.conn_id.clone(),
                })
                .await;
        }
    }
    conn.handlers.abort_all();
    let _ = peer_task.await;
    metrics::gauge!(crate::metrics::CONNECTIONS_LIVE).decrement(1);
    tracing::debug!("disconnected");
}

/// Handler tasks (opening sessions, agent calls) one connection may have running; a request
/// beyond them is answered `AcpError::TooManyInFlight`, a notification closes the connection.
const MAX_HANDLERS: usize = 1024;

/// Commands a connection holds for a session that is still being opened (beyond them the
/// client is answered an error: it is flooding a session that does not answer).
const OPENING_QUEUE: usize = 1024;

/// A session as one connection sees it.
enum Slot {
    /// The hub is opening it; its commands wait here, in arrival order.
    Opening(VecDeque<SessionCommand>),
    Attached(SessionHandle),
}

/// What a handler task hands back to the loop.
enum Done {
    Nothing,
    /// `session/new` made and attached this session.
    Created(SessionHandle),
    /// A call reached the connection's agent through the pool: later calls go to it directly.
    Reached(WeakAgentHandle),
    /// The hub opened (or could not open) a session this connection has commands for.
    Opened {
        sid: String,
        /// The handle, and the grant's role when the session is another principal's.
        result: Result<(SessionHandle, Option<Role>), AcpError>,
    },
}

struct Connection {
    ctx: ConnectionCtx,
    rate: RateLimit,
    peer: PeerHandle,
    /// The client's `initialize` params, once received.
    init: Option<Arc<Value>>,
    sessions: HashMap<String, Slot>,
    /// The role this connection last attached to each session with (an implicit attach
    /// keeps it; an observer does not become a controller by prompting).
    roles: HashMap<String, Role>,
    /// The most this connection's principal may be in a session it does not own (its
    /// grant's role); absent for its own sessions.
    caps: HashMap<String, Role>,
    handlers: JoinSet<Done>,
    calls: AgentCalls,
    /// Notifications came faster than the rate limit (they cannot be refused one by one):
    /// the loop ends and the connection is closed.
    flooded: bool,
}

impl Connection {
    fn client(&self, init: &Arc<Value>, role: Role) -> Client {
        Client {
            conn: self.ctx.conn_id.clone(),
            peer: self.peer.clone(),
            init: init.clone(),
            role,
            principal: Arc::from(self.ctx.principal.as_str()),
            principal_name: Arc::from(self.ctx.principal_name.as_str()),
            mcp_tunnel: self.ctx.mcp_tunnel,
        }
    }

    /// The role this connection has in `sid` (a controller unless it attached otherwise),
    /// never above what its principal was granted there.
    fn role_in(&self, sid: &str) -> Role {
        let role = self.roles.get(sid).copied().unwrap_or(Role::Controller);
        match self.caps.get(sid) {
            Some(cap) => role.capped(*cap),
            None => role,
        }
    }

    fn agent_key(&self) -> AgentKey {
        AgentKey {
            principal: self.ctx.principal.clone(),
            profile: self.ctx.profile.clone(),
        }
    }

    async fn on_notification(&mut self, n: Notification) {
        // Notifications count against the rate too; one over it cannot be answered, so the
        // connection ends (dropping it silently could lose a `session/cancel`).
        if !self.rate.admit() || self.handlers.len() >= MAX_HANDLERS {
            self.flooded = true;
            return;
        }
        let params = n.params.unwrap_or_else(|| json!({}));
        let Some(init) = self.init.clone() else {
            return;
        };
        if let Err(why) = super::params::check(&n.method, &params) {
            tracing::debug!(method = %n.method, %why, "notification with bad params ignored");
            return;
        }
        match super::params::session_id(&params) {
            Some(sid) => {
                let conn = self.ctx.conn_id.clone();
                let cmd = if n.method == method::SESSION_CANCEL {
                    SessionCommand::Cancel { conn: Some(conn) }
                } else {
                    SessionCommand::RelayNotification {
                        conn,
                        method: n.method,
                        params,
                    }
                };
                self.send_session(sid, cmd, &init).await;
            }
            None => {
                let agent = self.agent(init);
                self.handlers.spawn(async move {
                    if let Ok(a) = agent.await {
                        let _ = a.peer.notify(&n.method, Some(params)).await;
                    }
                    Done::Nothing
                });
            }
        }
    }

    /// Sends a session-scoped command in arrival order: at once when this connection is
    /// attached, queued behind the others while the session is being opened.
    async fn send_session(&mut self, sid: String, cmd: SessionCommand, init: &Arc<Value>) {
        // A grant is not ownership (`grant.rs`).
        let Some(cmd) = self.grantee_attached(&sid, cmd).await else {
            return;
        };
        // Re-opening a session this connection was attached to: it saw it already.
        let mut reopening = false;
        let cmd = match self.sessions.get_mut(&sid) {
            Some(Slot::Opening(queue)) if queue.len() >= OPENING_QUEUE => {
                let e = AcpError::Internal("too many commands for a session being opened".into());
                return reject(cmd, e).await;
            }
            Some(Slot::Opening(queue)) => return queue.push_back(cmd),
            Some(Slot::Attached(h)) => match h.send(cmd).await {
                Ok(()) => return,
                // Its actor ended (idle, closed): open it again.
                Err(cmd) => {
                    reopening = true;
                    cmd
                }
            },
            None => cmd,
        };
        // An implicit attach first, so what the commands cause reaches this connection;
        // not before a load/resume/attach (it is one) or a delete (nothing to see).
        let mut queue = VecDeque::new();
        if !matches!(
            cmd,
            SessionCommand::Attach { .. } | SessionCommand::Delete { .. }
        ) {
            queue.push_back(SessionCommand::Attach {
                client: self.client(init, self.role_in(&sid)),
                mode: AttachMode::Implicit,
                responder: None,
            });
        }
        queue.push_back(cmd);
        // Sessions of this connection's profile only, unless a load/resume asks for all (or
        // it is one this connection is attached to already).
        let all = reopening
            || match queue.back() {
                Some(SessionCommand::Attach {
                    mode: AttachMode::Load { params } | AttachMode::Resume { params },
                    ..
                }) => super::params::all_profiles(params),
                _ => false,
            };
        self.sessions.insert(sid.clone(), Slot::Opening(queue));
        let hub = self.ctx.hub.clone();
        let principal = self.ctx.principal.clone();
        let profile = (!all).then(|| self.ctx.profile.clone());
        self.handlers.spawn(async move {
            let result = match hub.open(&sid, &principal, profile.as_deref()).await {
                // Not ours: maybe shared with us (`share.rs`).
                Err(AcpError::SessionNotFound(_)) => hub
                    .open_shared(&sid, &principal)
                    .await
                    .map(|(h, role)| (h, Some(role))),
                r => r.map(|h| (h, None)),
            };
            Done::Opened { sid, result }
        });
    }

    /// The hub answered for a session being opened, or `session/new` made one: the commands
    /// queued for it go, in order. (The client may use a new session's id before the handler
    /// that made it is back: its commands then wait for whichever answer comes first.)
    async fn opened(
        &mut self,
        sid: String,
        result: Result<(SessionHandle, Option<Role>), AcpError>,
    ) {
        let queue = match self.sessions.remove(&sid) {
            Some(Slot::Opening(queue)) => queue,
            Some(attached) => {
                // Attached already (the other answer came first).
                self.sessions.insert(sid, attached);
                return;
            }
            None => VecDeque::new(),
        };
        let handle = match result {
            Ok((h, cap)) => {
                match cap {
                    Some(cap) => self.caps.insert(sid.clone(), cap),
                    None => self.caps.remove(&sid),
                };
                h
            }
            Err(e) => return not_opened(queue, e).await,
        };
        // What was queued before the grant was known attaches within it.
        let mut queue = queue;
        if let Some(cap) = self.caps.get(&sid).copied() {
            for cmd in queue.iter_mut() {
                if let SessionCommand::Attach { client, .. } = cmd {
                    client.role = client.role.capped(cap);
                }
            }
        }
        // A queue with no attach (a `session/delete` first) attached nothing: its next
        // command opens the session again, attaching first. (No queue: `session/new`
        // attached its creator.)
        let attaches = queue.is_empty()
            || queue
                .iter()
                .any(|c| matches!(c, SessionCommand::Attach { .. }));
        let grantee = self.is_grantee(&sid);
        let mut queue = queue.into_iter();
        while let Some(cmd) = queue.next() {
            let cmd = match grantee {
                true => match self.as_grantee(&sid, &handle, cmd).await {
                    Ok(cmd) => cmd,
                    Err(grant::Kept::Refused) => continue,
                    Err(grant::Kept::Detached) => {
                        // Closed for this connection: what follows opens it again.
                        if let Some(init) = self.init.clone() {
                            for cmd in queue {
                                self.send_session(sid.clone(), cmd, &init).await;
                            }
                        }
                        return;
                    }
                },
                false => cmd,
            };
            if let Err(cmd) = handle.send(cmd).await {
                // Its actor ended between the hub's answer and this send (it closes its
                // queue before it tells the hub): open the session again for the rest.
                if let Some(init) = self.init.clone() {
                    for cmd in std::iter::once(cmd).chain(queue) {
                        self.send_session(sid.clone(), cmd, &init).await;
                    }
                } else {
                    reject(cmd, AcpError::SessionGone).await;
                    for cmd in queue {
                        reject(cmd, AcpError::SessionGone).await;
                    }
                }
                return;
            }
        }
        if attaches {
            self.sessions.insert(sid, Slot::Attached(handle));
        }
    }

    /// Tells a client whose notifications outran the rate limit why it is closed, then
    /// closes it (a WebSocket with 1008).
    async fn close_flooded(&self) {
        tracing::warn!(target: "acpd::audit", principal = %self.ctx.principal_name, "notifications over the rate limit; connection closed");
        let e = crate::error::reply_text(AcpError::NotificationFlood);
        let _ = self.peer.send_raw(e).await;
        // The peer writes what it was given before it stops; a moment is enough for that.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        self.peer.close();
    }

    fn initialize(&mut self, params: Value, responder: Responder) {
        let login = super::initialize::login_offer(
            &params,
            self.ctx.via_shim,
            self.ctx.config.agents.get(&self.ctx.profile),
            &self.ctx.principal_name,
        )
        .cloned();
        let init = Arc::new(params);
        self.init = Some(init.clone());
        let agent = self.agent(init);
        let conn_id = self.ctx.conn_id.clone();
        let busy = match self.ctx.config.sessions.busy_prompts {
            BusyPrompts::Queue => "queue",
            BusyPrompts::Refuse => "refuse",
        };
        self.handlers.spawn(async move {
            let result = match agent.await {
                Ok(agent) => Ok(super::initialize::result(
                    &agent,
                    &conn_id,
                    busy,
                    login.as_ref(),
                )),
                Err(e) => Err(e.into()),
            };
            responder.respond(result).await;
            Done::Nothing
        });
    }

    fn agent(
        &self,
        init: Arc<Value>,
    ) -> impl Future<Output = Result<AgentHandle, AcpError>> + use<> {
        let pool = self.ctx.hub.pool().clone();
        let key = self.agent_key();
        async move { pool.get(key, init).await.map_err(AcpError::from) }
    }
}

/// Answers a command that never reached its session.
async fn reject(cmd: SessionCommand, e: AcpError) {
    cmd.reject(e.into()).await
}

/// A session that did not open: what was queued for it gets the error (deleting what does
/// not exist succeeds, as ACP's session/delete has it).
async fn not_opened(queue: VecDeque<SessionCommand>, e: AcpError) {
    let not_found = matches!(e, AcpError::SessionNotFound(_));
    let e: ResponseError = e.into();
    for cmd in queue {
        match cmd {
            SessionCommand::Delete { responder, .. } if not_found => {
                responder.respond(Ok(json!({}))).await
            }
            cmd => cmd.reject(e.clone()).await,
        }
    }
}

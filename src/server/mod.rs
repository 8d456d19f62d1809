//! The daemon: `serve` wires the store, the agent pool and the session hub to the
//! listeners (HTTP/WebSocket via axum, raw TCP), and runs the shutdown sequence.

mod auth;
pub mod cert;
pub mod origin;
mod peer;
mod registry;
mod streamable;
mod tcp;
pub mod tls;

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{FromRef, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acp::connection::{self, ConnectionCtx};
use crate::agent::AgentPool;
use crate::config::Config;
use crate::session::SessionHub;
use crate::transport;
use acpd_store::{Store, StoreError, StoreOptions};

pub use auth::{Auth, LOCAL_PRINCIPAL, hash as auth_hash, new_secret as auth_secret};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot prepare data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("auth setup: {0}")]
    Auth(String),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
}

/// Everything the request handlers share.
#[derive(Clone)]
struct AppState {
    config: Arc<Config>,
    hub: SessionHub,
    auth: Auth,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    store: Store,
    /// Resumable links (`acpd.resume.v1`, used by acp-shim).
    resume: transport::resume::Resumer,
    /// Live connections: limits and revocation.
    registry: registry::Registry,
    /// Streamable HTTP (`POST`/SSE `GET`/`DELETE` on `/acp`).
    http: streamable::HttpState,
    /// The web console, unless `web_console = false`: its cookie is a credential on `/acp`.
    web: Option<crate::web::WebState>,
    /// Remote agent logins running now (`/acp/login`).
    logins: crate::login::Logins,
}

impl FromRef<AppState> for streamable::HttpState {
    fn from_ref(st: &AppState) -> streamable::HttpState {
        st.http.clone()
    }
}

/// The running core without listeners: store, agent pool, session hub. `acpd stdio` uses it
/// directly; `serve` puts listeners in front.
pub struct Core {
    pub config: Arc<Config>,
    pub store: Store,
    pub hub: SessionHub,
    pub tasks: TaskTracker,
    /// Closes client connections ("reconnect later"); fired first in a drain.
    pub drain: CancellationToken,
    /// Stops sessions and agents; fired once running turns are done or the grace is over.
    pub stop: CancellationToken,
    /// The accept gate of every listener (the MCP tunnel's too).
    pub gate: crate::transport::gate::Gate,
}

/// How long cancelled turns get to wind down (the agent answering `cancelled`).
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long tasks get to end once everything has been told to stop.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl Core {
    pub async fn start(config: Config) -> Result<Core, ServeError> {
        // Whatever the store: the token and the built-in agent's transcripts live there too.
        crate::config::data_dir::prepare(&config).map_err(|e| ServeError::DataDir {
            path: e.path,
            source: e.source,
        })?;
        let store = Store::open(
            &config.store_url,
            StoreOptions {
                exclusive: true,
                // A drain gives this replica's leases back after the last append.
                replica: config.cluster.as_ref().map(|c| acpd_store::ReplicaOptions {
                    id: c.replica_id.clone(),
                    lease_ttl: c.lease_ttl,
                }),
                ..crate::session::journal_form::store_options()
            },
        )
        .await?;
        let config = Arc::new(config);
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let cluster = config
            .cluster
            .as_ref()
            .map(|c| crate::cluster::Cluster::spawn(c, store.clone(), &tasks, stop.clone()));
        let pool = AgentPool::spawn(config.clone(), tasks.clone(), stop.clone());
        let gate = crate::transport::gate::Gate::new(&config.limits);
        let mcp = crate::mcp_tunnel::McpTunnels::new(&tasks, stop.clone(), gate.clone());
        let hub = SessionHub::spawn(
            store.clone(),
            pool,
            config.sessions.clone(),
            mcp.clone(),
            cluster,
            tasks.clone(),
            stop.clone(),
        );
        Ok(Core {
            config,
            store,
            hub,
            tasks,
            drain: CancellationToken::new(),
            stop,
            gate,
        })
    }

    /// The drain: close client connections (they reconnect later; turns keep running,
    /// journaled), let running turns finish within `shutdown_grace`, cancel the rest, stop
    /// sessions and agents, flush and close the store.
    pub async fn shutdown(self) {
        self.drain.cancel();
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        let turns_done = |hub: &SessionHub| hub.running_turns() == 0;
        if !wait_until(deadline, || turns_done(&self.hub)).await {
            tracing::warn!(
                turns = self.hub.running_turns(),
                "shutdown grace over: cancelling running turns"
            );
            self.hub.cancel_all().await;
            let cancel_deadline = tokio::time::Instant::now() + CANCEL_GRACE;
            if !wait_until(cancel_deadline, || turns_done(&self.hub)).await {
                tracing::warn!(
                    turns = self.hub.running_turns(),
                    "turns did not end after cancel"
                );
            }
        }
        self.stop.cancel();
        self.tasks.close();
        if tokio::time::timeout(STOP_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some tasks did not stop in time");
        }
        self.store.close().await;
        tracing::info!("shutdown complete");
    }
}

/// Polls `done` until it holds or `deadline` passes; says whether it held.
async fn wait_until(deadline: tokio::time::Instant, done: impl Fn() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs the daemon on `listener` (and `tcp`, if given) until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    tcp: Option<TcpListener>,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    crate::metrics::install();
    let core = Core::start(config).await?;
    let auth = Auth::setup(&core.config, core.store.clone()).await?;
    let state = app_state(&core, auth);
    let gate = core.gate.clone();
    if let Some(tcp) = tcp {
        let addr = tcp.local_addr()?;
        tracing::info!(%addr, "newline-delimited TCP listener: tcp://{addr}");
        core.tasks.spawn(tcp::accept(
            tcp,
            state.clone(),
            gate.clone(),
            shutdown.clone(),
        ));
    }
    let app = app(&core, state, &shutdown).await?;
    listen(listener, app, &core, shutdown).await?;
    tracing::info!("listeners stopped; shutting down sessions");
    core.shutdown().await;
    Ok(())
}

/// The state every route shares: the connection registry, Streamable HTTP, the console and
/// the resumable links, around the core.
fn app_state(core: &Core, auth: Auth) -> AppState {
    let registry = registry::Registry::spawn(
        core.store.clone(),
        core.hub.clone(),
        core.config.limits.max_connections,
        core.config.limits.max_connections_per_principal,
        // Replicas hear of revocations made anywhere at once (LISTEN), not only at polls.
        core.config
            .cluster
            .as_ref()
            .and_then(|_| core.store.revocation_signals()),
        &core.tasks,
        core.stop.clone(),
    );
    let http = streamable::HttpState {
        config: core.config.clone(),
        hub: core.hub.clone(),
        auth: auth.clone(),
        tasks: core.tasks.clone(),
        shutdown: core.drain.clone(),
        registry: registry.clone(),
        conns: transport::http_stream::Connections::new(core.config.resume_grace),
        gate: core.gate.clone(),
    };
    let logins = crate::login::Logins::default();
    let web = core.config.web_console.then(|| {
        crate::web::WebState::new(
            core.config.clone(),
            core.store.clone(),
            core.hub.clone(),
            (auth.local_principal(), LOCAL_PRINCIPAL),
            logins.clone(),
        )
    });
    AppState {
        config: core.config.clone(),
        hub: core.hub.clone(),
        web: web.clone(),
        logins,
        auth,
        tasks: core.tasks.clone(),
        shutdown: core.drain.clone(),
        store: core.store.clone(),
        registry,
        http,
        resume: transport::resume::Resumer::spawn(
            transport::resume::ResumeSettings {
                grace: core.config.resume_grace,
                keepalive: core.config.keepalive,
                max_buffer_bytes: 64 * 1024 * 1024,
                max_message_bytes: core.config.limits.max_message_bytes,
            },
            core.tasks.clone(),
            core.drain.clone(),
        ),
    }
}

/// The routes: `/acp` behind the origin guard, the peer link, health, the console, `/metrics`
/// (here with a token, or on a listener of its own without).
async fn app(
    core: &Core,
    state: AppState,
    shutdown: &CancellationToken,
) -> Result<Router, ServeError> {
    let web = state.web.clone();
    let gate = core.gate.clone();
    let mut origins = origin::Origins::new(core.config.allowed_origins.clone());
    if web.is_some() {
        origins = origins.with_console(core.config.tls.is_some(), core.config.no_auth);
    }
    let mut app = Router::new()
        .route(
            "/acp",
            get(acp_get)
                .post(streamable::post)
                .delete(streamable::delete),
        )
        .route("/acp/login", get(login_upgrade))
        .route_layer(axum::middleware::from_fn_with_state(origins, origin::guard))
        .route(crate::cluster::link::PEER_PATH, get(peer::upgrade))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz));
    if let Some(web) = web {
        app = app.merge(crate::web::router(web));
    }
    match core.config.metrics_listen {
        None => app = app.route("/metrics", get(metrics_with_token)),
        // A listener of its own for /metrics: no token there, and nothing else on it.
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            tracing::info!(addr = %listener.local_addr()?, "metrics listener (no token): http://{}/metrics", listener.local_addr()?);
            let metrics = Router::new().route("/metrics", get(metrics_text));
            core.tasks.spawn(crate::transport::listen::serve_plain(
                listener,
                metrics,
                gate.clone(),
                core.tasks.clone(),
                shutdown.clone(),
            ));
        }
    }
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            core.config.limits.max_message_bytes,
            declared_body_limit,
        ))
        .with_state(state);
    Ok(app)
}

/// Serves `app` on the main listener (TLS or plain) until `shutdown` fires.
async fn listen(
    listener: TcpListener,
    app: Router,
    core: &Core,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let gate = core.gate.clone();
    if let Some(files) = core.config.tls.clone() {
        let tls = tls::TlsListener::new(listener, files)?;
        tracing::info!(addr = %tls.local_addr()?, "acpd listening: wss://{}/acp", tls.local_addr()?);
        tls.serve(app, gate, core.tasks.clone(), shutdown.clone())
            .await?;
    } else {
        if core.config.insecure {
            tracing::warn!(
                "TLS is OFF (--insecure): tokens and everything the agent reads or writes cross the network in clear"
            );
        }
        tracing::info!(addr = %listener.local_addr()?, "acpd listening: ws://{}/acp", listener.local_addr()?);
        crate::transport::listen::serve_plain(
            listener,
            app,
            gate,
            core.tasks.clone(),
            shutdown.clone(),
        )
        .await?;
    }
    Ok(())
}

/// A request whose declared body (`Content-Length`) is past `max_message_bytes` is `413` at
/// once, before a byte of it is read (hyper then closes the connection rather than drain
/// it): no route waits for a body it would refuse anyway.
async fn declared_body_limit(
    State(max): State<usize>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        let refusal = "request body too big for acpd's max_message_bytes\n";
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            [(header::CONNECTION, "close")],
            refusal,
        )
            .into_response();
    }
    next.run(req).await
}

#[derive(Deserialize)]
struct AcpQuery {
    agent: Option<String>,
}

/// Read buffer of a client WebSocket (see `acp_upgrade`): tungstenite keeps all of it
/// resident (zero-filled) for the socket's life, and clients send little (prompts, acks). A
/// bigger frame still gets a buffer of its size, read this many bytes per call.
const WS_READ_BUFFER: usize = 1024;

/// `GET /acp`: a WebSocket upgrade, or else the Streamable HTTP SSE stream.
async fn acp_get(
    State(st): State<AppState>,
    Query(q): Query<AcpQuery>,
    uri: Uri,
    headers: HeaderMap,
    pass: Option<axum::Extension<crate::transport::listen::Pass>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let pass = pass.map(|axum::Extension(p)| p);
    match ws {
        Ok(ws) => acp_upgrade(st, q, &uri, headers, ws, pass).await,
        Err(_) if streamable::wants_stream(&headers) => {
            streamable::stream(st.http.clone(), headers, pass).await
        }
        Err(rejection) => rejection.into_response(),
    }
}

/// Registers a new client connection (connection limits, revocation); a refusal is audited
/// and answered 429 with the reason. The WebSocket upgrade and Streamable HTTP share it.
async fn register(
    registry: &registry::Registry,
    conn_id: &str,
    identity: &auth::Identity,
    kick: CancellationToken,
) -> Result<registry::Registration, Response> {
    let token = identity.token_id.clone();
    registry
        .open(conn_id, &identity.principal, token, kick)
        .await
        .map_err(|e| {
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
            tracing::warn!(target: "acpd::audit", principal = %identity.principal, reason = %e, "connection refused");
            (StatusCode::TOO_MANY_REQUESTS, format!("{e}\n")).into_response()
        })
}

/// The context of a client connection of `identity` on agent `profile`, whatever the
/// transport.
fn connection_ctx(
    conn_id: &str,
    identity: auth::Identity,
    profile: String,
    config: &Arc<Config>,
    hub: &SessionHub,
) -> ConnectionCtx {
    ConnectionCtx {
        conn_id: Arc::from(conn_id),
        principal: identity.principal,
        principal_name: identity.name,
        config: config.clone(),
        profile,
        hub: hub.clone(),
        max_requests_per_second: config.limits.max_requests_per_second,
        mcp_tunnel: false,
        via_shim: false,
    }
}

/// The web console's cookie as the upgrade's credential: only without a bearer token, and
/// only from the console's own origin or an allowed one (a page elsewhere must not ride on
/// the cookie).
/// `None`: the request has no console cookie (or the console is off).
async fn console_identity(
    st: &AppState,
    headers: &HeaderMap,
    uri: &Uri,
) -> Option<Result<auth::Identity, Response>> {
    let web = st.web.as_ref()?;
    if headers.contains_key(header::AUTHORIZATION) || !web.has_cookie(headers) {
        return None;
    }
    if !web.trusted_origin(headers, uri) {
        tracing::warn!(target: "acpd::audit", "refused the console cookie on an upgrade from another origin");
        let refusal = "the console's cookie is accepted from the console's own origin only\n";
        return Some(Err((StatusCode::FORBIDDEN, refusal).into_response()));
    }
    Some(match web.identity(headers).await {
        Ok(Some(w)) => Ok(auth::Identity {
            principal: w.principal,
            name: w.name,
            token_id: w.token_id,
        }),
        Ok(None) => Err((StatusCode::UNAUTHORIZED, "signed out or expired\n").into_response()),
        Err(resp) => Err(resp),
    })
}

/// Who is upgrading (the console's cookie, else a token) and the agent profile they asked for.
#[allow(clippy::result_large_err)]
async fn caller(
    st: &AppState,
    q: &AcpQuery,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(auth::Identity, String), Response> {
    let checked = match console_identity(st, headers, uri).await {
        Some(checked) => checked,
        None => st.auth.check(headers).await,
    };
    let identity = checked?;
    let Some(profile) = st.config.profile(q.agent.as_deref()).map(str::to_owned) else {
        return Err((StatusCode::NOT_FOUND, "unknown agent profile\n").into_response());
    };
    Ok((identity, profile))
}

/// The upgrade: authenticate, pick the agent profile, upgrade to WebSocket.
async fn acp_upgrade(
    st: AppState,
    q: AcpQuery,
    uri: &Uri,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
    pass: Option<crate::transport::listen::Pass>,
) -> Response {
    let (identity, profile) = match caller(&st, &q, uri, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let conn_id = uuid::Uuid::new_v4().to_string();
    // Fired by a drain, or alone when the token is revoked: the connection ends and a plain
    // socket is closed with 1008 (a drain closes it with 1001).
    let kick = st.shutdown.child_token();
    // A resumed link keeps the registration of the connection it continues.
    let registration = if headers.contains_key(transport::resume::RESUME_HEADER) {
        None
    } else {
        match register(&st.registry, &conn_id, &identity, kick.clone()).await {
            Ok(r) => Some(r),
            Err(refused) => return refused,
        }
    };
    let mut ctx = connection_ctx(&conn_id, identity, profile, &st.config, &st.hub);
    ctx.mcp_tunnel = true;
    let max = st.config.limits.max_message_bytes;
    // Frames somewhat over the limit are read and answered with an error; far over it the
    // socket is closed (1009) rather than buffering without bound.
    let hard_cap = max.saturating_mul(4).max(max + 1024 * 1024);
    // tungstenite zero-fills its whole read buffer before every read, so each idle socket
    // keeps all of it resident: 128 KiB by default. Clients send little; big frames still
    // get a buffer of their size.
    let ws = ws.read_buffer_size(WS_READ_BUFFER);
    // acp-shim asks for a resumable link; plain RFD clients take the path below.
    let resumable = ws
        .requested_protocols()
        .any(|p| p.as_bytes() == transport::resume::SUBPROTOCOL.as_bytes());
    if resumable || headers.contains_key(transport::resume::RESUME_HEADER) {
        ctx.via_shim = true;
        let ws = ws.max_message_size(hard_cap).max_frame_size(hard_cap);
        let principal = ctx.principal.clone();
        let start = move |link| async move {
            let _registration = registration;
            let _pass = pass;
            connection::run(link, ctx, kick).await
        };
        return st
            .resume
            .upgrade(ws, &headers, &principal, conn_id, start)
            .await;
    }
    let tasks = st.tasks.clone();
    let shutdown = st.shutdown.clone();
    let keepalive = st.config.keepalive;
    let mut resp = ws
        .max_message_size(hard_cap)
        .max_frame_size(hard_cap)
        .on_upgrade(move |socket| {
            tasks.track_future(async move {
                let _registration = registration;
                // The socket's descriptor stays counted by the gate while it is open.
                let _pass = pass;
                let (link, pump) =
                    transport::ws::pump(socket, max, keepalive, shutdown.child_token());
                let pump = tokio::spawn(pump);
                connection::run(link, ctx, kick).await;
                let _ = pump.await;
            })
        });
    if let Ok(v) = HeaderValue::from_str(&conn_id) {
        resp.headers_mut().insert("acp-connection-id", v);
    }
    resp
}

/// `GET /acp/login`: a remote agent login (`crate::login`), for a token or the console.
async fn login_upgrade(
    State(st): State<AppState>,
    Query(q): Query<crate::login::LoginQuery>,
    uri: Uri,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let agent = AcpQuery {
        agent: q.agent.clone(),
    };
    let (identity, profile) = match caller(&st, &agent, &uri, &headers).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    crate::login::upgrade(
        ws,
        crate::login::LoginRequest {
            principal_name: identity.name,
            profile: st.config.agents.get(&profile).cloned(),
            logins: st.logins.clone(),
            tasks: st.tasks.clone(),
            shutdown: st.shutdown.clone(),
            cols: q.cols.unwrap_or(80),
            rows: q.rows.unwrap_or(24),
        },
    )
}

/// `GET /metrics` on the main listener: a valid token first (none under `--no-auth`), since
/// the figures tell who is busy and how much.
async fn metrics_with_token(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match st.auth.check(&headers).await {
        Ok(_) => metrics_text().await,
        Err(resp) => resp,
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics_text() -> Response {
    match crate::metrics::install() {
        Some(h) => ([("content-type", "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "metrics unavailable\n").into_response(),
    }
}

async fn readyz(State(st): State<AppState>) -> Response {
    if st.shutdown.is_cancelled() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match st.store.ping().await {
        Ok(()) => "ready\n".into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: store unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "store unreachable\n").into_response()
        }
    }
}

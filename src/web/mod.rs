//! The web console: pages and assets served at `/` on the daemon's own listener, the JSON API
//! they read (`/web/api/…`), sign-in by one-time code or pasted token (`cookie.rs`), and the
//! Content-Security-Policy violation counter.
//!
//! The pages are static shells embedded in the binary; our own JavaScript modules fill them
//! from the JSON API (conversation HTML rendered and sanitized here, `render.rs`) and speak
//! ACP over the `/acp` WebSocket with the cookie, attaching to a session like any client.
//! Its store is a `WebStore`: sign-in credentials, and session rows, grants and journal pages
//! read-only; what changes a session goes over `/acp` through the session layer.

mod api;
mod cookie;
mod csp;
mod logins;
mod render;
mod usage;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::config::Config;
use crate::session::SessionHub;
use acpd_store::WebStore;

pub use cookie::{is_own_origin, loopback_host, sha256_hex};

/// CSP reports received (`POST /web/csp`): the tests assert it stays at zero.
pub const CSP_VIOLATIONS_TOTAL: &str = "acpd_web_csp_violations_total";

/// The policy of every console response: nothing from another origin, no inline script or
/// style, no framing; violations are reported to acpd itself.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'; report-uri /web/csp; report-to csp";

/// Who a console request speaks for.
#[derive(Debug, Clone)]
pub struct WebIdentity {
    pub principal: String,
    pub name: String,
    /// The token the cookie was exchanged for (`None`: a one-time code, or `--no-auth`).
    pub token_id: Option<String>,
}

/// What the console's handlers share.
#[derive(Clone)]
pub struct WebState {
    config: Arc<Config>,
    store: WebStore,
    hub: SessionHub,
    /// `--no-auth`: every request is the local principal (id, name), no cookie needed.
    no_auth: Option<(String, String)>,
    /// `POST /web/csp`'s rate and log summary (a std Mutex: one decision, no await).
    csp: Arc<std::sync::Mutex<csp::CspReports>>,
    /// The daemon's running agent logins (`/acp/login`), so the console can say beforehand
    /// why a login would be refused.
    logins: crate::login::Logins,
}

impl WebState {
    /// `local`: the local principal (id, name), who everyone is under `--no-auth`.
    pub fn new(
        config: Arc<Config>,
        store: impl Into<WebStore>,
        hub: SessionHub,
        local: (&str, &str),
        logins: crate::login::Logins,
    ) -> WebState {
        metrics::describe_counter!(
            CSP_VIOLATIONS_TOTAL,
            "Content-Security-Policy violation reports the web console's pages sent"
        );
        // Registered at zero, so `/metrics` shows it before the first report.
        metrics::counter!(CSP_VIOLATIONS_TOTAL).absolute(0);
        let no_auth = config
            .no_auth
            .then(|| (local.0.to_owned(), local.1.to_owned()));
        WebState {
            config,
            store: store.into(),
            hub,
            no_auth,
            csp: Arc::default(),
            logins,
        }
    }

    fn tls(&self) -> bool {
        self.config.tls.is_some()
    }

    /// The identity of a request's console cookie, checked against the store; `None` when it
    /// has no valid one.
    pub async fn identity(&self, headers: &HeaderMap) -> Result<Option<WebIdentity>, Response> {
        if let Some((principal, name)) = &self.no_auth {
            if !loopback_host(headers) {
                return Ok(None);
            }
            return Ok(Some(WebIdentity {
                principal: principal.clone(),
                name: name.clone(),
                token_id: None,
            }));
        }
        cookie::identity(&self.store, headers, self.tls()).await
    }

    /// Whether a request's `Origin` may act with the console's cookie: the console's own
    /// (under `--no-auth` only when addressed to a loopback name), or one in
    /// `allowed_origins` (the public origin of a proxy that terminates TLS in front of acpd).
    pub fn trusted_origin(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        let own = is_own_origin(headers, uri, self.tls())
            && (self.no_auth.is_none() || loopback_host(headers));
        own || headers
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::config::normalize_origin)
            .is_some_and(|o| self.config.allowed_origins.contains(&o))
    }

    /// Whether the request carries the console's cookie at all.
    pub fn has_cookie(&self, headers: &HeaderMap) -> bool {
        cookie::secret(headers, self.tls()).is_some()
    }
}

/// The console's routes, with their state given; merged into the daemon's router.
pub fn router<S: Clone + Send + Sync + 'static>(st: WebState) -> Router<S> {
    Router::new()
        .route("/", get(sessions_page))
        .route("/login", get(login_page))
        .route("/s/{id}", get(session_page))
        .route("/agents/{name}/login", get(agent_login_page))
        .route("/web/{asset}", get(asset))
        .route("/web/csp", post(csp_report))
        .route("/web/api/login", post(cookie::login))
        .route("/web/api/logout", post(cookie::logout))
        .route("/web/api/me", get(api::me))
        .route("/web/api/agents", get(api::agents))
        .route("/web/api/sessions", get(api::sessions))
        .route("/web/api/sessions/{id}", get(api::session))
        .route("/web/api/sessions/{id}/entries", get(api::entries))
        .route("/web/api/sessions/{id}/usage", get(usage::session))
        .route("/web/api/usage", get(usage::principal))
        .route("/web/api/logins", get(logins::list))
        .layer(axum::middleware::from_fn_with_state(st.clone(), guard))
        .with_state(st)
}

/// Every console request: state-changing ones must come from the console's own origin (CSRF);
/// every answer gets the security headers.
async fn guard(State(st): State<WebState>, req: Request, next: Next) -> Response {
    let state_changing = !matches!(req.method().as_str(), "GET" | "HEAD" | "OPTIONS");
    // CSP reports come from the browser itself, with no Origin; they change only a counter.
    let trusted = st.trusted_origin(req.headers(), req.uri());
    if state_changing && req.uri().path() != "/web/csp" && !trusted {
        tracing::warn!(target: "acpd::audit", path = %req.uri().path(), "web console: refused a state-changing request from another origin");
        return secured((StatusCode::FORBIDDEN, "origin not allowed\n").into_response());
    }
    secured(next.run(req).await)
}

fn secured(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(k, HeaderValue::from_static(v));
    };
    set(h, "content-security-policy", CSP);
    set(h, "reporting-endpoints", "csp=\"/web/csp\"");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "no-referrer");
    set(h, "x-frame-options", "DENY");
    set(h, "cache-control", "no-store");
    resp
}

const INDEX_HTML: &str = include_str!("assets/index.html");
const SESSION_HTML: &str = include_str!("assets/session.html");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const AGENT_LOGIN_HTML: &str = include_str!("assets/agent-login.html");
const NOT_FOUND_HTML: &str = include_str!("assets/not_found.html");

fn html(status: StatusCode, body: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// `GET /`: the sessions page, or the sign-in page's address when not signed in.
async fn sessions_page(State(st): State<WebState>, headers: HeaderMap) -> Response {
    match st.identity(&headers).await {
        Ok(Some(_)) => html(StatusCode::OK, INDEX_HTML),
        Ok(None) => Redirect::to("/login").into_response(),
        Err(resp) => resp,
    }
}

async fn login_page() -> Response {
    html(StatusCode::OK, LOGIN_HTML)
}

/// `GET /agents/{name}/login`: the page that runs an agent's login (`logins.rs`); the page
/// itself says when the principal may not (the name is read by its script).
async fn agent_login_page(State(st): State<WebState>, headers: HeaderMap) -> Response {
    match st.identity(&headers).await {
        Ok(Some(_)) => html(StatusCode::OK, AGENT_LOGIN_HTML),
        Ok(None) => Redirect::to("/login").into_response(),
        Err(resp) => resp,
    }
}

/// `GET /s/{id}`: a session's page; another principal's session is exactly an unknown one.
async fn session_page(
    State(st): State<WebState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let who = match st.identity(&headers).await {
        Ok(Some(who)) => who,
        Ok(None) => return Redirect::to("/login").into_response(),
        Err(resp) => return resp,
    };
    match api::visible(&st, &who, &id).await {
        Ok(Some(_)) => html(StatusCode::OK, SESSION_HTML),
        Ok(None) => html(StatusCode::NOT_FOUND, NOT_FOUND_HTML),
        Err(resp) => resp,
    }
}

/// The embedded assets, by name.
fn asset_body(name: &str) -> Option<(&'static str, &'static str)> {
    const JS: &str = "text/javascript; charset=utf-8";
    Some(match name {
        "style.css" => ("text/css; charset=utf-8", include_str!("assets/style.css")),
        "common.js" => (JS, include_str!("assets/common.js")),
        "sessions.js" => (JS, include_str!("assets/sessions.js")),
        "session.js" => (JS, include_str!("assets/session.js")),
        "acp.js" => (JS, include_str!("assets/acp.js")),
        "login.js" => (JS, include_str!("assets/login.js")),
        "agent-login.js" => (JS, include_str!("assets/agent-login.js")),
        "usage.js" => (JS, include_str!("assets/usage.js")),
        _ => return None,
    })
}

async fn asset(Path(name): Path<String>) -> Response {
    match asset_body(&name) {
        Some((kind, body)) => ([(header::CONTENT_TYPE, kind)], body).into_response(),
        None => html(StatusCode::NOT_FOUND, NOT_FOUND_HTML),
    }
}

/// Largest CSP report read; a bigger one is counted all the same.
const CSP_REPORT_MAX: usize = 64 * 1024;

/// `POST /web/csp`: a browser's violation report (`report-uri` or Reporting API shape).
/// Anyone can post here (browsers send reports without credentials): rate-limited, and
/// logged as a count (`csp.rs`), the first report of a line with its first 300 bytes.
async fn csp_report(State(st): State<WebState>, body: axum::body::Body) -> Response {
    let verdict = st
        .csp
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .report(std::time::Instant::now());
    if verdict == csp::Verdict::Refuse {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    metrics::counter!(CSP_VIOLATIONS_TOTAL).increment(1);
    if let csp::Verdict::Log { count } = verdict {
        let bytes = axum::body::to_bytes(body, CSP_REPORT_MAX)
            .await
            .unwrap_or_default();
        tracing::warn!(
            reports_since_last_line = count,
            this_one = %String::from_utf8_lossy(&bytes[..bytes.len().min(300)]),
            "web console: Content-Security-Policy violations reported (acpd_web_csp_violations_total)"
        );
    }
    StatusCode::NO_CONTENT.into_response()
}

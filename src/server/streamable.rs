//! `POST`, `GET` (SSE) and `DELETE` on `/acp`: the Streamable HTTP half of the RFD beside the
//! WebSocket upgrade. Each request is authenticated like the upgrade (bearer header); a
//! connection belongs to the principal that opened it and is unknown (404) to anyone else.

use acpd_protocol::method;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::Auth;
use super::registry::Registry;
use crate::acp::connection;
use crate::config::Config;
use crate::session::SessionHub;
use crate::transport::http_stream::{Connections, Handle, StreamError, request_route};
use acpd_wire::InFrame;

/// The connection header of the RFD (and of the 101 of a WebSocket).
pub const CONNECTION_HEADER: &str = "acp-connection-id";
const SESSION_HEADER: &str = "acp-session-id";
/// How long the `initialize` POST waits for its answer.
const INIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub config: Arc<Config>,
    pub hub: SessionHub,
    pub auth: Auth,
    pub tasks: TaskTracker,
    /// The drain: every connection's kick is a child.
    pub shutdown: CancellationToken,
    pub registry: Registry,
    pub conns: Connections,
    /// The accept gate: an open SSE stream leaves its pending pool and takes a place under
    /// `max_streams_per_principal` instead.
    pub gate: crate::transport::gate::Gate,
}

#[derive(Deserialize)]
pub struct AgentQuery {
    agent: Option<String>,
}

/// A JSON-RPC error with `id: null`, as the HTTP answer itself.
fn rpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    let body = crate::error::reply(&serde_json::Value::Null, code, message);
    (status, axum::Json(body)).into_response()
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, text).into_response()
}

fn conn_id(headers: &HeaderMap) -> Option<&str> {
    headers.get(CONNECTION_HEADER).and_then(|v| v.to_str().ok())
}

/// The caller's connection, or the answer for a missing header (400) or an unknown id (404).
#[allow(clippy::result_large_err)]
fn lookup(st: &HttpState, headers: &HeaderMap, principal: &str) -> Result<Handle, Response> {
    let Some(id) = conn_id(headers) else {
        return Err(plain(
            StatusCode::BAD_REQUEST,
            "missing Acp-Connection-Id header\n",
        ));
    };
    match st.conns.get(id) {
        Some(h) if h.principal == principal => Ok(h),
        _ => Err(plain(StatusCode::NOT_FOUND, "unknown Acp-Connection-Id\n")),
    }
}

/// `POST /acp`: one JSON-RPC message. `initialize` without a connection opens one (200, the
/// answer in the body); anything else goes to its connection (202, the answer on the stream).
pub async fn post(
    State(st): State<HttpState>,
    Query(q): Query<AgentQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let identity = match st.auth.check(&headers).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json\n",
        );
    }
    let max = st.config.limits.max_message_bytes;
    let Ok(bytes) = axum::body::to_bytes(body, max).await else {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "message too big for acpd's max_message_bytes\n",
        );
    };
    metrics::counter!(crate::metrics::BYTES_IN_TOTAL).increment(bytes.len() as u64);
    let Ok(text) = String::from_utf8(bytes.to_vec()) else {
        return rpc_error(StatusCode::BAD_REQUEST, -32700, "Parse error: not UTF-8");
    };
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => return rpc_error(StatusCode::BAD_REQUEST, -32700, "Parse error"),
    };
    if value.is_array() {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "Invalid Request: batches are not supported",
        );
    }
    if conn_id(&headers).is_some() {
        let handle = match lookup(&st, &headers, &identity.principal) {
            Ok(h) => h,
            Err(resp) => return resp,
        };
        let session = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok());
        let route = request_route(&value, session);
        return match handle.post(InFrame::Text(text), route).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(_) => plain(StatusCode::NOT_FOUND, "unknown Acp-Connection-Id\n"),
        };
    }
    if value.get("method").and_then(|m| m.as_str()) != Some(method::INITIALIZE) {
        return plain(
            StatusCode::BAD_REQUEST,
            "missing Acp-Connection-Id header (only initialize opens a connection)\n",
        );
    }
    initialize(st, q, identity, text).await
}

/// Opens a connection with its `initialize` and answers with the result.
async fn initialize(
    st: HttpState,
    q: AgentQuery,
    identity: super::auth::Identity,
    text: String,
) -> Response {
    let Some(profile) = st.config.profile(q.agent.as_deref()).map(str::to_owned) else {
        return plain(StatusCode::NOT_FOUND, "unknown agent profile\n");
    };
    let conn_id = uuid::Uuid::new_v4().to_string();
    let kick = st.shutdown.child_token();
    let registration = match super::register(&st.registry, &conn_id, &identity, kick.clone()).await
    {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    let principal = identity.principal.clone();
    let ctx = super::connection_ctx(&conn_id, identity, profile, &st.config, &st.hub);
    let (link, opened) = st
        .conns
        .open(conn_id.clone(), principal, kick.clone(), &st.tasks);
    st.tasks.spawn(async move {
        let _registration = registration;
        connection::run(link, ctx, kick).await;
    });
    if opened.handle.post(InFrame::Text(text), None).await.is_err() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "connection ended\n");
    }
    match tokio::time::timeout(INIT_TIMEOUT, opened.first).await {
        Ok(Ok(answer)) => {
            let mut resp = (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                answer,
            )
                .into_response();
            if let Ok(v) = HeaderValue::from_str(&conn_id) {
                resp.headers_mut().insert(CONNECTION_HEADER, v);
            }
            resp
        }
        _ => {
            opened.handle.close();
            plain(StatusCode::SERVICE_UNAVAILABLE, "no answer to initialize\n")
        }
    }
}

/// Whether a GET asks for the SSE stream (and is not a WebSocket upgrade).
pub fn wants_stream(headers: &HeaderMap) -> bool {
    !headers.contains_key(header::UPGRADE)
}

/// `GET /acp` with `Accept: text/event-stream`: the connection's stream.
pub async fn stream(
    st: HttpState,
    headers: HeaderMap,
    pass: Option<crate::transport::gate::Pass>,
) -> Response {
    let identity = match st.auth.check(&headers).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let accepts = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"));
    if !accepts {
        return plain(
            StatusCode::NOT_ACCEPTABLE,
            "expected Accept: text/event-stream (or a WebSocket upgrade)\n",
        );
    }
    let handle = match lookup(&st, &headers, &identity.principal) {
        Ok(h) => h,
        Err(resp) => return resp,
    };
    let (session, last) = match stream_headers(&headers) {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    // No ownership check here: a session stream carries only what this connection itself is
    // sent about the session (the answers to its own requests naming it, and the updates
    // of a session it attached, which the session layer authorises: owner or grantee). So a
    // stream for an unknown or not-the-caller's session is opened like any other, empty,
    // and the request that follows is answered on it (`session/load` -32002,
    // `session/delete` `{}`). A 404 here would close the official SDK client's whole
    // transport (it reads 401/403/404/410 on a stream as "the connection is gone"); the
    // stream cannot tell whether the session exists either, so it is no oracle.
    // Authenticated and about to stay open: a place of the principal's own (the connection
    // leaves the pending pool once the stream is open, below).
    let Some(permit) = st.gate.open_stream(&identity.principal) else {
        metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
        tracing::warn!(target: "acpd::audit", principal = %identity.principal, "SSE stream refused: max_streams_per_principal");
        return plain(
            StatusCode::TOO_MANY_REQUESTS,
            "too many open SSE streams for this principal (max_streams_per_principal)\n",
        );
    };
    let scoped = session.is_some();
    let open = match handle.attach(session, last).await {
        Ok(open) => open,
        Err(e) => return stream_refused(e, scoped),
    };
    // Resuming from the journal: the connection attaches the session after the seq, as
    // `_acpd/session/attach` would; its answer goes to no stream.
    if let Some(attach) = open.resume
        && handle.post(InFrame::Text(attach), None).await.is_err()
    {
        return plain(StatusCode::NOT_FOUND, "unknown Acp-Connection-Id\n");
    }
    // Open: the connection leaves the pending pool (as a WebSocket does at its 101), and the
    // permit and the pass live as long as the response body: the stream counts against
    // its principal, and its connection against the descriptor budget, until it ends.
    if let Some(pass) = &pass {
        pass.authenticated();
    }
    let held = (permit, pass);
    let events = futures_util::stream::unfold((open.events, held), |(mut rx, held)| async move {
        let (id, text) = rx.recv().await?;
        let event = Event::default().id(id).data(text);
        Some((Ok::<_, Infallible>(event), (rx, held)))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(st.config.keepalive))
        .into_response()
}

/// A stream request's `Acp-Session-Id` and `Last-Event-ID` (each optional), or its 400.
#[allow(clippy::result_large_err)]
fn stream_headers(headers: &HeaderMap) -> Result<(Option<String>, Option<String>), Response> {
    let session = match headers.get(SESSION_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(s)) if !s.is_empty() => Some(s.to_owned()),
        Some(_) => {
            return Err(plain(
                StatusCode::BAD_REQUEST,
                "Acp-Session-Id: expected a session id\n",
            ));
        }
    };
    let last = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) if event_id(v.trim()) => Some(v.trim().to_owned()),
        Some(_) => {
            return Err(plain(
                StatusCode::BAD_REQUEST,
                "Last-Event-ID: expected an event id of this endpoint (<n> or <seq>.<n>)\n",
            ));
        }
    };
    Ok((session, last))
}

/// The answer to a stream its connection would not open (`scoped`: a session's stream).
fn stream_refused(e: StreamError, scoped: bool) -> Response {
    match e {
        StreamError::Closed => plain(StatusCode::NOT_FOUND, "unknown Acp-Connection-Id\n"),
        StreamError::TooMany => plain(
            StatusCode::TOO_MANY_REQUESTS,
            "too many session streams on this connection\n",
        ),
        // A session's: 409, which the SDK's client reads as "reattach this session"
        // (session/load), leaving the connection and its other sessions alone.
        StreamError::Gone(_) if scoped => plain(
            StatusCode::CONFLICT,
            "Last-Event-ID: this connection cannot resume that session stream from there; session/load here, or open a new connection (initialize) and GET the session's stream with this Last-Event-ID there\n",
        ),
        StreamError::Gone(_) => plain(
            StatusCode::GONE,
            "Last-Event-ID: those events are not held any more; session/load what you need\n",
        ),
    }
}

/// Whether `v` can be one of our SSE ids: `<n>` or `<seq>.<n>`.
fn event_id(v: &str) -> bool {
    let digits = |p: &str| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit());
    match v.split_once('.') {
        None => digits(v),
        Some((a, b)) => digits(a) && digits(b),
    }
}

/// `DELETE /acp`: ends the connection (202).
pub async fn delete(State(st): State<HttpState>, headers: HeaderMap) -> Response {
    let identity = match st.auth.check(&headers).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    match lookup(&st, &headers, &identity.principal) {
        Ok(h) => {
            h.close();
            StatusCode::ACCEPTED.into_response()
        }
        Err(resp) => resp,
    }
}

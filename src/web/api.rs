//! The console's JSON API: who is signed in, the principal's sessions (paged like
//! `session/list`, with what the live session says of itself), one session's settings, and
//! pages of its conversation rendered to sanitized HTML (`render.rs`).
//!
//! Every read goes through `visible`: another principal's session without a grant answers
//! exactly like a missing one (404), so ids leak nothing.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{WebIdentity, WebState, render};
use acpd_store::{ListQuery, SessionRow};

/// Entries per page unless the page asks for fewer.
const PAGE_ENTRIES: u32 = 200;
const MAX_PAGE_ENTRIES: u32 = 1000;

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "web console: store read failed");
    error(StatusCode::SERVICE_UNAVAILABLE, "the store is unavailable")
}

/// The signed-in identity, or the 401 the API answers.
pub(super) async fn signed_in(st: &WebState, headers: &HeaderMap) -> Result<WebIdentity, Response> {
    match st.identity(headers).await? {
        Some(who) => Ok(who),
        None => Err(error(StatusCode::UNAUTHORIZED, "not signed in")),
    }
}

/// The session if `who` owns it or was granted it; `None` for anything else.
pub async fn visible(
    st: &WebState,
    who: &WebIdentity,
    id: &str,
) -> Result<Option<SessionRow>, Response> {
    let Some(row) = st.store.session(id).await.map_err(unavailable)? else {
        return Ok(None);
    };
    if row.principal_id == who.principal {
        return Ok(Some(row));
    }
    let grant = st
        .store
        .live_grant(id, &who.principal)
        .await
        .map_err(unavailable)?;
    Ok(grant.map(|_| row))
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `GET /web/api/me`.
pub async fn me(State(st): State<WebState>, headers: HeaderMap) -> Response {
    match signed_in(&st, &headers).await {
        Ok(who) => Json(json!({ "principal": who.name })).into_response(),
        Err(resp) => resp,
    }
}

/// `GET /web/api/agents`: what the "New session" form offers: the agent profiles (the
/// default first; the built-in agent is always one), and the directories the principal may
/// use (`[roots]`; empty: anywhere but acpd's data directory).
pub async fn agents(State(st): State<WebState>, headers: HeaderMap) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    let default = st.config.default_agent.clone();
    let mut agents = vec![default.clone()];
    let builtin = crate::config::BUILTIN_AGENT.to_owned();
    for name in st.config.agents.keys().chain([&builtin]) {
        if !agents.contains(name) {
            agents.push(name.clone());
        }
    }
    let roots: Vec<String> = st
        .config
        .fs_roots
        .of(&who.name)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    Json(json!({ "agents": agents, "defaultAgent": default, "roots": roots })).into_response()
}

#[derive(Deserialize)]
pub struct ListParams {
    cursor: Option<String>,
}

/// `GET /web/api/sessions?cursor=`: one page, newest first, with each live session's status.
pub async fn sessions(
    State(st): State<WebState>,
    headers: HeaderMap,
    Query(q): Query<ListParams>,
) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    let query = ListQuery {
        principal_id: who.principal.clone(),
        cwd: None,
        agent: None,
        cursor: q.cursor,
        limit: st.config.sessions.list_page_size,
    };
    let page = match st.store.list_sessions(&query).await {
        Ok(p) => p,
        Err(acpd_store::StoreError::InvalidCursor) => {
            return error(StatusCode::BAD_REQUEST, "invalid cursor");
        }
        Err(e) => return unavailable(e),
    };
    let ids: Vec<String> = page.sessions.iter().map(|s| s.id.clone()).collect();
    let live = st.hub.status_of(&ids).await;
    let sessions: Vec<Value> = page
        .sessions
        .iter()
        .map(|s| {
            let status = live.get(&s.id);
            json!({
                "sessionId": s.id,
                "title": s.title,
                "agent": s.agent,
                "cwd": s.cwd,
                "updatedAt": rfc3339(s.updated_at_ms),
                "running": status.is_some_and(|l| l.running),
                "clients": status.map(|l| l.clients.clone()).unwrap_or_default(),
            })
        })
        .collect();
    Json(json!({ "sessions": sessions, "nextCursor": page.next_cursor })).into_response()
}

/// `GET /web/api/sessions/{id}`: what the page needs to offer (modes, config options), and
/// whether a turn is running (anyone's: the page's Cancel works on it).
pub async fn session(
    State(st): State<WebState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    let row = match visible(&st, &who, &id).await {
        Ok(Some(row)) => row,
        Ok(None) => return error(StatusCode::NOT_FOUND, "no such session"),
        Err(resp) => return resp,
    };
    let live = st.hub.status_of(std::slice::from_ref(&row.id)).await;
    let status = live.get(&row.id);
    let meta: Value = serde_json::from_str(&row.meta).unwrap_or(Value::Null);
    let config_values: Value = serde_json::from_str(&row.config_values).unwrap_or(Value::Null);
    Json(json!({
        "sessionId": row.id,
        "title": row.title,
        "agent": row.agent,
        "cwd": row.cwd,
        "updatedAt": rfc3339(row.updated_at_ms),
        "lastSeq": row.last_seq,
        "running": status.is_some_and(|l| l.running),
        "clients": status.map(|l| l.clients.clone()).unwrap_or_default(),
        "own": row.principal_id == who.principal,
        "modes": meta.get("modes"),
        "currentModeId": row.mode_id,
        "configOptions": meta.get("configOptions"),
        "configValues": config_values,
    }))
    .into_response()
}

#[derive(Deserialize)]
pub struct EntriesParams {
    /// The newest entries before this seq (default: the newest of all).
    before: Option<i64>,
    /// Or: the oldest entries after this seq (live catch-up).
    after: Option<i64>,
    limit: Option<u32>,
}

/// `GET /web/api/sessions/{id}/entries?before=SEQ|after=SEQ&limit=N`: blocks of rendered
/// conversation, ascending. `more`: there may be further entries in the direction asked.
pub async fn entries(
    State(st): State<WebState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<EntriesParams>,
) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    match visible(&st, &who, &id).await {
        Ok(Some(_)) => {}
        Ok(None) => return error(StatusCode::NOT_FOUND, "no such session"),
        Err(resp) => return resp,
    }
    let limit = q.limit.unwrap_or(PAGE_ENTRIES).clamp(1, MAX_PAGE_ENTRIES);
    let read = match q.after {
        Some(after) => st.store.journal_after(&id, after, limit.into()).await,
        None => {
            let before = q.before.unwrap_or(i64::MAX);
            st.store.journal_before(&id, before, limit.into()).await
        }
    };
    let entries = match read {
        Ok(e) => e,
        Err(e) => return unavailable(e),
    };
    let more = entries.len() as u32 == limit;
    let blocks = render::blocks(&entries);
    Json(json!({
        "blocks": blocks,
        "firstSeq": entries.first().map(|e| e.seq),
        "lastSeq": entries.last().map(|e| e.seq),
        "more": more,
    }))
    .into_response()
}

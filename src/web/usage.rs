//! The console's usage API: what a session's turns spent with its permission decisions
//! (who answered, which option, automatic or not), and what the signed-in principal spent
//! per day and profile since a date. Reads only, through the `WebStore`; a session is read
//! only when `api::visible` says the principal may see it.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::WebState;
use super::api::{error, signed_in, unavailable, visible};
use acpd_store::{DecisionRow, UsageQuery, UsageRollup};

fn rollup(r: &UsageRollup) -> Value {
    json!({
        "day": r.day,
        "profile": r.profile,
        "turns": r.turns,
        "unknownTurns": r.unknown_turns,
        "inputTokens": r.input_tokens,
        "outputTokens": r.output_tokens,
        "cachedTokens": r.cached_tokens,
        "thoughtTokens": r.thought_tokens,
        "cost": r.cost_micros.map(|c| c as f64 / 1e6),
        "currency": r.currency,
    })
}

fn decision(d: &DecisionRow) -> Value {
    let by: Value = d
        .decided_by
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    json!({
        "at": chrono::DateTime::from_timestamp_millis(d.at_ms).map(|t| t.to_rfc3339()),
        "toolCallId": d.tool_call_id,
        "title": d.title,
        "kind": d.tool_kind,
        "optionId": d.option_id,
        "optionKind": d.option_kind,
        "outcome": d.outcome,
        "decidedBy": by,
        "automatic": d.automatic,
    })
}

/// `GET /web/api/sessions/{id}/usage`: `{ usage: [...], permissions: [...] }`.
pub async fn session(
    State(st): State<WebState>,
    Path(id): Path<String>,
    headers: HeaderMap,
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
    let q = UsageQuery {
        session_id: Some(id.clone()),
        ..UsageQuery::default()
    };
    let usage = match st.store.usage_rollup(&q).await {
        Ok(u) => u,
        Err(e) => return unavailable(e),
    };
    let decisions = match st.store.decisions_of(&id).await {
        Ok(d) => d,
        Err(e) => return unavailable(e),
    };
    Json(json!({
        "usage": usage.iter().map(rollup).collect::<Vec<_>>(),
        "permissions": decisions.iter().map(decision).collect::<Vec<_>>(),
    }))
    .into_response()
}

#[derive(Deserialize)]
pub struct SinceParams {
    /// `YYYY-MM-DD` (default: the first of this month, UTC).
    since: Option<String>,
}

/// `GET /web/api/usage?since=DAY`: the signed-in principal's spending per day and profile.
pub async fn principal(
    State(st): State<WebState>,
    headers: HeaderMap,
    Query(p): Query<SinceParams>,
) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    let since = match p.since {
        Some(s) if chrono::NaiveDate::parse_from_str(&s, "%Y-%m-%d").is_ok() => s,
        Some(_) => return error(StatusCode::BAD_REQUEST, "since must be YYYY-MM-DD"),
        None => chrono::Utc::now().format("%Y-%m-01").to_string(),
    };
    let q = UsageQuery {
        principal_id: Some(who.principal.clone()),
        since_day: Some(since),
        session_id: None,
    };
    match st.store.usage_rollup(&q).await {
        Ok(rows) => Json(json!({
            "principal": who.name,
            "usage": rows.iter().map(rollup).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => unavailable(e),
    }
}

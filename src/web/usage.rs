//! The console's usage API: what a session's turns spent with its permission decisions
//! (who answered, which option, automatic or not) and the budgets that apply to it, and what
//! the signed-in principal spent per day and profile since a date. Reads only, through the
//! `WebStore`; a session is read only when `api::visible` says the principal may see it.
//!
//! A budget's reading here is computed from the store's rollups (`spend_of`, pure) with the
//! same `budget` functions the session actor uses; the actor's ledger also counts a running
//! turn's live reports, so the console's reading is the one as of the last finished turn.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::WebState;
use super::api::{error, signed_in, unavailable, visible};
use crate::budget::{self, Spend, Spent};
use acpd_store::{DecisionRow, SessionRow, UsageQuery, UsageRollup};

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

/// `GET /web/api/sessions/{id}/usage`: `{ usage: [...], permissions: [...], budgets: [...] }`.
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
    let budgets = match budgets_of(&st, &row, &usage).await {
        Ok(b) => b,
        Err(e) => return unavailable(e),
    };
    Json(json!({
        "usage": usage.iter().map(rollup).collect::<Vec<_>>(),
        "permissions": decisions.iter().map(decision).collect::<Vec<_>>(),
        "budgets": budgets,
    }))
    .into_response()
}

/// The readings of the budgets that apply to the session (its owner's and its profile's),
/// as `quota/read` describes them.
async fn budgets_of(
    st: &WebState,
    row: &SessionRow,
    session_rows: &[UsageRollup],
) -> Result<Vec<Value>, acpd_store::StoreError> {
    let budgets = &st.config.budgets;
    if budgets.is_empty() {
        return Ok(vec![]);
    }
    let Some(owner) = st.store.principal(&row.principal_id).await? else {
        return Ok(vec![]);
    };
    let meters = budgets.meters(&owner.name, &row.agent);
    if meters.is_empty() {
        return Ok(vec![]);
    }
    let now = chrono::Utc::now();
    let q = UsageQuery {
        principal_id: Some(row.principal_id.clone()),
        since_day: Some(budget::month_start(now)),
        session_id: None,
    };
    let month = st.store.usage_rollup(&q).await?;
    let spend = spend_of(session_rows, &month, &row.agent, &budgets.currency, now);
    Ok(budget::statuses(&meters, &spend)
        .iter()
        .map(|s| s.describe(&budgets.currency, now))
        .collect())
}

/// What a session spent (`session_rows`) and what its owner spent this month
/// (`month_rows`, every profile), per budget window, counted in `currency`.
fn spend_of(
    session_rows: &[UsageRollup],
    month_rows: &[UsageRollup],
    profile: &str,
    currency: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Spend {
    let (today, month) = (budget::day_of(now), budget::month_start(now));
    let mut s = Spend::default();
    for r in session_rows {
        s.session.add(budget::spent_of(r, currency));
    }
    for r in month_rows.iter().filter(|r| r.day >= month) {
        let spent: Spent = budget::spent_of(r, currency);
        s.principal_month.add(spent);
        if r.day == today {
            s.principal_day.add(spent);
        }
        if r.profile == profile {
            s.profile_month.add(spent);
            if r.day == today {
                s.profile_day.add(spent);
            }
        }
    }
    s
}

#[derive(Deserialize)]
pub struct SinceParams {
    /// `YYYY-MM-DD` (default: the first of this month, UTC).
    since: Option<String>,
}

/// `GET /web/api/usage?since=DAY`: the signed-in principal's spending per day and profile,
/// today's date (UTC, the days' calendar) and the principal's own day and month budgets.
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
    let rows = match st.store.usage_rollup(&q).await {
        Ok(rows) => rows,
        Err(e) => return unavailable(e),
    };
    // The principal's own day and month budgets (those of a session or a profile are on
    // each session's page); read from this month's rows, whatever `since` asked.
    let now = chrono::Utc::now();
    let month_q = UsageQuery {
        since_day: Some(budget::month_start(now)),
        ..q
    };
    let month = match st.store.usage_rollup(&month_q).await {
        Ok(rows) => rows,
        Err(e) => return unavailable(e),
    };
    let budgets = &st.config.budgets;
    let meters: Vec<_> = budgets
        .meters(&who.name, "")
        .into_iter()
        .filter(|m| {
            matches!(m.scope, budget::Scope::Principal(_))
                && m.limit.window != budget::Window::Session
        })
        .collect();
    let spend = spend_of(&[], &month, "", &budgets.currency, now);
    let readings: Vec<Value> = budget::statuses(&meters, &spend)
        .iter()
        .map(|s| s.describe(&budgets.currency, now))
        .collect();
    Json(json!({
        "principal": who.name,
        "today": budget::day_of(now),
        "usage": rows.iter().map(rollup).collect::<Vec<_>>(),
        "budgets": readings,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(day: &str, profile: &str, tokens: i64, cost: Option<(i64, &str)>) -> UsageRollup {
        UsageRollup {
            day: day.into(),
            profile: profile.into(),
            turns: 1,
            input_tokens: Some(tokens),
            output_tokens: Some(1),
            cost_micros: cost.map(|c| c.0),
            currency: cost.map(|c| c.1.to_owned()),
            ..UsageRollup::default()
        }
    }

    #[test]
    fn spend_counts_each_window_from_the_rollups_in_the_budgets_currency() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-06T12:00:00Z")
            .unwrap()
            .to_utc();
        let session = [row("2026-12-06", "a", 9, Some((500_000, "USD")))];
        let month = [
            row("2026-12-06", "a", 9, Some((500_000, "USD"))),
            row("2026-12-06", "b", 99, Some((7_000_000, "EUR"))),
            row("2026-12-01", "a", 999, None),
            row("2026-11-30", "a", 9999, None),
        ];
        let s = spend_of(&session, &month, "a", "USD", now);
        let spent = |tokens, cost_micros| Spent {
            tokens,
            cost_micros,
        };
        assert_eq!(s.session, spent(10, 500_000));
        assert_eq!(s.principal_day, spent(110, 500_000), "EUR is not counted");
        assert_eq!(s.principal_month, spent(1110, 500_000), "November is not");
        assert_eq!(s.profile_day, spent(10, 500_000));
        assert_eq!(s.profile_month, spent(1010, 500_000));
    }
}

//! What turns spent (`turn_usage`) and the rollups read from it, and the permission
//! decisions (`permission_decisions`). Rows are written once and never changed; rollups are
//! sums in the database.

use super::backend::{Pool, db, on_pool, on_write};
use super::rows::Columns;
use super::{Store, StoreError};

/// What one prompt turn spent. `None`: the agent did not say; `known: false` when it said
/// nothing at all (a turn of unknown usage, not of zero).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnUsageRow {
    pub session_id: String,
    pub principal_id: String,
    pub profile: String,
    /// The UTC date the turn ended on, `YYYY-MM-DD`.
    pub day: String,
    pub at_ms: i64,
    pub known: bool,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub thought_tokens: Option<i64>,
    /// Millionths of `currency`'s unit.
    pub cost_micros: Option<i64>,
    pub currency: Option<String>,
}

/// Which turns a rollup sums (`None`: all).
#[derive(Debug, Clone, Default)]
pub struct UsageQuery {
    pub principal_id: Option<String>,
    /// `YYYY-MM-DD`, inclusive.
    pub since_day: Option<String>,
    pub session_id: Option<String>,
}

/// The sums of one principal's turns on one profile, day and currency.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageRollup {
    pub principal_id: String,
    pub profile: String,
    pub day: String,
    pub currency: Option<String>,
    pub turns: i64,
    pub unknown_turns: i64,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub thought_tokens: Option<i64>,
    pub cost_micros: Option<i64>,
}

/// One answer to a permission request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecisionRow {
    pub session_id: String,
    pub at_ms: i64,
    pub tool_call_id: Option<String>,
    pub title: Option<String>,
    pub tool_kind: Option<String>,
    pub option_id: Option<String>,
    /// `allow_once`, `allow_always`, `reject_once`, `reject_always`.
    pub option_kind: Option<String>,
    /// `selected` or `cancelled`.
    pub outcome: String,
    /// Who answered (opaque JSON text to the store); `None` when acpd did.
    pub decided_by: Option<String>,
    pub automatic: bool,
}

impl Store {
    /// Records what a turn spent.
    pub async fn record_turn_usage(&self, row: &TurnUsageRow) -> Result<(), StoreError> {
        record(&self.inner.pool, row).await
    }

    /// Sums of the turns `q` selects, per principal, profile, day and currency.
    pub async fn usage_rollup(&self, q: &UsageQuery) -> Result<Vec<UsageRollup>, StoreError> {
        rollup(&self.inner.pool, q).await
    }

    /// Records an answer to a permission request.
    pub async fn record_decision(&self, row: &DecisionRow) -> Result<(), StoreError> {
        record_decision(&self.inner.pool, row).await
    }

    /// A session's permission decisions, oldest first.
    pub async fn decisions_of(&self, session_id: &str) -> Result<Vec<DecisionRow>, StoreError> {
        decisions_of(&self.inner.pool, session_id).await
    }
}

const INSERT_USAGE: &str = "INSERT INTO turn_usage (session_id, principal_id, profile, day, \
     at_ms, known, input_tokens, output_tokens, cached_tokens, thought_tokens, cost_micros, \
     currency) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// Sums per group; `CAST` because Postgres sums `BIGINT`s as `NUMERIC`.
const ROLLUP: &str = "SELECT principal_id, profile, day, currency, \
     COUNT(*) AS turns, \
     CAST(SUM(CASE WHEN known THEN 0 ELSE 1 END) AS BIGINT) AS unknown_turns, \
     CAST(SUM(input_tokens) AS BIGINT) AS input_tokens, \
     CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, \
     CAST(SUM(cached_tokens) AS BIGINT) AS cached_tokens, \
     CAST(SUM(thought_tokens) AS BIGINT) AS thought_tokens, \
     CAST(SUM(cost_micros) AS BIGINT) AS cost_micros \
     FROM turn_usage \
     WHERE ($1 = '' OR principal_id = $1) AND day >= $2 AND ($3 = '' OR session_id = $3) \
     GROUP BY principal_id, profile, day, currency \
     ORDER BY day, principal_id, profile, currency";

pub(super) async fn record(pool: &Pool, row: &TurnUsageRow) -> Result<(), StoreError> {
    on_write!(pool, |p| {
        sqlx::query(INSERT_USAGE)
            .bind(&row.session_id)
            .bind(&row.principal_id)
            .bind(&row.profile)
            .bind(&row.day)
            .bind(row.at_ms)
            .bind(row.known)
            .bind(row.input_tokens)
            .bind(row.output_tokens)
            .bind(row.cached_tokens)
            .bind(row.thought_tokens)
            .bind(row.cost_micros)
            .bind(&row.currency)
            .execute(p)
            .await
            .map(drop)
            .map_err(db)
    })
}

fn rollup_row(r: &impl Columns) -> Result<UsageRollup, sqlx::Error> {
    Ok(UsageRollup {
        principal_id: r.text("principal_id")?,
        profile: r.text("profile")?,
        day: r.text("day")?,
        currency: r.opt_text("currency")?,
        turns: r.int("turns")?,
        unknown_turns: r.opt_int("unknown_turns")?.unwrap_or(0),
        input_tokens: r.opt_int("input_tokens")?,
        output_tokens: r.opt_int("output_tokens")?,
        cached_tokens: r.opt_int("cached_tokens")?,
        thought_tokens: r.opt_int("thought_tokens")?,
        cost_micros: r.opt_int("cost_micros")?,
    })
}

pub(super) async fn rollup(pool: &Pool, q: &UsageQuery) -> Result<Vec<UsageRollup>, StoreError> {
    on_pool!(pool, |p| {
        let rows = sqlx::query(ROLLUP)
            .bind(q.principal_id.as_deref().unwrap_or(""))
            .bind(q.since_day.as_deref().unwrap_or(""))
            .bind(q.session_id.as_deref().unwrap_or(""))
            .fetch_all(p)
            .await
            .map_err(db)?;
        rows.iter()
            .map(rollup_row)
            .collect::<Result<_, _>>()
            .map_err(db)
    })
}

const INSERT_DECISION: &str = "INSERT INTO permission_decisions (session_id, at_ms, \
     tool_call_id, title, tool_kind, option_id, option_kind, outcome, decided_by, automatic) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

pub(super) async fn record_decision(pool: &Pool, row: &DecisionRow) -> Result<(), StoreError> {
    on_write!(pool, |p| {
        sqlx::query(INSERT_DECISION)
            .bind(&row.session_id)
            .bind(row.at_ms)
            .bind(&row.tool_call_id)
            .bind(&row.title)
            .bind(&row.tool_kind)
            .bind(&row.option_id)
            .bind(&row.option_kind)
            .bind(&row.outcome)
            .bind(&row.decided_by)
            .bind(row.automatic)
            .execute(p)
            .await
            .map(drop)
            .map_err(db)
    })
}

fn decision_row(r: &impl Columns) -> Result<DecisionRow, sqlx::Error> {
    Ok(DecisionRow {
        session_id: r.text("session_id")?,
        at_ms: r.int("at_ms")?,
        tool_call_id: r.opt_text("tool_call_id")?,
        title: r.opt_text("title")?,
        tool_kind: r.opt_text("tool_kind")?,
        option_id: r.opt_text("option_id")?,
        option_kind: r.opt_text("option_kind")?,
        outcome: r.text("outcome")?,
        decided_by: r.opt_text("decided_by")?,
        automatic: r.flag("automatic")?,
    })
}

pub(super) async fn decisions_of(
    pool: &Pool,
    session_id: &str,
) -> Result<Vec<DecisionRow>, StoreError> {
    on_pool!(pool, |p| {
        let rows = sqlx::query(
            "SELECT session_id, at_ms, tool_call_id, title, tool_kind, option_id, option_kind, \
             outcome, decided_by, automatic FROM permission_decisions \
             WHERE session_id = $1 ORDER BY at_ms, id",
        )
        .bind(session_id)
        .fetch_all(p)
        .await
        .map_err(db)?;
        rows.iter()
            .map(decision_row)
            .collect::<Result<_, _>>()
            .map_err(db)
    })
}

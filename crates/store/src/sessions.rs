//! Session rows (create, read, patch, list, soft delete) and agent-private state.

use super::backend::{
    Pool, again_if_lost, begin_write, conflict_or_db, db, is_constraint, now_ms, on_pool, on_write,
};
use super::rows::{self, SESSION_COLUMNS};
use super::{ListQuery, SessionPage, SessionPatch, SessionRow, StoreError};

const INSERT_SESSION: &str = "INSERT INTO sessions (id, principal_id, agent, agent_session_id, \
     cwd, additional_dirs, title, mode_id, config_values, meta, created_at_ms, updated_at_ms, \
     closed, last_seq, owner_instance, lease_until_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

/// One fixed statement for every patch: each nullable field gets a "set it?" flag and a value.
const UPDATE_SESSION: &str = "UPDATE sessions SET \
       agent_session_id = CASE WHEN $2 THEN $3 ELSE agent_session_id END, \
       cwd = COALESCE($4, cwd), \
       additional_dirs = COALESCE($5, additional_dirs), \
       title = CASE WHEN $6 THEN $7 ELSE title END, \
       mode_id = CASE WHEN $8 THEN $9 ELSE mode_id END, \
       config_values = COALESCE($10, config_values), \
       meta = COALESCE($11, meta), \
       closed = COALESCE($12, closed), \
       owner_instance = CASE WHEN $13 THEN $14 ELSE owner_instance END, \
       lease_until_ms = CASE WHEN $15 THEN $16 ELSE lease_until_ms END, \
       updated_at_ms = $17 \
     WHERE id = $1 AND deleted_at_ms IS NULL";

/// Writes only for a live session, so state never outlives `delete_session`.
const PUT_AGENT_STATE: &str = "INSERT INTO agent_state (session_id, key, value) \
     SELECT $1, $2, $3 WHERE EXISTS \
       (SELECT 1 FROM sessions WHERE id = $1 AND deleted_at_ms IS NULL) \
     ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value";

/// One statement, so one transaction and (on Postgres) one round trip: it sits on the path
/// of a `session/new`'s answer.
pub(super) async fn insert_session(pool: &Pool, row: &SessionRow) -> Result<(), StoreError> {
    match again_if_lost(|| insert_once(pool, row)).await {
        (Ok(()), _) => Ok(()),
        // A lost try may have committed before its answer was lost: the id is fresh, so
        // nobody else's row can be in its way.
        (Err(e), true) if is_constraint(&e) => Ok(()),
        (Err(e), _) => Err(conflict_or_db(|| {
            format!("session {} already exists", row.id)
        })(e)),
    }
}

/// Binds one row's 16 values in `INSERT_SESSION`'s order (a macro: the query's type differs
/// by backend inside `on_write!`).
macro_rules! bind_row {
    ($q:expr, $row:expr) => {
        $q.bind(&$row.id)
            .bind(&$row.principal_id)
            .bind(&$row.agent)
            .bind(&$row.agent_session_id)
            .bind(&$row.cwd)
            .bind(&$row.additional_dirs)
            .bind(&$row.title)
            .bind(&$row.mode_id)
            .bind(&$row.config_values)
            .bind(&$row.meta)
            .bind($row.created_at_ms)
            .bind($row.updated_at_ms)
            .bind($row.closed)
            .bind($row.last_seq)
            .bind(&$row.owner_instance)
            .bind($row.lease_until_ms)
    };
}

/// Several new rows in one statement (one transaction, one round trip): the journal writer's
/// commit of the rows `session/new` queued (`new_rows.rs`). All or none: on an error the
/// caller inserts them one by one to learn which. sqlx prepares one statement per distinct
/// text, so callers keep `rows.len()` within a small bound.
pub(super) async fn insert_sessions(pool: &Pool, rows: &[&SessionRow]) -> Result<(), sqlx::Error> {
    let sql = many_rows_sql(rows.len());
    on_write!(pool, |p| {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
        for row in rows {
            q = bind_row!(q, row);
        }
        q.execute(p).await.map(drop)
    })
}

/// `INSERT_SESSION` with `n` tuples of placeholders.
fn many_rows_sql(n: usize) -> String {
    let (head, _) = INSERT_SESSION.split_at(INSERT_SESSION.find("VALUES").unwrap_or(0));
    let tuples: Vec<String> = (0..n)
        .map(|r| {
            let cols: Vec<String> = (1..=16).map(|c| format!("${}", r * 16 + c)).collect();
            format!("({})", cols.join(", "))
        })
        .collect();
    format!("{head}VALUES {}", tuples.join(", "))
}

async fn insert_once(pool: &Pool, row: &SessionRow) -> Result<(), sqlx::Error> {
    on_write!(pool, |p| bind_row!(sqlx::query(INSERT_SESSION), row)
        .execute(p)
        .await
        .map(drop))
}

pub(super) async fn session(pool: &Pool, id: &str) -> Result<Option<SessionRow>, StoreError> {
    on_pool!(pool, |p| {
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND deleted_at_ms IS NULL"
        );
        let read = || {
            sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .bind(id)
                .fetch_optional(p)
        };
        let row = again_if_lost(read).await.0.map_err(db)?;
        row.as_ref().map(rows::session_row).transpose().map_err(db)
    })
}

pub(super) async fn update_session(
    pool: &Pool,
    id: &str,
    patch: &SessionPatch,
) -> Result<(), StoreError> {
    let updated = on_write!(pool, |p| {
        let patch_once = || {
            sqlx::query(UPDATE_SESSION)
                .bind(id)
                .bind(patch.agent_session_id.is_some())
                .bind(patch.agent_session_id.clone().flatten())
                .bind(&patch.cwd)
                .bind(&patch.additional_dirs)
                .bind(patch.title.is_some())
                .bind(patch.title.clone().flatten())
                .bind(patch.mode_id.is_some())
                .bind(patch.mode_id.clone().flatten())
                .bind(&patch.config_values)
                .bind(&patch.meta)
                .bind(patch.closed)
                .bind(patch.owner_instance.is_some())
                .bind(patch.owner_instance.clone().flatten())
                .bind(patch.lease_until_ms.is_some())
                .bind(patch.lease_until_ms.flatten())
                .bind(patch.updated_at_ms)
                .execute(p)
        };
        // The same patch twice is the same row.
        again_if_lost(patch_once)
            .await
            .0
            .map_err(db)?
            .rows_affected()
    });
    if updated == 0 {
        return Err(StoreError::Conflict(format!("no session {id}")));
    }
    Ok(())
}

pub(super) async fn list_sessions(pool: &Pool, q: &ListQuery) -> Result<SessionPage, StoreError> {
    let after = q.cursor.as_deref().map(rows::decode_cursor).transpose()?;
    let limit = i64::from(q.limit.max(1));
    // Fixed conditions with numbered parameters (no "$n IS NULL OR ..."), so each statement
    // keeps a plan that uses the matching index.
    let mut sql = "principal_id = $1".to_owned();
    let mut n = 2;
    let mut next = || {
        n += 1;
        n
    };
    if q.cwd.is_some() {
        sql += &format!(" AND cwd = ${}", next());
    }
    if q.agent.is_some() {
        sql += &format!(" AND agent = ${}", next());
    }
    if after.is_some() {
        let (a, b) = (next(), next());
        sql += &format!(" AND (created_at_ms, id) < (${a}, ${b})");
    }
    let sql = format!(
        "SELECT {SESSION_COLUMNS} FROM sessions WHERE deleted_at_ms IS NULL AND {sql} \
         ORDER BY created_at_ms DESC, id DESC LIMIT $2"
    );
    let mut sessions = on_pool!(pool, |p| {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&q.principal_id)
            .bind(limit + 1);
        if let Some(cwd) = &q.cwd {
            query = query.bind(cwd);
        }
        if let Some(agent) = &q.agent {
            query = query.bind(agent);
        }
        if let Some((created, id)) = &after {
            query = query.bind(*created).bind(id);
        }
        let found = query.fetch_all(p).await.map_err(db)?;
        found
            .iter()
            .map(rows::session_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(db)
    })?;
    let more = sessions.len() > q.limit.max(1) as usize;
    sessions.truncate(q.limit.max(1) as usize);
    let next_cursor = match sessions.last() {
        Some(last) if more => Some(rows::encode_cursor(last.created_at_ms, &last.id)),
        _ => None,
    };
    Ok(SessionPage {
        sessions,
        next_cursor,
    })
}

pub(super) async fn delete_session(pool: &Pool, id: &str) -> Result<bool, StoreError> {
    on_write!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await.map_err(db)?;
        // The update comes first: it row-locks the session, so the writer cannot add
        // entries between it and the journal delete (see `JournalSql::raise_last_seq`).
        let marked = sqlx::query(
            "UPDATE sessions SET deleted_at_ms = $2 WHERE id = $1 AND deleted_at_ms IS NULL",
        )
        .bind(id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        if marked == 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM journal WHERE session_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        sqlx::query("DELETE FROM agent_state WHERE session_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(true)
    })
}

pub(super) async fn put_agent_state(
    pool: &Pool,
    session_id: &str,
    key: &str,
    value: &str,
) -> Result<(), StoreError> {
    let written = on_write!(pool, |p| {
        sqlx::query(PUT_AGENT_STATE)
            .bind(session_id)
            .bind(key)
            .bind(value)
            .execute(p)
            .await
            .map_err(db)?
            .rows_affected()
    });
    if written == 0 {
        return Err(StoreError::Conflict(format!("no session {session_id}")));
    }
    Ok(())
}

pub(super) async fn agent_state(
    pool: &Pool,
    session_id: &str,
    key: &str,
) -> Result<Option<String>, StoreError> {
    on_pool!(pool, |p| {
        sqlx::query_scalar("SELECT value FROM agent_state WHERE session_id = $1 AND key = $2")
            .bind(session_id)
            .bind(key)
            .fetch_optional(p)
            .await
            .map_err(db)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn many_rows_number_every_placeholder_once_in_order() {
        let sql = super::many_rows_sql(2);
        assert!(
            sql.starts_with("INSERT INTO sessions (id, principal_id,"),
            "{sql}"
        );
        assert!(sql.contains("VALUES ($1, $2, "), "{sql}");
        assert!(sql.ends_with("$15, $16), ($17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32)"), "{sql}");
    }
}

//! The journal writer's commit on SQLite in one round trip to sqlx's SQLite thread: `BEGIN
//! IMMEDIATE`, the raise, the insert and `COMMIT` go as one multi-statement query, where the
//! transaction's path sends four, each a wake-up of that thread and of a tokio worker. At an
//! LLM's pace (one update every 10 ms) nothing batches, and those wake-ups were most of an
//! update's latency through acpd (issue 45's low-rate row).

use sqlx::SqliteConnection;

use super::journal::{Mark, bind_packs};
use super::pack::{Ins, pack};

/// Most rows (packs) the one-trip commit takes. sqlx caches a prepared statement per distinct
/// SQL text, so the text must come in few shapes: one session and up to this many rows.
const ROWS_MAX: usize = 8;

/// Raises the one marked session and inserts the batch's packs in one transaction sent as one
/// query. `Ok(false)`: this batch is not for the one trip (several sessions, many rows) or a
/// statement failed (a taken position, a deleted or unknown session): the transaction is
/// rolled back and nothing was written, and the caller commits through the transaction's
/// path, which tells those cases apart and reports them (`writer::write`).
pub(crate) async fn commit(
    conn: &mut SqliteConnection,
    marks: &[Mark<'_>],
    entries: &[Ins<'_>],
) -> Result<bool, sqlx::Error> {
    let [(id, seq, at_ms)] = marks else {
        return Ok(false);
    };
    let rows = pack(entries);
    if rows.is_empty() || rows.len() > ROWS_MAX {
        return Ok(false);
    }
    let sql = one_trip_sql(rows.len());
    let mark = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(*id)
        .bind(*seq)
        .bind(*at_ms);
    match bind_packs(mark, &rows).execute(&mut *conn).await {
        Ok(_) => Ok(true),
        Err(e) if e.as_database_error().is_some() => {
            // A statement failed inside the transaction: it is still open (SQLite aborts the
            // statement, not the transaction). Roll it back; the caller's path re-runs the
            // batch and says why it fails.
            // If that fails too, the first error goes back and the writer retries: its next
            // `BEGIN` inside the open transaction fails, and the rollback then succeeds.
            match sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await {
                Ok(_) => Ok(false),
                Err(_) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The one query for one session and `n` rows. The raise and the insert are those of
/// `JournalSql` for SQLite, except that a taken position fails the insert (no `ON CONFLICT`):
/// a retried or conflicting batch goes the transaction's way, which checks each such row.
fn one_trip_sql(n: usize) -> String {
    let mut sql = String::with_capacity(600 + n * 16);
    sql.push_str(
        "BEGIN IMMEDIATE; \
         UPDATE sessions SET last_seq = MAX(last_seq, ?2), updated_at_ms = MAX(updated_at_ms, ?3) \
         WHERE id = ?1 AND deleted_at_ms IS NULL; \
         INSERT INTO journal (session_id, seq, n_entries, kind, body, at_ms) \
         SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6 FROM (VALUES ",
    );
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        let b = 4 + i * 6;
        sql.push_str(&format!(
            "(?{},?{},?{},?{},?{},?{})",
            b,
            b + 1,
            b + 2,
            b + 3,
            b + 4,
            b + 5
        ));
    }
    sql.push_str(
        ") AS v WHERE NOT EXISTS \
         (SELECT 1 FROM sessions s WHERE s.id = v.column1 AND s.deleted_at_ms IS NOT NULL); \
         COMMIT",
    );
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_query_numbers_every_row_after_the_mark() {
        let sql = one_trip_sql(2);
        assert!(sql.starts_with("BEGIN IMMEDIATE;"));
        assert!(sql.ends_with("COMMIT"));
        assert!(sql.contains("(?4,?5,?6,?7,?8,?9),(?10,?11,?12,?13,?14,?15)"));
        assert!(!sql.contains("ON CONFLICT"));
    }
}

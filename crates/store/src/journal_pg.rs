//! The journal writer's commit on Postgres as one statement: one round trip where a
//! transaction costs four (`BEGIN`, the raise, the insert, `COMMIT`), each waiting on the one
//! before. A single statement is its own transaction, so it is as atomic as the four.

use sqlx::PgConnection;

use super::journal::Mark;
use super::pack::{Columns, Ins, pack};

/// Raises the marked sessions (as `JournalSql::raise_last_seq`) and inserts the batch's packs
/// (as `JournalSql::insert_entries`) in one statement. `Ok(false)`: a row's position is taken
/// already (a retried batch whose first commit went in, or a second writer), nothing was
/// written, and the caller commits through the transaction, which tells those two apart.
///
/// The insert is gated on the raise: a session's rows go in only if the raise matched it. The
/// raise row-locks the session and re-reads it after any wait, so a `delete_session` that
/// commits meanwhile keeps its rows out, just as the separate statements did (where the
/// insert's own later snapshot saw the delete). A session with no row at all is still offered
/// and fails the foreign key: no entry is called durable that is not stored.
///
/// Not for fenced batches (several replicas): the lease check belongs between the raise and the
/// insert, in one transaction (`writer::write`).
pub(crate) async fn commit(
    conn: &mut PgConnection,
    marks: &[Mark<'_>],
    entries: &[Ins<'_>],
) -> Result<bool, sqlx::Error> {
    if entries.is_empty() {
        return Ok(true);
    }
    let rows = pack(entries);
    let mark_ids: Vec<&str> = marks.iter().map(|m| m.0).collect();
    let mark_seqs: Vec<i64> = marks.iter().map(|m| m.1).collect();
    let mark_ats: Vec<i64> = marks.iter().map(|m| m.2).collect();
    // No `ON CONFLICT`: a taken position fails the whole statement, so a batch is never half
    // written (the transaction's path checks each skipped row before anything commits).
    let statement = sqlx::query(
        "WITH raised AS ( \
           UPDATE sessions AS s SET last_seq = GREATEST(s.last_seq, m.seq), \
             updated_at_ms = GREATEST(s.updated_at_ms, m.at_ms) \
           FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS m (id, seq, at_ms) \
           WHERE s.id = m.id AND s.deleted_at_ms IS NULL \
           RETURNING s.id \
         ) \
         INSERT INTO journal (session_id, seq, n_entries, kind, body, at_ms) \
         SELECT v.session_id, v.seq, v.n_entries, v.kind, v.body, v.at_ms \
         FROM UNNEST($4::text[], $5::int8[], $6::int4[], $7::text[], $8::text[], $9::int8[]) \
           AS v (session_id, seq, n_entries, kind, body, at_ms) \
         WHERE v.session_id IN (SELECT id FROM raised) \
            OR NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = v.session_id)",
    )
    .bind(mark_ids)
    .bind(mark_seqs)
    .bind(mark_ats);
    let done = Columns::of(&rows).bind(statement).execute(&mut *conn).await;
    match done {
        Ok(_) => Ok(true),
        Err(e) if is_unique_violation(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Postgres's `unique_violation` (SQLSTATE 23505): here, a journal position already taken.
fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23505")
}

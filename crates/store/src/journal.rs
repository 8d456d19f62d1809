//! Journal SQL: reads, compaction's range replacement, and the bulk inserts the writer uses.
//!
//! Rows are packs of entries (`pack`): every read here splits them back into entries, and the
//! range replacement splits a pack that straddles the range's ends.

use sqlx::{PgConnection, SqliteConnection};

use super::backend::{Pool, begin_write, db, on_pool, on_write};
use super::form::BodyForm;
use super::pack::{Columns, Ins, PACK_MAX, Pack, Row, entries_within, pack};
use super::rows::JOURNAL_COLUMNS;
use super::{JournalEntry, StoreError, rows};

/// Journal statements that must run inside a caller's write transaction.
///
/// Inserts store the entries as packs (`pack::pack`), skip rows of deleted sessions (their
/// journal is gone for good) and accept a row already present at the same `(session_id, seq)`
/// with the same count, kind and body, which makes a retried batch idempotent when the first
/// commit succeeded but its acknowledgement was lost (the same batch packs the same way). The
/// same position holding a *different* row fails the insert: that is a second writer on the
/// session (another acpd on the same store), and skipping the row would drop entries while
/// reporting them durable. A row of a session that never existed fails the foreign key.
pub(crate) trait JournalSql {
    /// Raises `sessions.last_seq` to each mark's seq and `updated_at_ms` to its time (never
    /// lowers either) for live sessions; returns how many sessions matched. Run it before
    /// inserting: it row-locks the sessions (Postgres), so a concurrent `delete_session`
    /// cannot slip between the "is it deleted" check and the insert and leave orphan rows.
    async fn raise_last_seq(&mut self, marks: &[Mark<'_>]) -> Result<u64, sqlx::Error>;
    async fn insert_entries(&mut self, rows: &[Ins<'_>]) -> Result<(), sqlx::Error>;
    /// The first `(session_id, epoch)` of `fences` whose epoch is not the session's lease
    /// epoch (fencing). Run it after `raise_last_seq`, whose row locks keep the lease from
    /// moving until the transaction ends.
    async fn stale_epoch(
        &mut self,
        fences: &[(&str, i64)],
    ) -> Result<Option<(String, i64)>, sqlx::Error>;
    /// The count, kind and body of the row stored at `(session_id, seq)`, if any.
    async fn stored(&mut self, session_id: &str, seq: i64) -> Result<Option<Stored>, sqlx::Error>;
}

/// `(session_id, seq, at_ms)`: a session's journal reaches `seq`, and it was active at `at_ms`.
/// An append is the session's activity: the row's `updated_at_ms` moves with the journal, in
/// the same transaction, so a turn's end needs no row write of its own (a second write to the
/// same row, which on Postgres waited for the journal's row lock and then cost a commit of its
/// own on every turn's path).
pub(crate) type Mark<'a> = (&'a str, i64, i64);

/// A row's `(n_entries, kind, body)`.
type Stored = (i32, String, String);

const STORED: &str = "SELECT n_entries, kind, body FROM journal WHERE session_id = $1 AND seq = $2";

/// `UPDATE ... FROM (VALUES ...)` raising `n` sessions in one statement: a group commit that
/// touches a thousand sessions (a thousand streaming at once) is one round trip to sqlx's
/// SQLite thread, not one per session (7 k updates/s with a statement each, issue 45's
/// `fanout` row). SQLite plans it as a scan of the values, each a lookup by id.
fn sqlite_raise_sql(n: usize) -> String {
    let mut sql = String::with_capacity(250 + n * 8);
    sql.push_str(
        "UPDATE sessions \
         SET last_seq = MAX(sessions.last_seq, v.column2), \
         updated_at_ms = MAX(sessions.updated_at_ms, v.column3) FROM (VALUES ",
    );
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str("(?,?,?)");
    }
    sql.push_str(") AS v WHERE sessions.id = v.column1 AND sessions.deleted_at_ms IS NULL");
    sql
}

/// Binds each pack's six columns, in the order of the journal's `VALUES` rows on SQLite.
pub(crate) fn bind_packs<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    rows: &'q [Pack<'q>],
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    for r in rows {
        q = q
            .bind(r.session_id)
            .bind(r.seq)
            .bind(r.n_entries)
            .bind(r.kind)
            .bind(r.body.as_ref())
            .bind(r.at_ms);
    }
    q
}

/// Rows per SQLite statement: one round trip to sqlx's SQLite thread per 512 rows (a group
/// commit under load takes up to 4 096 entries, fewer rows once packed); 3 072 binds stay far
/// below the limit.
const SQLITE_CHUNK: usize = 512;

/// `INSERT ... SELECT FROM (VALUES ...)` with `n` rows. The WHERE clause also resolves SQLite's
/// documented parse ambiguity between `INSERT ... SELECT` and `ON CONFLICT`.
fn sqlite_insert_sql(n: usize) -> String {
    let mut sql = String::with_capacity(300 + n * 14);
    sql.push_str(
        "INSERT INTO journal (session_id, seq, n_entries, kind, body, at_ms) \
         SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6 FROM (VALUES ",
    );
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str("(?,?,?,?,?,?)");
    }
    sql.push_str(
        ") AS v WHERE NOT EXISTS \
         (SELECT 1 FROM sessions s WHERE s.id = v.column1 AND s.deleted_at_ms IS NOT NULL) \
         ON CONFLICT (session_id, seq) DO NOTHING",
    );
    sql
}

impl JournalSql for SqliteConnection {
    async fn raise_last_seq(&mut self, marks: &[Mark<'_>]) -> Result<u64, sqlx::Error> {
        let mut matched = 0;
        let mut rest = marks;
        // Power-of-two chunks, as the inserts below: ten statements to cache at most.
        while !rest.is_empty() {
            let mut n = SQLITE_CHUNK;
            while n > rest.len() {
                n /= 2;
            }
            let (chunk, tail) = rest.split_at(n);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sqlite_raise_sql(n)));
            for (id, seq, at_ms) in chunk {
                q = q.bind(*id).bind(*seq).bind(*at_ms);
            }
            matched += q.execute(&mut *self).await?.rows_affected();
            rest = tail;
        }
        Ok(matched)
    }

    async fn insert_entries(&mut self, entries: &[Ins<'_>]) -> Result<(), sqlx::Error> {
        let packs = pack(entries);
        let mut rows = &packs[..];
        // Power-of-two chunks keep the number of distinct statements (and so of cached
        // prepared statements) at ten whatever the batch size.
        while !rows.is_empty() {
            let mut n = SQLITE_CHUNK;
            while n > rows.len() {
                n /= 2;
            }
            let (chunk, rest) = rows.split_at(n);
            let q = bind_packs(
                sqlx::query(sqlx::AssertSqlSafe(sqlite_insert_sql(n))),
                chunk,
            );
            if (q.execute(&mut *self).await?.rows_affected() as usize) < n {
                check_skipped(&mut *self, chunk).await?;
            }
            rows = rest;
        }
        Ok(())
    }

    async fn stale_epoch(
        &mut self,
        fences: &[(&str, i64)],
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        for (id, epoch) in fences {
            let now: Option<i64> =
                sqlx::query_scalar("SELECT lease_epoch FROM sessions WHERE id = $1")
                    .bind(*id)
                    .fetch_optional(&mut *self)
                    .await?;
            if now.is_some_and(|now| now != *epoch) {
                return Ok(Some(((*id).to_owned(), *epoch)));
            }
        }
        Ok(None)
    }

    async fn stored(&mut self, session_id: &str, seq: i64) -> Result<Option<Stored>, sqlx::Error> {
        sqlx::query_as(STORED)
            .bind(session_id)
            .bind(seq)
            .fetch_optional(&mut *self)
            .await
    }
}

impl JournalSql for PgConnection {
    async fn raise_last_seq(&mut self, marks: &[Mark<'_>]) -> Result<u64, sqlx::Error> {
        if marks.is_empty() {
            return Ok(0);
        }
        let ids: Vec<&str> = marks.iter().map(|m| m.0).collect();
        let seqs: Vec<i64> = marks.iter().map(|m| m.1).collect();
        let ats: Vec<i64> = marks.iter().map(|m| m.2).collect();
        Ok(sqlx::query(
            "UPDATE sessions AS s SET last_seq = GREATEST(s.last_seq, v.seq), \
             updated_at_ms = GREATEST(s.updated_at_ms, v.at_ms) \
             FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS v (id, seq, at_ms) \
             WHERE s.id = v.id AND s.deleted_at_ms IS NULL",
        )
        .bind(ids)
        .bind(seqs)
        .bind(ats)
        .execute(&mut *self)
        .await?
        .rows_affected())
    }

    async fn insert_entries(&mut self, entries: &[Ins<'_>]) -> Result<(), sqlx::Error> {
        if entries.is_empty() {
            return Ok(());
        }
        let rows = pack(entries);
        let insert = sqlx::query(
            "INSERT INTO journal (session_id, seq, n_entries, kind, body, at_ms) \
             SELECT v.session_id, v.seq, v.n_entries, v.kind, v.body, v.at_ms \
             FROM UNNEST($1::text[], $2::int8[], $3::int4[], $4::text[], $5::text[], $6::int8[]) \
               AS v (session_id, seq, n_entries, kind, body, at_ms) \
             WHERE NOT EXISTS \
               (SELECT 1 FROM sessions s WHERE s.id = v.session_id AND s.deleted_at_ms IS NOT NULL) \
             ON CONFLICT (session_id, seq) DO NOTHING",
        );
        // One statement for the whole batch: six arrays, one round trip.
        let inserted = Columns::of(&rows)
            .bind(insert)
            .execute(&mut *self)
            .await?
            .rows_affected();
        if (inserted as usize) < rows.len() {
            check_skipped(&mut *self, &rows).await?;
        }
        Ok(())
    }

    async fn stale_epoch(
        &mut self,
        fences: &[(&str, i64)],
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        if fences.is_empty() {
            return Ok(None);
        }
        let ids: Vec<&str> = fences.iter().map(|f| f.0).collect();
        let epochs: Vec<i64> = fences.iter().map(|f| f.1).collect();
        sqlx::query_as(
            "SELECT v.id, v.epoch FROM UNNEST($1::text[], $2::int8[]) AS v (id, epoch) \
             JOIN sessions s ON s.id = v.id WHERE s.lease_epoch <> v.epoch LIMIT 1",
        )
        .bind(ids)
        .bind(epochs)
        .fetch_optional(&mut *self)
        .await
    }

    async fn stored(&mut self, session_id: &str, seq: i64) -> Result<Option<Stored>, sqlx::Error> {
        sqlx::query_as(STORED)
            .bind(session_id)
            .bind(seq)
            .fetch_optional(&mut *self)
            .await
    }
}

/// The slow path of an insert that skipped rows: each row not inserted must be either of a
/// deleted session (absent) or already stored as the very same row (a retried batch).
/// Anything else is a second writer at the same position, refused as a data error so the writer
/// rejects that entry and stops its session's watermark instead of calling it durable.
async fn check_skipped<C: JournalSql + ?Sized>(
    conn: &mut C,
    rows: &[Pack<'_>],
) -> Result<(), sqlx::Error> {
    for r in rows {
        let Some((n, kind, body)) = conn.stored(r.session_id, r.seq).await? else {
            continue;
        };
        if n != r.n_entries || kind != r.kind || body != r.body {
            return Err(sqlx::Error::InvalidArgument(format!(
                "journal entry {}#{} conflicts with a different entry already stored at that \
                 position (another acpd writing this session?)",
                r.session_id, r.seq
            )));
        }
    }
    Ok(())
}

/// The rows holding entries in `($2, $2 + $3]`: a pack starts at most `PACK_MAX - 1` below its
/// last entry, so the index range starts there; it ends at the seq bound, so a page of a
/// packed journal reads about `$3` entries, not `$3` rows of up to `PACK_MAX` each.
fn after_sql() -> String {
    format!(
        "SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq > $2 - {PACK_MAX} \
         AND seq + n_entries > $2 + 1 AND seq <= $2 + $3 ORDER BY seq"
    )
}

/// Where the journal goes on after a gap (compaction merges runs, so seqs may skip).
const NEXT_ROW: &str = "SELECT MIN(seq) FROM journal WHERE session_id = $1 AND seq > $2";

pub(super) async fn journal_after(
    pool: &Pool,
    form: &dyn BodyForm,
    session_id: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<JournalEntry>, StoreError> {
    let limit = limit.max(0) as usize;
    let mut out: Vec<JournalEntry> = Vec::new();
    let mut from = after_seq;
    // One range read for a journal without gaps; a short page looks past a gap and goes on.
    while out.len() < limit {
        let want = (limit - out.len()) as i64;
        let found = read_rows(pool, &after_sql(), session_id, from, want).await?;
        for row in found {
            let entries = row.entries(form).map_err(db)?;
            out.extend(
                entries
                    .into_iter()
                    .filter(|e| e.seq > from)
                    .take(limit - out.len()),
            );
        }
        if out.len() >= limit {
            break;
        }
        // Past what was read, not past the range: the journal may have grown into the range
        // since (a live session), and what grew there must not be skipped.
        let read = out.last().map_or(from, |e| e.seq);
        let next: Option<i64> = on_pool!(pool, |p| sqlx::query_scalar(NEXT_ROW)
            .bind(session_id)
            .bind(read)
            .fetch_one(p)
            .await
            .map_err(db)?);
        let Some(next) = next else { break };
        from = read.max(next - 1);
    }
    Ok(out)
}

/// The rows (`JOURNAL_COLUMNS`) that `sql` selects with `$1` the session and `$2`, `$3`.
pub(crate) async fn read_rows(
    pool: &Pool,
    sql: &str,
    session_id: &str,
    a: i64,
    b: i64,
) -> Result<Vec<Row>, StoreError> {
    on_pool!(pool, |p| {
        let found = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(session_id)
            .bind(a)
            .bind(b)
            .fetch_all(p)
            .await
            .map_err(db)?;
        found
            .iter()
            .map(rows::journal_row)
            .collect::<Result<_, _>>()
            .map_err(db)
    })
}

pub(super) async fn replace_journal_range(
    pool: &Pool,
    form: &dyn BodyForm,
    session_id: &str,
    first_seq: i64,
    last_seq: i64,
    entries: &[JournalEntry],
) -> Result<(), StoreError> {
    let mut prev = i64::MIN;
    for e in entries {
        if *e.session_id != *session_id || e.seq < first_seq || e.seq > last_seq || e.seq <= prev {
            return Err(StoreError::Conflict(format!(
                "replacement entry {}#{} is outside {session_id}#{first_seq}..={last_seq} or out of order",
                e.session_id, e.seq
            )));
        }
        prev = e.seq;
    }
    // Compaction rewrites old entries: not activity, so no time (0 never raises it).
    let mark = [(session_id, entries.last().map_or(0, |e| e.seq), 0)];
    // The rows holding any entry of the range: packs at either end may reach outside it.
    let within = format!(
        "WHERE session_id = $1 AND seq > $2 - {PACK_MAX} AND seq <= $3 AND seq + n_entries > $2"
    );
    let (read, delete) = (
        format!("SELECT {JOURNAL_COLUMNS} FROM journal {within}"),
        format!("DELETE FROM journal {within}"),
    );
    on_write!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await.map_err(db)?;
        if tx.raise_last_seq(&mark).await.map_err(db)? == 0 {
            return Err(StoreError::Conflict(format!("no session {session_id}")));
        }
        let found = sqlx::query(sqlx::AssertSqlSafe(read))
            .bind(session_id)
            .bind(first_seq)
            .bind(last_seq)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let found: Vec<_> = found
            .iter()
            .map(rows::journal_row)
            .collect::<Result<_, _>>()
            .map_err(db)?;
        // What the straddling packs hold outside the range goes back in beside the new entries.
        let mut kept = entries_within(found, i64::MIN, i64::MAX, form).map_err(db)?;
        kept.retain(|e| e.seq < first_seq || e.seq > last_seq);
        sqlx::query(sqlx::AssertSqlSafe(delete))
            .bind(session_id)
            .bind(first_seq)
            .bind(last_seq)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let rows: Vec<Ins<'_>> = kept.iter().chain(entries).map(|e| ins(e, form)).collect();
        tx.insert_entries(&rows).await.map_err(db)?;
        tx.commit().await.map_err(db)
    })
}

/// An entry read back, as a row to insert again.
pub(crate) fn ins<'a>(e: &'a JournalEntry, form: &dyn BodyForm) -> Ins<'a> {
    Ins::new(form, &e.session_id, e.seq, &e.kind, &e.body, e.at_ms)
}

#[cfg(test)]
mod tests {
    use super::sqlite_insert_sql;

    #[test]
    fn sqlite_sql_has_one_bind_per_column() {
        for n in [1, 2, 64] {
            assert_eq!(sqlite_insert_sql(n).matches('?').count(), n * 6);
        }
    }
}

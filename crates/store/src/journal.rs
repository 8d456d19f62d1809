//! Journal SQL: reads, compaction's range replacement, and the bulk inserts the writer uses.

use sqlx::{PgConnection, SqliteConnection};

use super::backend::{Pool, begin_write, db, on_pool};
use super::{JournalEntry, StoreError, rows};

/// One journal row to insert, borrowed from a `NewEntry` or a `JournalEntry`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ins<'a> {
    pub session_id: &'a str,
    pub seq: i64,
    pub kind: &'a str,
    pub body: &'a str,
    pub at_ms: i64,
}

/// Journal statements that must run inside a caller's write transaction.
///
/// Inserts skip rows of deleted sessions (their journal is gone for good) and accept a
/// `(session_id, seq)` already present with the same kind and body, which makes a retried
/// batch idempotent when the first commit succeeded but its acknowledgement was lost. The same
/// position holding a *different* entry fails the insert (`conflict`): that is a second writer
/// on the session (another acpd on the same store), and skipping the row would drop the entry
/// while reporting it durable. A row of a session that never existed fails the foreign key.
pub(crate) trait JournalSql {
    /// Raises `sessions.last_seq` to each `(session_id, seq)` (never lowers it) for live
    /// sessions; returns how many sessions matched. Run it before inserting: it row-locks the
    /// sessions (Postgres), so a concurrent `delete_session` cannot slip between the "is it
    /// deleted" check and the insert and leave orphan rows.
    async fn raise_last_seq(&mut self, marks: &[(&str, i64)]) -> Result<u64, sqlx::Error>;
    async fn insert_entries(&mut self, rows: &[Ins<'_>]) -> Result<(), sqlx::Error>;
    /// The first `(session_id, epoch)` of `fences` whose epoch is not the session's lease
    /// epoch (fencing). Run it after `raise_last_seq`, whose row locks keep the lease from
    /// moving until the transaction ends.
    async fn stale_epoch(
        &mut self,
        fences: &[(&str, i64)],
    ) -> Result<Option<(String, i64)>, sqlx::Error>;
    /// The kind and body stored at `(session_id, seq)`, if any.
    async fn stored(
        &mut self,
        session_id: &str,
        seq: i64,
    ) -> Result<Option<(String, String)>, sqlx::Error>;
}

const STORED: &str = "SELECT kind, body FROM journal WHERE session_id = $1 AND seq = $2";

/// Bytes, not characters: OCTET_LENGTH means the same in both databases.
const JOURNAL_SIZE: &str = "SELECT COUNT(*), COALESCE(SUM(OCTET_LENGTH(body)), 0) \
     FROM journal WHERE session_id = $1";

const RAISE_LAST_SEQ: &str = "UPDATE sessions \
     SET last_seq = CASE WHEN last_seq > $2 THEN last_seq ELSE $2 END \
     WHERE id = $1 AND deleted_at_ms IS NULL";

/// Rows per SQLite statement: a whole group commit (the writer takes up to 512) in one
/// statement, one round trip to sqlx's SQLite thread; 2 560 binds stay far below the limit.
const SQLITE_CHUNK: usize = 512;

/// `INSERT ... SELECT FROM (VALUES ...)` with `n` rows. The WHERE clause also resolves SQLite's
/// documented parse ambiguity between `INSERT ... SELECT` and `ON CONFLICT`.
fn sqlite_insert_sql(n: usize) -> String {
    let mut sql = String::with_capacity(300 + n * 14);
    sql.push_str(
        "INSERT INTO journal (session_id, seq, kind, body, at_ms) \
         SELECT v.column1, v.column2, v.column3, v.column4, v.column5 FROM (VALUES ",
    );
    for i in 0..n {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str("(?,?,?,?,?)");
    }
    sql.push_str(
        ") AS v WHERE NOT EXISTS \
         (SELECT 1 FROM sessions s WHERE s.id = v.column1 AND s.deleted_at_ms IS NOT NULL) \
         ON CONFLICT (session_id, seq) DO NOTHING",
    );
    sql
}

impl JournalSql for SqliteConnection {
    async fn raise_last_seq(&mut self, marks: &[(&str, i64)]) -> Result<u64, sqlx::Error> {
        let mut matched = 0;
        for (id, seq) in marks {
            matched += sqlx::query(RAISE_LAST_SEQ)
                .bind(*id)
                .bind(*seq)
                .execute(&mut *self)
                .await?
                .rows_affected();
        }
        Ok(matched)
    }

    async fn insert_entries(&mut self, mut rows: &[Ins<'_>]) -> Result<(), sqlx::Error> {
        // Power-of-two chunks keep the number of distinct statements (and so of cached
        // prepared statements) at ten whatever the batch size.
        while !rows.is_empty() {
            let mut n = SQLITE_CHUNK;
            while n > rows.len() {
                n /= 2;
            }
            let (chunk, rest) = rows.split_at(n);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sqlite_insert_sql(n)));
            for r in chunk {
                q = q
                    .bind(r.session_id)
                    .bind(r.seq)
                    .bind(r.kind)
                    .bind(r.body)
                    .bind(r.at_ms);
            }
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

    async fn stored(
        &mut self,
        session_id: &str,
        seq: i64,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        sqlx::query_as(STORED)
            .bind(session_id)
            .bind(seq)
            .fetch_optional(&mut *self)
            .await
    }
}

impl JournalSql for PgConnection {
    async fn raise_last_seq(&mut self, marks: &[(&str, i64)]) -> Result<u64, sqlx::Error> {
        if marks.is_empty() {
            return Ok(0);
        }
        let ids: Vec<&str> = marks.iter().map(|m| m.0).collect();
        let seqs: Vec<i64> = marks.iter().map(|m| m.1).collect();
        Ok(sqlx::query(
            "UPDATE sessions AS s SET last_seq = GREATEST(s.last_seq, v.seq) \
             FROM UNNEST($1::text[], $2::int8[]) AS v (id, seq) \
             WHERE s.id = v.id AND s.deleted_at_ms IS NULL",
        )
        .bind(ids)
        .bind(seqs)
        .execute(&mut *self)
        .await?
        .rows_affected())
    }

    async fn insert_entries(&mut self, rows: &[Ins<'_>]) -> Result<(), sqlx::Error> {
        if rows.is_empty() {
            return Ok(());
        }
        // One statement for the whole batch: five arrays, one round trip.
        let mut session_ids = Vec::with_capacity(rows.len());
        let mut seqs = Vec::with_capacity(rows.len());
        let mut kinds = Vec::with_capacity(rows.len());
        let mut bodies = Vec::with_capacity(rows.len());
        let mut ats = Vec::with_capacity(rows.len());
        for r in rows {
            session_ids.push(r.session_id);
            seqs.push(r.seq);
            kinds.push(r.kind);
            bodies.push(r.body);
            ats.push(r.at_ms);
        }
        let inserted = sqlx::query(
            "INSERT INTO journal (session_id, seq, kind, body, at_ms) \
             SELECT v.session_id, v.seq, v.kind, v.body, v.at_ms \
             FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[]) \
               AS v (session_id, seq, kind, body, at_ms) \
             WHERE NOT EXISTS \
               (SELECT 1 FROM sessions s WHERE s.id = v.session_id AND s.deleted_at_ms IS NOT NULL) \
             ON CONFLICT (session_id, seq) DO NOTHING",
        )
        .bind(session_ids)
        .bind(seqs)
        .bind(kinds)
        .bind(bodies)
        .bind(ats)
        .execute(&mut *self)
        .await?
        .rows_affected();
        if (inserted as usize) < rows.len() {
            check_skipped(&mut *self, rows).await?;
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

    async fn stored(
        &mut self,
        session_id: &str,
        seq: i64,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        sqlx::query_as(STORED)
            .bind(session_id)
            .bind(seq)
            .fetch_optional(&mut *self)
            .await
    }
}

/// The slow path of an insert that skipped rows: each row not inserted must be either of a
/// deleted session (absent) or already stored as the very same entry (a retried batch).
/// Anything else is a second writer at the same position, refused as a data error so the writer
/// rejects that entry and stops its session's watermark instead of calling it durable.
async fn check_skipped<C: JournalSql + ?Sized>(
    conn: &mut C,
    rows: &[Ins<'_>],
) -> Result<(), sqlx::Error> {
    for r in rows {
        let Some((kind, body)) = conn.stored(r.session_id, r.seq).await? else {
            continue;
        };
        if kind != r.kind || body != r.body {
            return Err(sqlx::Error::InvalidArgument(format!(
                "journal entry {}#{} conflicts with a different entry already stored at that \
                 position (another acpd writing this session?)",
                r.session_id, r.seq
            )));
        }
    }
    Ok(())
}

pub(super) async fn journal_after(
    pool: &Pool,
    session_id: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<JournalEntry>, StoreError> {
    on_pool!(pool, |p| {
        let found = sqlx::query(
            "SELECT session_id, seq, kind, body, at_ms FROM journal \
             WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(session_id)
        .bind(after_seq)
        .bind(limit.max(0))
        .fetch_all(p)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(rows::journal_entry)
            .collect::<Result<Vec<_>, _>>()
            .map_err(db)
    })
}

pub(super) async fn replace_journal_range(
    pool: &Pool,
    session_id: &str,
    first_seq: i64,
    last_seq: i64,
    entries: &[JournalEntry],
) -> Result<(), StoreError> {
    let mut prev = i64::MIN;
    for e in entries {
        if e.session_id != session_id || e.seq < first_seq || e.seq > last_seq || e.seq <= prev {
            return Err(StoreError::Conflict(format!(
                "replacement entry {}#{} is outside {session_id}#{first_seq}..={last_seq} or out of order",
                e.session_id, e.seq
            )));
        }
        prev = e.seq;
    }
    let rows: Vec<Ins<'_>> = entries
        .iter()
        .map(|e| Ins {
            session_id: &e.session_id,
            seq: e.seq,
            kind: &e.kind,
            body: &e.body,
            at_ms: e.at_ms,
        })
        .collect();
    let mark = [(session_id, entries.last().map_or(0, |e| e.seq))];
    on_pool!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await.map_err(db)?;
        if tx.raise_last_seq(&mark).await.map_err(db)? == 0 {
            return Err(StoreError::Conflict(format!("no session {session_id}")));
        }
        sqlx::query("DELETE FROM journal WHERE session_id = $1 AND seq >= $2 AND seq <= $3")
            .bind(session_id)
            .bind(first_seq)
            .bind(last_seq)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.insert_entries(&rows).await.map_err(db)?;
        tx.commit().await.map_err(db)
    })
}

/// Pairs `(previous seq, seq)` of neighbouring entries (by seq, after `after_seq`) that share
/// a kind out of `kinds`, ascending, at most `limit`: where compaction could merge something.
/// One index scan in the database; no body is read.
pub(super) async fn journal_neighbours(
    pool: &Pool,
    session_id: &str,
    after_seq: i64,
    kinds: &[&str],
    limit: i64,
) -> Result<Vec<(i64, i64)>, StoreError> {
    if kinds.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = (0..kinds.len()).map(|i| format!("${}", i + 4)).collect();
    // Driven by the primary key in seq order, so LIMIT stops the scan early; each entry of a
    // wanted kind looks its successor up through the same index.
    let sql = format!(
        "SELECT a.seq, b.seq FROM journal a JOIN journal b \
         ON b.session_id = a.session_id AND b.seq = (SELECT MIN(c.seq) FROM journal c \
         WHERE c.session_id = a.session_id AND c.seq > a.seq) \
         WHERE a.session_id = $1 AND a.seq > $2 AND a.kind IN ({}) AND b.kind = a.kind \
         ORDER BY a.seq LIMIT $3",
        list.join(", ")
    );
    on_pool!(pool, |p| {
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(session_id)
            .bind(after_seq)
            .bind(limit.max(0));
        for k in kinds {
            q = q.bind(*k);
        }
        q.fetch_all(p).await.map_err(db)
    })
}

/// The newest seq that must go for the newest `max_entries` to remain; none when fewer.
const CUT_BY_COUNT: &str = "SELECT seq FROM journal WHERE session_id = $1 \
     ORDER BY seq DESC LIMIT 1 OFFSET $2";

/// The newest seq at which the bytes counted from the newest entry down exceed `$2`: it and
/// everything older must go. A running sum over the index, newest first, in the database.
const CUT_BY_BYTES: &str = "SELECT seq FROM (SELECT seq, SUM(OCTET_LENGTH(body)) \
     OVER (ORDER BY seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total \
     FROM journal WHERE session_id = $1) AS t WHERE total > $2 ORDER BY seq DESC LIMIT 1";

/// Drops a session's oldest entries until at most `max_entries` and `max_bytes` (0: no cap)
/// remain; returns how many went. Counts and sums run in the database, so the journal is
/// never read into memory, however long it is.
pub(super) async fn trim_journal(
    pool: &Pool,
    session_id: &str,
    max_entries: u64,
    max_bytes: u64,
) -> Result<u64, StoreError> {
    let cap = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    on_pool!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await.map_err(db)?;
        let mut cut: Option<i64> = None;
        if max_entries > 0 {
            cut = sqlx::query_scalar(CUT_BY_COUNT)
                .bind(session_id)
                .bind(cap(max_entries))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
        }
        if max_bytes > 0 {
            let by_bytes: Option<i64> = sqlx::query_scalar(CUT_BY_BYTES)
                .bind(session_id)
                .bind(cap(max_bytes))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
            cut = cut.max(by_bytes);
        }
        let Some(cut) = cut else {
            return Ok(0);
        };
        let dropped = sqlx::query("DELETE FROM journal WHERE session_id = $1 AND seq <= $2")
            .bind(session_id)
            .bind(cut)
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        tx.commit().await.map_err(db)?;
        Ok(dropped)
    })
}

pub(super) async fn journal_size(pool: &Pool, session_id: &str) -> Result<(i64, i64), StoreError> {
    on_pool!(pool, |p| {
        sqlx::query_as(JOURNAL_SIZE)
            .bind(session_id)
            .fetch_one(p)
            .await
            .map_err(db)
    })
}

#[cfg(test)]
mod tests {
    use super::sqlite_insert_sql;

    #[test]
    fn sqlite_sql_has_one_bind_per_column() {
        for n in [1, 2, 64] {
            assert_eq!(sqlite_insert_sql(n).matches('?').count(), n * 5);
        }
    }
}

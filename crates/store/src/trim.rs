//! Journal SQL of retention: sizes, trimming the oldest entries, compaction's neighbour scan.
//!
//! All of it runs in the database over the rows' columns (a pack's entries share kind and
//! time and have consecutive seqs, so counts and neighbours follow from `seq` and
//! `n_entries`), so a journal is never read into memory, however long it is. Only the one pack
//! at a cut is read and split.

use super::StoreError;
use super::backend::{Pool, begin_write, db, on_pool, on_write};
use super::form::BodyForm;
use super::journal::{JournalSql, ins};
use super::pack::{Ins, PACK_MAX, Row, entries_within};
use super::rows::{self, JOURNAL_COLUMNS};

/// Entries and their body bytes (bytes, not characters: OCTET_LENGTH means the same in both
/// databases; a pack's joining newlines are not counted).
const JOURNAL_SIZE: &str = "SELECT COALESCE(SUM(n_entries), 0), \
     COALESCE(SUM(OCTET_LENGTH(body) - n_entries + 1), 0) FROM journal WHERE session_id = $1";

/// The newest row at which the entries counted from the newest down exceed `$2`, with that
/// running count: it holds the newest entry that must go.
const CUT_BY_COUNT: &str = "SELECT seq, n_entries, total FROM (SELECT seq, n_entries, \
     SUM(n_entries) OVER (ORDER BY seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) \
     AS total FROM journal WHERE session_id = $1) AS t WHERE total > $2 ORDER BY seq DESC LIMIT 1";

/// The same by body bytes: a running sum over the index, newest first, in the database.
const CUT_BY_BYTES: &str = "SELECT seq, total FROM (SELECT seq, \
     SUM(OCTET_LENGTH(body) - n_entries + 1) \
     OVER (ORDER BY seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total \
     FROM journal WHERE session_id = $1) AS t WHERE total > $2 ORDER BY seq DESC LIMIT 1";

/// Entries in the rows that lie wholly at or below `$2`.
const WHOLLY_BELOW: &str = "FROM journal WHERE session_id = $1 AND seq <= $2 \
     AND seq + n_entries - 1 <= $2";

pub(super) async fn journal_size(pool: &Pool, session_id: &str) -> Result<(i64, i64), StoreError> {
    on_pool!(pool, |p| {
        sqlx::query_as(JOURNAL_SIZE)
            .bind(session_id)
            .fetch_one(p)
            .await
            .map_err(db)
    })
}

/// Drops a session's oldest entries until at most `max_entries` and `max_bytes` (0: no cap)
/// remain; returns how many went.
// long: one transaction written once for both backends inside `on_write!`, whose pieces would
// each need the backend's own transaction type.
pub(super) async fn trim_journal(
    pool: &Pool,
    form: &dyn BodyForm,
    session_id: &str,
    max_entries: u64,
    max_bytes: u64,
) -> Result<u64, StoreError> {
    let cap = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    // The one row that may straddle the cut: packs never overlap.
    let straddling = format!(
        "SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq <= $2 \
         AND seq > $2 - {PACK_MAX} AND seq + n_entries - 1 > $2"
    );
    let row_at =
        format!("SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq = $2");
    on_write!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await.map_err(db)?;
        let mut cut: Option<i64> = None;
        if max_entries > 0 {
            let found: Option<(i64, i32, i64)> = sqlx::query_as(CUT_BY_COUNT)
                .bind(session_id)
                .bind(cap(max_entries))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
            cut = found.map(|(seq, n, total)| cut_by_count(seq, n, total, cap(max_entries)));
        }
        if max_bytes > 0 {
            let found: Option<(i64, i64)> = sqlx::query_as(CUT_BY_BYTES)
                .bind(session_id)
                .bind(cap(max_bytes))
                .fetch_optional(&mut *tx)
                .await
                .map_err(db)?;
            if let Some((seq, total)) = found {
                let row = sqlx::query(sqlx::AssertSqlSafe(row_at.clone()))
                    .bind(session_id)
                    .bind(seq)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db)?;
                let row = rows::journal_row(&row).map_err(db)?;
                cut = cut.max(Some(cut_by_bytes(row, total, cap(max_bytes)).map_err(db)?));
            }
        }
        let Some(cut) = cut else {
            return Ok(0);
        };
        let whole: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COALESCE(SUM(n_entries), 0) {WHOLLY_BELOW}"
        )))
        .bind(session_id)
        .bind(cut)
        .fetch_one(&mut *tx)
        .await
        .map_err(db)?;
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE {WHOLLY_BELOW}")))
            .bind(session_id)
            .bind(cut)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let mut dropped = whole as u64;
        let split = sqlx::query(sqlx::AssertSqlSafe(straddling))
            .bind(session_id)
            .bind(cut)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db)?;
        if let Some(row) = split {
            let row = rows::journal_row(&row).map_err(db)?;
            let first = row.seq;
            dropped += (cut - first + 1) as u64;
            let tail = entries_within(vec![row], cut + 1, i64::MAX, form).map_err(db)?;
            sqlx::query("DELETE FROM journal WHERE session_id = $1 AND seq = $2")
                .bind(session_id)
                .bind(first)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            let tail: Vec<Ins<'_>> = tail.iter().map(|e| ins(e, form)).collect();
            tx.insert_entries(&tail).await.map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(dropped)
    })
}

/// The newest seq that must go for `keep` entries to remain, given the row at which the count
/// from the newest down (`total`, this row included) first exceeds `keep`.
fn cut_by_count(seq: i64, n_entries: i32, total: i64, keep: i64) -> i64 {
    let n = i64::from(n_entries);
    let kept_here = keep - (total - n);
    seq + (n - kept_here) - 1
}

/// The newest seq at which the bytes counted from the newest entry down exceed `max`, given the
/// row at which the running sum (`total`, this row included) first does.
/// Bytes as stored (`BodyForm`), as the database's running sum counts them.
fn cut_by_bytes(row: Row, total: i64, max: i64) -> Result<i64, sqlx::Error> {
    let stored = row.stored()?;
    let mut sum = total - stored.iter().map(|(_, b)| b.len() as i64).sum::<i64>();
    for (seq, body) in stored.iter().rev() {
        sum += body.len() as i64;
        if sum > max {
            return Ok(*seq);
        }
    }
    // The database said this row passes `max`; it cannot fall short.
    Ok(stored.first().map_or(0, |(seq, _)| *seq))
}

/// Pairs `(previous seq, seq)` of neighbouring entries (by seq, after `after_seq`) that share
/// a kind out of `kinds`, ascending, at most `limit`: where compaction could merge something.
/// One index scan in the database; no body is read. Inside a pack every neighbour pair shares
/// the kind; between rows, a row and its successor must.
pub(super) async fn journal_neighbours(
    pool: &Pool,
    session_id: &str,
    after_seq: i64,
    kinds: &[&str],
    limit: i64,
) -> Result<Vec<(i64, i64)>, StoreError> {
    if kinds.is_empty() || limit <= 0 {
        return Ok(Vec::new());
    }
    let list: Vec<String> = (0..kinds.len()).map(|i| format!("${}", i + 4)).collect();
    // Driven by the primary key in seq order, so LIMIT stops the scan early; each row of a
    // wanted kind looks its successor up through the same index. Every row returned gives a
    // pair after `after_seq`, except perhaps the first (a pack ending just after it): one more.
    let sql = format!(
        "SELECT a.seq, a.n_entries, b.seq FROM journal a LEFT JOIN journal b \
         ON b.session_id = a.session_id AND b.kind = a.kind AND b.seq = (SELECT MIN(c.seq) \
         FROM journal c WHERE c.session_id = a.session_id AND c.seq > a.seq) \
         WHERE a.session_id = $1 AND a.seq > $2 - {PACK_MAX} AND a.seq + a.n_entries > $2 + 1 \
         AND a.kind IN ({}) AND (a.n_entries > 1 OR b.seq IS NOT NULL) \
         ORDER BY a.seq LIMIT $3",
        list.join(", ")
    );
    let found: Vec<(i64, i32, Option<i64>)> = on_pool!(pool, |p| {
        let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(session_id)
            .bind(after_seq)
            .bind(limit.saturating_add(1));
        for k in kinds {
            q = q.bind(*k);
        }
        q.fetch_all(p).await.map_err(db)?
    });
    Ok(neighbours(&found, after_seq, limit as usize))
}

/// The pairs the neighbour scan's rows `(seq, n_entries, successor of the same kind)` stand for.
fn neighbours(found: &[(i64, i32, Option<i64>)], after_seq: i64, limit: usize) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for &(seq, n, next) in found {
        let last = seq + i64::from(n) - 1;
        let inner = (seq.max(after_seq + 1)..last).map(|s| (s, s + 1));
        out.extend(inner.chain(next.map(|b| (last, b))));
        if out.len() >= limit {
            break;
        }
    }
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, bodies: &[&str]) -> Row {
        Row {
            session_id: "s".into(),
            seq,
            n_entries: bodies.len() as i32,
            kind: "k".into(),
            body: bodies.join("\n"),
            at_ms: 0,
        }
    }

    #[test]
    fn a_count_cut_inside_a_pack_keeps_its_newest_entries() {
        // Rows newest first: 20..=29 (10), then 10..=19 (10): keep 15 → 5 of the older row.
        assert_eq!(cut_by_count(10, 10, 20, 15), 14);
        // Keep exactly the newer row: the whole older row goes.
        assert_eq!(cut_by_count(10, 10, 20, 10), 19);
        // Single-entry rows behave as before.
        assert_eq!(cut_by_count(7, 1, 4, 3), 7);
    }

    #[test]
    fn a_byte_cut_inside_a_pack_finds_the_entry_that_passes() {
        // Newer rows hold 5 bytes; this row holds "aa", "bbb", "c" at 10, 11, 12.
        let r = row(10, &["aa", "bbb", "c"]);
        assert_eq!(cut_by_bytes(r.clone(), 11, 5).unwrap(), 12);
        assert_eq!(cut_by_bytes(r.clone(), 11, 6).unwrap(), 11);
        assert_eq!(cut_by_bytes(r.clone(), 11, 8).unwrap(), 11);
        assert_eq!(cut_by_bytes(r, 11, 9).unwrap(), 10);
    }

    #[test]
    fn neighbour_rows_expand_to_pairs_after_the_start() {
        let found = [(5, 3, Some(8)), (8, 1, None), (20, 2, None)];
        assert_eq!(
            neighbours(&found, 5, 10),
            [(6, 7), (7, 8), (20, 21)],
            "(5,6) is not after 5; row 8 has no successor of its kind"
        );
        assert_eq!(neighbours(&found, 0, 2), [(5, 6), (6, 7)]);
    }
}

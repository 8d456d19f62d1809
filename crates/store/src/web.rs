//! The web console's rows: one-time sign-in codes and cookie credentials (hashes only), and
//! the journal read it pages back with (the last entries before a seq).

use super::backend::{Pool, conflict_or_db, db, now_ms, on_pool, on_write};
use super::form::BodyForm;
use super::journal::read_rows;
use super::pack::PACK_MAX;
use super::rows::JOURNAL_COLUMNS;
use super::{JournalEntry, PrincipalRow, Store, StoreError, rows};

/// A web console's cookie credential (only its SHA-256 is stored).
#[derive(Debug, Clone, PartialEq)]
pub struct WebSessionRow {
    pub hash: String,
    pub principal_id: String,
    /// The token it was exchanged for (`None`: a one-time code from `acpd web-login`).
    pub token_id: Option<String>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
}

/// The web console's part of the store's API.
impl Store {
    /// Stores a one-time sign-in code (its hash) for the web console.
    pub async fn insert_web_login(
        &self,
        hash: &str,
        principal_id: &str,
        expires_at_ms: i64,
    ) -> Result<(), StoreError> {
        insert_login(&self.inner.pool, hash, principal_id, expires_at_ms).await
    }

    /// Uses up a sign-in code: its principal if it existed and had not expired. A second
    /// call with the same hash is `None`.
    pub async fn take_web_login(&self, hash: &str) -> Result<Option<String>, StoreError> {
        take_login(&self.inner.pool, hash).await
    }

    /// Stores a cookie credential; expired ones are dropped on the way.
    pub async fn insert_web_session(&self, row: &WebSessionRow) -> Result<(), StoreError> {
        insert_session(&self.inner.pool, row).await
    }

    /// The live cookie credential with that hash (not expired, its token not revoked).
    pub async fn web_session(
        &self,
        hash: &str,
    ) -> Result<Option<(WebSessionRow, PrincipalRow)>, StoreError> {
        session(&self.inner.pool, hash).await
    }

    /// Sign-out. `false` when there was no such credential.
    pub async fn delete_web_session(&self, hash: &str) -> Result<bool, StoreError> {
        delete_session(&self.inner.pool, hash).await
    }

    /// Ends the web sessions that revoking token `token_id` ends; returns how many.
    pub async fn revoke_web_sessions(&self, token_id: &str) -> Result<u64, StoreError> {
        revoke_for_token(&self.inner.pool, token_id).await
    }

    /// The newest `limit` entries with `seq < before_seq`, ascending.
    pub async fn journal_before(
        &self,
        session_id: &str,
        before_seq: i64,
        limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        journal_before(
            &self.inner.pool,
            &*self.inner.form,
            session_id,
            before_seq,
            limit,
        )
        .await
    }
}

pub(super) async fn insert_login(
    pool: &Pool,
    hash: &str,
    principal_id: &str,
    expires_at_ms: i64,
) -> Result<(), StoreError> {
    on_write!(pool, |p| {
        // Codes nobody used are dropped here rather than by a sweeper task.
        sqlx::query("DELETE FROM web_logins WHERE expires_at_ms < $1")
            .bind(now_ms())
            .execute(p)
            .await
            .map_err(db)?;
        sqlx::query(
            "INSERT INTO web_logins (hash, principal_id, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(hash)
        .bind(principal_id)
        .bind(now_ms())
        .bind(expires_at_ms)
        .execute(p)
        .await
        .map(drop)
        .map_err(conflict_or_db(|| {
            format!("login code not stored: unknown principal {principal_id}")
        }))
    })
}

/// Deletes the code and returns its principal if it was still valid: one statement, so two
/// exchanges racing for one code cannot both win.
pub(super) async fn take_login(pool: &Pool, hash: &str) -> Result<Option<String>, StoreError> {
    on_write!(pool, |p| {
        let row = sqlx::query(
            "DELETE FROM web_logins WHERE hash = $1 RETURNING principal_id, expires_at_ms",
        )
        .bind(hash)
        .fetch_optional(p)
        .await
        .map_err(db)?;
        let Some(row) = row else { return Ok(None) };
        use rows::Columns;
        let principal = row.text("principal_id").map_err(db)?;
        let expires = row.int("expires_at_ms").map_err(db)?;
        Ok((expires > now_ms()).then_some(principal))
    })
}

pub(super) async fn insert_session(pool: &Pool, row: &WebSessionRow) -> Result<(), StoreError> {
    on_write!(pool, |p| {
        sqlx::query("DELETE FROM web_sessions WHERE expires_at_ms < $1")
            .bind(now_ms())
            .execute(p)
            .await
            .map_err(db)?;
        sqlx::query(
            "INSERT INTO web_sessions (hash, principal_id, token_id, created_at_ms, expires_at_ms) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&row.hash)
        .bind(&row.principal_id)
        .bind(&row.token_id)
        .bind(row.created_at_ms)
        .bind(row.expires_at_ms)
        .execute(p)
        .await
        .map(drop)
        .map_err(conflict_or_db(|| "web session not stored".to_owned()))
    })
}

/// A cookie credential that has not expired, whose token (if it came from one) is not
/// revoked, with its principal.
pub(super) async fn session(
    pool: &Pool,
    hash: &str,
) -> Result<Option<(WebSessionRow, PrincipalRow)>, StoreError> {
    on_pool!(pool, |p| {
        let row = sqlx::query(
            "SELECT w.hash, w.principal_id, w.token_id, w.created_at_ms, w.expires_at_ms, \
                    pr.id, pr.name, pr.created_at_ms AS principal_created_at_ms \
             FROM web_sessions w JOIN principals pr ON pr.id = w.principal_id \
             WHERE w.hash = $1 AND w.expires_at_ms > $2 AND (w.token_id IS NULL OR EXISTS \
                 (SELECT 1 FROM tokens t WHERE t.id = w.token_id AND NOT t.revoked))",
        )
        .bind(hash)
        .bind(now_ms())
        .fetch_optional(p)
        .await
        .map_err(db)?;
        let Some(r) = row else { return Ok(None) };
        use rows::Columns;
        let web = WebSessionRow {
            hash: r.text("hash").map_err(db)?,
            principal_id: r.text("principal_id").map_err(db)?,
            token_id: r.opt_text("token_id").map_err(db)?,
            created_at_ms: r.int("created_at_ms").map_err(db)?,
            expires_at_ms: r.int("expires_at_ms").map_err(db)?,
        };
        let principal = PrincipalRow {
            id: r.text("id").map_err(db)?,
            name: r.text("name").map_err(db)?,
            created_at_ms: r.int("principal_created_at_ms").map_err(db)?,
        };
        Ok(Some((web, principal)))
    })
}

pub(super) async fn delete_session(pool: &Pool, hash: &str) -> Result<bool, StoreError> {
    let n = on_write!(pool, |p| {
        sqlx::query("DELETE FROM web_sessions WHERE hash = $1")
            .bind(hash)
            .execute(p)
            .await
            .map_err(db)?
            .rows_affected()
    });
    Ok(n > 0)
}

/// Ends the web sessions made from token `token_id`, and the token-less ones (from
/// `acpd web-login`) of the token's principal: revoking a principal's token signs its
/// browsers out.
pub(super) async fn revoke_for_token(pool: &Pool, token_id: &str) -> Result<u64, StoreError> {
    let n = on_write!(pool, |p| {
        sqlx::query(
            "DELETE FROM web_sessions WHERE token_id = $1 OR (token_id IS NULL AND \
             principal_id = (SELECT principal_id FROM tokens WHERE id = $1))",
        )
        .bind(token_id)
        .execute(p)
        .await
        .map_err(db)?
        .rows_affected()
    });
    Ok(n)
}

/// At most `limit` entries with `seq < before_seq`, the newest of them, ascending: one index
/// range read however long the journal is.
pub(super) async fn journal_before(
    pool: &Pool,
    form: &dyn BodyForm,
    session_id: &str,
    before_seq: i64,
    limit: i64,
) -> Result<Vec<JournalEntry>, StoreError> {
    // Rows holding entries in `[$2 - $3, $2)`, newest first; a short page looks past a gap.
    let sql = format!(
        "SELECT {JOURNAL_COLUMNS} FROM journal WHERE session_id = $1 AND seq < $2 \
         AND seq > $2 - $3 - {PACK_MAX} AND seq + n_entries > $2 - $3 ORDER BY seq DESC"
    );
    // Rows never overlap: the newest row below a seq holds the newest entry below it.
    let prev = "SELECT seq + n_entries - 1 FROM journal WHERE session_id = $1 AND seq < $2 \
         ORDER BY seq DESC LIMIT 1";
    let limit = limit.max(0) as usize;
    let mut out: Vec<JournalEntry> = Vec::new();
    let mut before = before_seq;
    while out.len() < limit {
        let want = (limit - out.len()) as i64;
        let found = read_rows(pool, &sql, session_id, before, want).await?;
        for row in found {
            let mut entries = row.entries(form).map_err(db)?;
            entries.retain(|e| e.seq < before);
            let keep = entries.len().min(limit - out.len());
            out.extend(entries.drain(entries.len() - keep..).rev());
        }
        if out.len() >= limit {
            break;
        }
        // Below what was read, not below the range: compaction may have rewritten the range
        // since, and what is there now must not be skipped.
        let read = out.last().map_or(before, |e| e.seq);
        let prev: Option<i64> = on_pool!(pool, |p| sqlx::query_scalar(prev)
            .bind(session_id)
            .bind(read)
            .fetch_optional(p)
            .await
            .map_err(db)?);
        let Some(prev) = prev else { break };
        before = read.min(prev + 1);
    }
    out.reverse();
    Ok(out)
}

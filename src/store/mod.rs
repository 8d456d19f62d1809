//! Durable memory of acpd: sessions, their journals, agent-private state, principals and tokens.
//!
//! `Store` picks SQLite or Postgres from the URL. It knows nothing of ACP or JSON-RPC: journal
//! bodies are opaque JSON text written and read back byte for byte.
//!
//! THIS FILE IS THE CONTRACT the session layer codes against.
//!
//! Layout: `backend` (pools, migrations, error triage), `writer` (group commit of journal
//! appends), `journal` (bulk journal SQL), `rows` (row decoding, list cursor).

mod backend;
mod journal;
mod rows;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use backend::{Pool, begin_write, db, is_constraint, on_pool};
use journal::{Ins, JournalSql};
use rows::SESSION_COLUMNS;

pub use backend::JOURNAL_FORMAT;

/// Errors at the store boundary. The session layer maps them to JSON-RPC errors once.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid store url: {0}")]
    InvalidUrl(String),
    #[error(
        "the store's schema version {found} is newer than this acpd knows ({known}); upgrade acpd"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("invalid cursor")]
    InvalidCursor,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// Which backend a `Store` talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

/// Tuning knobs, all with safe defaults.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most journal entries committed in one transaction.
    pub journal_batch_max: usize,
    /// Longest an append waits for companions before its batch is committed.
    pub journal_batch_delay: Duration,
    /// Appends buffered while the database is unreachable before `append` applies backpressure.
    pub journal_queue: usize,
    /// Pool size.
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            journal_batch_max: 512,
            journal_batch_delay: Duration::from_millis(2),
            journal_queue: 8192,
            max_connections: 8,
        }
    }
}

/// One session row. Times are Unix epoch milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub id: String,
    pub principal_id: String,
    /// Agent profile name (`builtin`, or a `[agents.NAME]` profile).
    pub agent: String,
    /// The id the agent itself uses for this session, when it has one.
    pub agent_session_id: Option<String>,
    pub cwd: String,
    /// JSON array of absolute paths.
    pub additional_dirs: String,
    pub title: Option<String>,
    pub mode_id: Option<String>,
    /// JSON object: config option id -> value.
    pub config_values: String,
    /// JSON object: opaque per-session data of the session layer (e.g. the agent's last
    /// `modes`/`configOptions`, the original `mcpServers`).
    pub meta: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub closed: bool,
    /// Highest journal seq written for this session (0 when empty).
    pub last_seq: i64,
    /// Replica that currently owns the live session (roadmap: several replicas).
    pub owner_instance: Option<String>,
    pub lease_until_ms: Option<i64>,
}

/// Fields of a session to change; `None` leaves a field alone. Always bumps `updated_at_ms`.
#[derive(Debug, Clone, Default)]
pub struct SessionPatch {
    pub agent_session_id: Option<Option<String>>,
    pub cwd: Option<String>,
    pub additional_dirs: Option<String>,
    pub title: Option<Option<String>>,
    pub mode_id: Option<Option<String>>,
    pub config_values: Option<String>,
    pub meta: Option<String>,
    pub closed: Option<bool>,
    pub owner_instance: Option<Option<String>>,
    pub lease_until_ms: Option<Option<i64>>,
    pub updated_at_ms: i64,
}

/// A `session/list` query, scoped to one principal.
#[derive(Debug, Clone)]
pub struct ListQuery {
    pub principal_id: String,
    /// Exact match on the session's cwd.
    pub cwd: Option<String>,
    /// Opaque cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct SessionPage {
    pub sessions: Vec<SessionRow>,
    pub next_cursor: Option<String>,
}

/// One journal entry as stored: the exact JSON text that was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    pub session_id: String,
    pub seq: i64,
    /// What the body is, e.g. the `sessionUpdate` kind; opaque to the store.
    pub kind: String,
    pub body: String,
    pub at_ms: i64,
}

/// Durable watermark of one session's journal: the highest seq known committed.
pub type DurableSeq = watch::Sender<i64>;

/// An append on its way to the group-commit writer.
#[derive(Debug, Clone)]
pub struct NewEntry {
    pub session_id: Arc<str>,
    pub seq: i64,
    pub kind: Arc<str>,
    pub body: Arc<str>,
    pub at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct PrincipalRow {
    pub id: String,
    pub name: String,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone)]
pub struct TokenRow {
    pub id: String,
    pub principal_id: String,
    pub name: String,
    pub created_at_ms: i64,
    pub last_used_ms: Option<i64>,
    pub revoked: bool,
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// To the group-commit writer; see `writer`.
    appends: mpsc::Sender<writer::Msg>,
}

/// Current time as Unix epoch milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A unique or foreign-key violation becomes `Conflict(what)`; anything else maps as usual.
fn conflict_or_db(what: impl FnOnce() -> String) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| {
        if is_constraint(&e) {
            StoreError::Conflict(what())
        } else {
            db(e)
        }
    }
}

impl Store {
    /// Connects (creating a SQLite file if missing), runs migrations, refuses a newer schema,
    /// and starts the journal writer.
    pub async fn open(url: &str, opts: StoreOptions) -> Result<Store, StoreError> {
        let pool = Pool::connect(url, opts.max_connections).await?;
        if let Err(e) = pool.migrate().await {
            pool.close().await;
            return Err(e);
        }
        let appends = writer::spawn(pool.clone(), &opts);
        Ok(Store {
            inner: Arc::new(Inner { pool, appends }),
        })
    }

    /// Runs migrations only; returns the schema version now in place.
    pub async fn migrate(url: &str) -> Result<i64, StoreError> {
        let pool = Pool::connect(url, 1).await?;
        let version = pool.migrate().await;
        pool.close().await;
        version
    }

    pub fn kind(&self) -> StoreKind {
        self.inner.pool.kind()
    }

    /// Cheap round trip, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_pool!(&self.inner.pool, |p| sqlx::query("SELECT 1")
            .execute(p)
            .await
            .map(drop)
            .map_err(db))
    }

    /// Flushes the journal writer (every queued append committed or reported) and closes.
    ///
    /// Appends after (or racing with) `close` fail with `Unavailable`. While the database is
    /// unreachable the writer keeps retrying, so callers bound this with their own deadline.
    pub async fn close(&self) {
        let (ack, flushed) = oneshot::channel();
        if self
            .inner
            .appends
            .send(writer::Msg::Close(ack))
            .await
            .is_ok()
        {
            // An error means the writer is already gone, which is just as final.
            let _ = flushed.await;
        }
        self.inner.pool.close().await;
    }

    /// Fails with `Conflict` when a session with that id exists (even a deleted one).
    pub async fn insert_session(&self, row: &SessionRow) -> Result<(), StoreError> {
        on_pool!(&self.inner.pool, |p| {
            sqlx::query(
            "INSERT INTO sessions (id, principal_id, agent, agent_session_id, cwd, additional_dirs, title, \
             mode_id, config_values, meta, created_at_ms, updated_at_ms, closed, last_seq, owner_instance, \
             lease_until_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        )
        .bind(&row.id)
        .bind(&row.principal_id)
        .bind(&row.agent)
        .bind(&row.agent_session_id)
        .bind(&row.cwd)
        .bind(&row.additional_dirs)
        .bind(&row.title)
        .bind(&row.mode_id)
        .bind(&row.config_values)
        .bind(&row.meta)
        .bind(row.created_at_ms)
        .bind(row.updated_at_ms)
        .bind(row.closed)
        .bind(row.last_seq)
        .bind(&row.owner_instance)
        .bind(row.lease_until_ms)
        .execute(p)
        .await
        .map(drop)
        .map_err(conflict_or_db(|| format!("session {} already exists", row.id)))
        })
    }

    /// A session that exists and is not deleted.
    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        on_pool!(&self.inner.pool, |p| {
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND deleted_at_ms IS NULL"
            )))
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(db)?;
            row.as_ref().map(rows::session_row).transpose().map_err(db)
        })
    }

    /// Fails with `Conflict` when the session is unknown or deleted.
    pub async fn update_session(&self, id: &str, patch: &SessionPatch) -> Result<(), StoreError> {
        // One fixed statement: for each nullable field a "set it?" flag and the new value.
        let result = on_pool!(&self.inner.pool, |p| sqlx::query(
            "UPDATE sessions SET \
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
             WHERE id = $1 AND deleted_at_ms IS NULL"
        )
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
        .await
        .map_err(db)?
        .rows_affected());
        if result == 0 {
            return Err(StoreError::Conflict(format!("no session {id}")));
        }
        Ok(())
    }

    /// Newest first by creation, stable under concurrent inserts and updates.
    ///
    /// Keyset pagination on `(created_at_ms, id)`: a page never repeats or skips a session that
    /// existed when the listing started. A `limit` of 0 is read as 1.
    pub async fn list_sessions(&self, q: &ListQuery) -> Result<SessionPage, StoreError> {
        let after = q.cursor.as_deref().map(rows::decode_cursor).transpose()?;
        let limit = i64::from(q.limit.max(1));
        // Four fixed statements rather than "$n IS NULL OR ...", so each keeps a plan that
        // uses the matching index.
        let sql = match (&q.cwd, &after) {
            (None, None) => "principal_id = $1 ORDER BY created_at_ms DESC, id DESC LIMIT $2",
            (Some(_), None) => {
                "principal_id = $1 AND cwd = $3 ORDER BY created_at_ms DESC, id DESC LIMIT $2"
            }
            (None, Some(_)) => {
                "principal_id = $1 AND (created_at_ms, id) < ($3, $4) ORDER BY created_at_ms DESC, id DESC LIMIT $2"
            }
            (Some(_), Some(_)) => {
                "principal_id = $1 AND cwd = $3 AND (created_at_ms, id) < ($4, $5) \
                 ORDER BY created_at_ms DESC, id DESC LIMIT $2"
            }
        };
        let sql =
            format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE deleted_at_ms IS NULL AND {sql}");
        let mut sessions = on_pool!(&self.inner.pool, |p| {
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(&q.principal_id)
                .bind(limit + 1);
            if let Some(cwd) = &q.cwd {
                query = query.bind(cwd);
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

    /// Marks the session deleted and removes its journal and agent state. `false` if unknown.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        let pool = &self.inner.pool;
        on_pool!(pool, |p| {
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

    /// Queues an append for group commit. Returns once queued (waits only when the queue is
    /// full). `durable` is advanced to `entry.seq` once the entry's batch has committed.
    ///
    /// Entries of a deleted session are discarded (and acknowledged). An entry the database
    /// rejects (e.g. its session never existed) is logged and never acknowledged.
    pub async fn append(
        &self,
        entry: NewEntry,
        durable: Arc<DurableSeq>,
    ) -> Result<(), StoreError> {
        self.inner
            .appends
            .send(writer::Msg::Append(entry, durable))
            .await
            .map_err(|_| StoreError::Unavailable("the store is closed".into()))
    }

    /// Entries with `seq > after_seq`, ascending, at most `limit`.
    pub async fn journal_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        on_pool!(&self.inner.pool, |p| {
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

    /// Replaces the entries with `first_seq <= seq <= last_seq` by `entries` (compaction).
    ///
    /// Atomic. `entries` must belong to `session_id`, lie within the range and have strictly
    /// increasing seqs, else `Conflict`; so must the session exist. `last_seq` of the session
    /// never goes down, so a seq once handed out is never reused.
    pub async fn replace_journal_range(
        &self,
        session_id: &str,
        first_seq: i64,
        last_seq: i64,
        entries: &[JournalEntry],
    ) -> Result<(), StoreError> {
        let mut prev = i64::MIN;
        for e in entries {
            if e.session_id != session_id || e.seq < first_seq || e.seq > last_seq || e.seq <= prev
            {
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
        let pool = &self.inner.pool;
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

    /// Count and total body bytes of a session's journal.
    pub async fn journal_size(&self, session_id: &str) -> Result<(i64, i64), StoreError> {
        on_pool!(&self.inner.pool, |p| {
            sqlx::query_as(
            "SELECT COUNT(*), COALESCE(SUM(OCTET_LENGTH(body)), 0) FROM journal WHERE session_id = $1"
        )
        .bind(session_id)
        .fetch_one(p)
        .await
        .map_err(db)
        })
    }

    /// Sets one agent-private value; `Conflict` when the session is unknown or deleted.
    pub async fn put_agent_state(
        &self,
        session_id: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        let written = on_pool!(&self.inner.pool, |p| sqlx::query(
            "INSERT INTO agent_state (session_id, key, value) \
             SELECT $1, $2, $3 WHERE EXISTS \
               (SELECT 1 FROM sessions WHERE id = $1 AND deleted_at_ms IS NULL) \
             ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value"
        )
        .bind(session_id)
        .bind(key)
        .bind(value)
        .execute(p)
        .await
        .map_err(db)?
        .rows_affected());
        if written == 0 {
            return Err(StoreError::Conflict(format!("no session {session_id}")));
        }
        Ok(())
    }

    pub async fn agent_state(
        &self,
        session_id: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        on_pool!(&self.inner.pool, |p| sqlx::query_scalar(
            "SELECT value FROM agent_state WHERE session_id = $1 AND key = $2"
        )
        .bind(session_id)
        .bind(key)
        .fetch_optional(p)
        .await
        .map_err(db))
    }

    /// The principal with that name, created if missing.
    pub async fn ensure_principal(&self, name: &str) -> Result<PrincipalRow, StoreError> {
        on_pool!(&self.inner.pool, |p| {
            sqlx::query("INSERT INTO principals (id, name, created_at_ms) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
                .bind(uuid::Uuid::new_v4().to_string())
                .bind(name)
                .bind(now_ms())
                .execute(p)
                .await
                .map_err(db)?;
            let row = sqlx::query("SELECT id, name, created_at_ms FROM principals WHERE name = $1")
                .bind(name)
                .fetch_one(p)
                .await
                .map_err(db)?;
            rows::principal_row(&row).map_err(db)
        })
    }

    /// Stores a token (only its hash). `Conflict` for an unknown principal or a hash in use.
    pub async fn insert_token(
        &self,
        principal_id: &str,
        name: &str,
        hash: &str,
    ) -> Result<TokenRow, StoreError> {
        let token = TokenRow {
            id: uuid::Uuid::new_v4().to_string(),
            principal_id: principal_id.to_owned(),
            name: name.to_owned(),
            created_at_ms: now_ms(),
            last_used_ms: None,
            revoked: false,
        };
        on_pool!(&self.inner.pool, |p| {
            sqlx::query(
            "INSERT INTO tokens (id, principal_id, name, hash, created_at_ms, last_used_ms, revoked) \
             VALUES ($1, $2, $3, $4, $5, NULL, FALSE)"
        )
        .bind(&token.id)
        .bind(&token.principal_id)
        .bind(&token.name)
        .bind(hash)
        .bind(token.created_at_ms)
        .execute(p)
        .await
        .map(drop)
        .map_err(conflict_or_db(|| {
            format!("token not stored: unknown principal {principal_id} or hash already in use")
        }))
        })?;
        Ok(token)
    }

    /// The live (not revoked) token with that hash and its principal; marks it used.
    pub async fn token_by_hash(
        &self,
        hash: &str,
    ) -> Result<Option<(TokenRow, PrincipalRow)>, StoreError> {
        on_pool!(&self.inner.pool, |p| {
            let Some(token) = sqlx::query(
                "UPDATE tokens SET last_used_ms = $2 WHERE hash = $1 AND NOT revoked \
                 RETURNING id, principal_id, name, created_at_ms, last_used_ms, revoked",
            )
            .bind(hash)
            .bind(now_ms())
            .fetch_optional(p)
            .await
            .map_err(db)?
            else {
                return Ok(None);
            };
            let token = rows::token_row(&token).map_err(db)?;
            let principal =
                sqlx::query("SELECT id, name, created_at_ms FROM principals WHERE id = $1")
                    .bind(&token.principal_id)
                    .fetch_optional(p)
                    .await
                    .map_err(db)?;
            match principal {
                Some(principal) => Ok(Some((token, rows::principal_row(&principal).map_err(db)?))),
                None => Ok(None),
            }
        })
    }

    /// Every token, revoked ones included, oldest first.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        on_pool!(&self.inner.pool, |p| {
            let found = sqlx::query(
                "SELECT id, principal_id, name, created_at_ms, last_used_ms, revoked FROM tokens \
                 ORDER BY created_at_ms, id",
            )
            .fetch_all(p)
            .await
            .map_err(db)?;
            found
                .iter()
                .map(rows::token_row)
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)
        })
    }

    /// `false` when no live token has that id.
    pub async fn revoke_token(&self, id: &str) -> Result<bool, StoreError> {
        let revoked = on_pool!(&self.inner.pool, |p| sqlx::query(
            "UPDATE tokens SET revoked = TRUE WHERE id = $1 AND NOT revoked"
        )
        .bind(id)
        .execute(p)
        .await
        .map_err(db)?
        .rows_affected());
        Ok(revoked > 0)
    }
}

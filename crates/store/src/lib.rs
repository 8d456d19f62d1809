//! Durable memory of acpd: sessions, their journals, agent-private state, principals and tokens.
//!
//! `Store` picks SQLite or Postgres from the URL. It knows nothing of ACP or JSON-RPC: journal
//! bodies are opaque JSON text written and read back byte for byte.
//!
//! THIS FILE IS THE CONTRACT the session layer codes against. The other layers that use the
//! store hold a narrow handle (`handles`: `WebStore`, `RegistryStore`, `ClusterStore`) that
//! exposes only their calls.
//!
//! Layout: `backend` (pools, migrations, error triage), `writer` (group commit of journal
//! appends), `checkpoint` (SQLite WAL checkpoints off the commits), `pack` (a run of entries
//! stored as one row), `journal` (journal SQL), `trim` (retention's journal SQL), `sessions`
//! (session rows, agent state), `auth`
//! (principals, tokens), `grants` (shared sessions), `web` (the web console's sign-in codes and
//! cookie credentials, its journal page read), `lease` (session leases, replicas), `signals`
//! (revocations announced with NOTIFY), `usage` (what turns spent, rollups, permission
//! decisions: its `impl Store` block is part of this contract), `rows` (row decoding, list cursor), `handles` (the
//! narrow handles).

mod auth;
mod backend;
mod checkpoint;
mod entry;
mod form;
mod grants;
mod handles;
mod journal;
mod journal_pg;
mod journal_sqlite;
mod lease;
pub mod metrics;
mod new_rows;
pub use new_rows::ROW_QUEUED;
mod pack;
mod rows;
mod sessions;
mod signals;
mod trim;
mod usage;
pub use usage::{DecisionRow, TurnUsageRow, UsageQuery, UsageRollup};
mod web;
pub use web::WebSessionRow;
mod writer;

use std::sync::Arc;

use tokio::sync::mpsc;

use backend::{Pool, db, on_pool};

pub use backend::JOURNAL_FORMAT;
pub use entry::{DurableSeq, JournalEntry, JournalWatch, NewEntry, Watermark, watermark};
pub use form::{BodyForm, Verbatim};
pub use handles::{ClusterStore, RegistryStore, WebStore};
pub use lease::{Acquired, ReplicaOptions};
pub use writer::{AppendError, AppendRoom};

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
    /// Another process holds the SQLite file (`StoreOptions::exclusive`).
    #[error("{0}")]
    InUse(String),
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
    /// Most journal entries committed in one transaction. Half the queue: under load a commit
    /// takes thousands, so 1 000 sessions streaming at once put several entries each in one
    /// commit, side by side in the journal's `(session_id, seq)` index, rather than a page of
    /// that index (4 KiB of WAL) per entry (issue 45's `fanout` row, with 512: 4.7 GB written
    /// for 300 000 updates, 7 k/s; 0.5 GB and 15 k/s at 8 192). Not the whole queue: 8 192 was no
    /// faster, and a commit past `STALLED_AFTER` (1 s) counts as a stalled store.
    pub journal_batch_max: usize,
    /// Appends buffered while the database is unreachable before `append` applies backpressure.
    pub journal_queue: usize,
    /// Pool size.
    pub max_connections: u32,
    /// Claim a SQLite file for this process alone (`acpd serve`, `acpd stdio`): a second
    /// daemon on the same file refuses to start. SQLite is single-replica; two daemons would
    /// each think they own every session. Admin commands leave it off and share the file.
    pub exclusive: bool,
    /// This process is one replica of several on one Postgres: `close` gives back the session
    /// leases it holds once the journal writer is flushed (a drain's hand-off).
    pub replica: Option<ReplicaOptions>,
    /// How journal bodies are stored (`BodyForm`); a journal must be read with the form it
    /// was written with. Default: as they come.
    pub body_form: Arc<dyn BodyForm>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            journal_batch_max: 4096,
            journal_queue: 8192,
            max_connections: 8,
            exclusive: false,
            replica: None,
            body_form: Arc::new(Verbatim),
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
    /// Exact match on the session's agent profile (`None`: every profile).
    pub agent: Option<String>,
    /// Opaque cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct SessionPage {
    pub sessions: Vec<SessionRow>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub struct PrincipalRow {
    pub id: String,
    pub name: String,
    pub created_at_ms: i64,
}

/// A principal's grant on another's session (shared sessions).
#[derive(Debug, Clone, PartialEq)]
pub struct GrantRow {
    pub session_id: String,
    pub principal_id: String,
    /// Opaque here: "observer" or "controller" to the session layer.
    pub role: String,
    /// The principal that granted it.
    pub granted_by: String,
    pub created_at_ms: i64,
    pub revoked_at_ms: Option<i64>,
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
    writer_finished: writer::Finished,
    /// Whether the writer's commits are stuck (`writes_stalled`).
    writes_stalled: Arc<writer::Stall>,
    /// `StoreOptions::replica`.
    replica: Option<String>,
    /// The lock file of an exclusive SQLite store, held (flock) for the store's life; the OS
    /// lets it go when the process dies, however it dies.
    _owner: Option<std::fs::File>,
    /// A SQLite file's WAL checkpoints (`checkpoint.rs`).
    checkpoints: Option<checkpoint::Checkpoints>,
    /// `StoreOptions::body_form`; the writer holds it too.
    form: Arc<dyn BodyForm>,
    /// New sessions' rows queued to the writer (`queue_session`); the writer holds it too.
    new_rows: Arc<new_rows::NewRows>,
}

impl Store {
    /// Connects (creating a SQLite file if missing), runs migrations, refuses a newer schema,
    /// and starts the journal writer.
    pub async fn open(url: &str, opts: StoreOptions) -> Result<Store, StoreError> {
        // The lock before the first connection: a second daemon is refused at once, before
        // it opens (and may wait on the busy timeout of) a file another daemon is writing.
        let owner = match opts.exclusive {
            true => backend::claim_sqlite(url)?,
            false => None,
        };
        let idle_tx = opts.replica.as_ref().map(|r| r.lease_ttl);
        let pool = Pool::connect(url, opts.max_connections, idle_tx).await?;
        if let Err(e) = pool.migrate().await {
            pool.close().await;
            return Err(e);
        }
        let checkpoints = match pool.sqlite_file(url) {
            Some(o) => match checkpoint::Checkpoints::start(&o).await {
                Ok(c) => Some(c),
                Err(e) => {
                    pool.close().await;
                    return Err(e);
                }
            },
            None => None,
        };
        let new_rows = Arc::new(new_rows::NewRows::default());
        let (appends, writer_finished, writes_stalled) =
            writer::spawn(pool.clone(), &opts, new_rows.clone());
        Ok(Store {
            inner: Arc::new(Inner {
                pool,
                appends,
                writer_finished,
                writes_stalled,
                replica: opts.replica.map(|r| r.id),
                _owner: owner,
                checkpoints,
                form: opts.body_form,
                new_rows,
            }),
        })
    }

    /// Runs migrations only; returns the schema version now in place.
    pub async fn migrate(url: &str) -> Result<i64, StoreError> {
        let pool = Pool::connect(url, 1, None).await?;
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
        // A send error means another `close` got there first; wait for the writer all the same,
        // so the pool is never closed under a flush in progress.
        let _ = self.inner.appends.send(writer::Msg::Close).await;
        let mut finished = self.inner.writer_finished.clone();
        // Only ever resolves with an error: the writer never sends, it drops its sender.
        let _ = finished.changed().await;
        if let Some(replica) = &self.inner.replica {
            match lease::release_all(&self.inner.pool, replica).await {
                Ok(n) => tracing::info!(replica, sessions = n, "session leases given back"),
                Err(e) => {
                    tracing::warn!(replica, error = %e, "cannot give back the session leases; peers take them over once they expire")
                }
            }
        }
        if let Some(c) = &self.inner.checkpoints {
            c.stop().await;
        }
        self.inner.pool.close().await;
    }

    // The session leases of replicas (`acquire_lease`, `renew_leases`, `release_lease`,
    // `replica_heartbeat`) are in `lease.rs`, beside their SQL.

    /// Fails with `Conflict` when a session with that id exists (even a deleted one).
    pub async fn insert_session(&self, row: &SessionRow) -> Result<(), StoreError> {
        sessions::insert_session(&self.inner.pool, row).await
    }

    /// A session that exists and is not deleted.
    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        self.row_settled(id).await;
        sessions::session(&self.inner.pool, id).await
    }

    /// Fails with `Conflict` when the session is unknown or deleted.
    pub async fn update_session(&self, id: &str, patch: &SessionPatch) -> Result<(), StoreError> {
        self.row_settled(id).await;
        sessions::update_session(&self.inner.pool, id, patch).await
    }

    /// Newest first by creation, stable under concurrent inserts and updates.
    ///
    /// Keyset pagination on `(created_at_ms, id)`: a page never repeats or skips a session that
    /// existed when the listing started. A `limit` of 0 is read as 1.
    pub async fn list_sessions(&self, q: &ListQuery) -> Result<SessionPage, StoreError> {
        self.inner.new_rows.all_settled().await;
        sessions::list_sessions(&self.inner.pool, q).await
    }

    /// Marks the session deleted and removes its journal and agent state. `false` if unknown.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        self.row_settled(id).await;
        sessions::delete_session(&self.inner.pool, id).await
    }

    /// Queues an append for group commit. Returns once queued (waits only when the queue is
    /// full). `durable` is advanced to `entry.seq` once the entry's batch has committed. The
    /// same transaction raises the session row's `last_seq` and its `updated_at_ms` to the
    /// entry's `at_ms`: an append is activity.
    ///
    /// Entries of a deleted session are discarded (and acknowledged). An entry the database
    /// rejects as data (e.g. its session never existed, a constraint fails) stops `durable`:
    /// it reports `rejected: Some(seq)` and never passes the seq below it; later appends
    /// through that watch are not written. Connection failures are retried until they pass.
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

    /// `append` without waiting: `Full` when the writer's queue is (the database is away or
    /// far behind), so a caller that must not wait on the store decides what to do then.
    pub fn try_append(&self, entry: NewEntry, durable: Arc<DurableSeq>) -> Result<(), AppendError> {
        use tokio::sync::mpsc::error::TrySendError;
        match self
            .inner
            .appends
            .try_send(writer::Msg::Append(entry, durable))
        {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(AppendError::Full),
            Err(TrySendError::Closed(_)) => Err(AppendError::Closed),
        }
    }

    /// Resolves once the writer's queue has room for one append (`None`: the store is
    /// closed). Owned, so a caller's `select!` can wait for it among other things.
    pub fn append_room(&self) -> impl Future<Output = Option<AppendRoom>> + Send + 'static {
        let tx = self.inner.appends.clone();
        async move { tx.reserve_owned().await.ok().map(AppendRoom) }
    }

    /// Whether the journal writer is stuck: retrying a commit that failed (the database went
    /// away), or in one commit for over a second (a lock, a database that stopped answering).
    /// What is queued is not becoming durable meanwhile.
    pub fn writes_stalled(&self) -> bool {
        self.inner.writes_stalled.stalled()
    }

    /// Entries with `seq > after_seq`, ascending, at most `limit`.
    pub async fn journal_after(
        &self,
        session_id: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        journal::journal_after(
            &self.inner.pool,
            &*self.inner.form,
            session_id,
            after_seq,
            limit,
        )
        .await
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
        let form = &*self.inner.form;
        journal::replace_journal_range(
            &self.inner.pool,
            form,
            session_id,
            first_seq,
            last_seq,
            entries,
        )
        .await
    }

    /// Pairs `(previous seq, seq)` of neighbouring entries after `after_seq` whose kinds are
    /// equal and one of `kinds`, ascending, at most `limit`: a scan in the database that reads
    /// no body, so compaction reads only the stretches where it can merge something.
    pub async fn journal_neighbours(
        &self,
        session_id: &str,
        after_seq: i64,
        kinds: &[&str],
        limit: i64,
    ) -> Result<Vec<(i64, i64)>, StoreError> {
        trim::journal_neighbours(&self.inner.pool, session_id, after_seq, kinds, limit).await
    }

    /// Drops the oldest entries of a session's journal until at most `max_entries` entries and
    /// `max_bytes` body bytes remain (0: no such cap); returns how many went. Works in the
    /// database (counts, running sums, one range delete), in bounded memory at any length.
    pub async fn trim_journal(
        &self,
        session_id: &str,
        max_entries: u64,
        max_bytes: u64,
    ) -> Result<u64, StoreError> {
        trim::trim_journal(
            &self.inner.pool,
            &*self.inner.form,
            session_id,
            max_entries,
            max_bytes,
        )
        .await
    }

    /// Count and total body bytes of a session's journal.
    pub async fn journal_size(&self, session_id: &str) -> Result<(i64, i64), StoreError> {
        trim::journal_size(&self.inner.pool, session_id).await
    }

    /// Sets one agent-private value; `Conflict` when the session is unknown or deleted.
    pub async fn put_agent_state(
        &self,
        session_id: &str,
        key: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        self.row_settled(session_id).await;
        sessions::put_agent_state(&self.inner.pool, session_id, key, value).await
    }

    pub async fn agent_state(
        &self,
        session_id: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        self.row_settled(session_id).await;
        sessions::agent_state(&self.inner.pool, session_id, key).await
    }

    /// The principal with that name, created if missing.
    pub async fn ensure_principal(&self, name: &str) -> Result<PrincipalRow, StoreError> {
        auth::ensure_principal(&self.inner.pool, name).await
    }

    /// Stores a token (only its hash). `Conflict` for an unknown principal or a hash in use.
    pub async fn insert_token(
        &self,
        principal_id: &str,
        name: &str,
        hash: &str,
    ) -> Result<TokenRow, StoreError> {
        auth::insert_token(&self.inner.pool, principal_id, name, hash).await
    }

    /// The live (not revoked) token with that hash and its principal; marks it used.
    pub async fn token_by_hash(
        &self,
        hash: &str,
    ) -> Result<Option<(TokenRow, PrincipalRow)>, StoreError> {
        auth::token_by_hash(&self.inner.pool, hash).await
    }

    /// Every token, revoked ones included, oldest first.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        auth::list_tokens(&self.inner.pool).await
    }

    /// `false` when no live token has that id. Announced to listening daemons (Postgres).
    pub async fn revoke_token(&self, id: &str) -> Result<bool, StoreError> {
        let revoked = auth::revoke_token(&self.inner.pool, id).await?;
        if revoked {
            signals::announce(&self.inner.pool, "token").await;
        }
        Ok(revoked)
    }

    /// Signals that a token or grant was revoked somewhere (Postgres `LISTEN`); `None` on
    /// SQLite. Only a hint to check now: the rows are the truth.
    pub fn revocation_signals(&self) -> Option<mpsc::Receiver<()>> {
        signals::listen(&self.inner.pool)
    }
}

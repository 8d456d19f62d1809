//! Durable memory of acpd: sessions, their journals, agent-private state, principals and tokens.
//!
//! `Store` picks SQLite or Postgres from the URL. It knows nothing of ACP or JSON-RPC: journal
//! bodies are opaque JSON text written and read back byte for byte.
//!
//! THIS FILE IS THE CONTRACT the session layer codes against. Bodies are stubs until the
//! store implementation lands.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

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
    _private: (),
}

impl Store {
    /// Connects (creating a SQLite file if missing), runs migrations, refuses a newer schema,
    /// and starts the journal writer.
    pub async fn open(_url: &str, _opts: StoreOptions) -> Result<Store, StoreError> {
        todo!()
    }

    /// Runs migrations only; returns the schema version now in place.
    pub async fn migrate(_url: &str) -> Result<i64, StoreError> {
        todo!()
    }

    pub fn kind(&self) -> StoreKind {
        todo!()
    }

    /// Cheap round trip, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        todo!()
    }

    /// Flushes the journal writer (every queued append committed or reported) and closes.
    pub async fn close(&self) {
        todo!()
    }

    pub async fn insert_session(&self, _row: &SessionRow) -> Result<(), StoreError> {
        todo!()
    }

    /// A session that exists and is not deleted.
    pub async fn session(&self, _id: &str) -> Result<Option<SessionRow>, StoreError> {
        todo!()
    }

    pub async fn update_session(&self, _id: &str, _patch: &SessionPatch) -> Result<(), StoreError> {
        todo!()
    }

    /// Newest first by creation, stable under concurrent inserts and updates.
    pub async fn list_sessions(&self, _q: &ListQuery) -> Result<SessionPage, StoreError> {
        todo!()
    }

    /// Marks the session deleted and removes its journal and agent state. `false` if unknown.
    pub async fn delete_session(&self, _id: &str) -> Result<bool, StoreError> {
        todo!()
    }

    /// Queues an append for group commit. Returns once queued (waits only when the queue is
    /// full). `durable` is advanced to `entry.seq` once the entry's batch has committed.
    pub async fn append(
        &self,
        _entry: NewEntry,
        _durable: Arc<DurableSeq>,
    ) -> Result<(), StoreError> {
        todo!()
    }

    /// Entries with `seq > after_seq`, ascending, at most `limit`.
    pub async fn journal_after(
        &self,
        _session_id: &str,
        _after_seq: i64,
        _limit: i64,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        todo!()
    }

    /// Replaces the entries with `first_seq <= seq <= last_seq` by `entries` (compaction).
    pub async fn replace_journal_range(
        &self,
        _session_id: &str,
        _first_seq: i64,
        _last_seq: i64,
        _entries: &[JournalEntry],
    ) -> Result<(), StoreError> {
        todo!()
    }

    /// Count and total body bytes of a session's journal.
    pub async fn journal_size(&self, _session_id: &str) -> Result<(i64, i64), StoreError> {
        todo!()
    }

    pub async fn put_agent_state(
        &self,
        _session_id: &str,
        _key: &str,
        _value: &str,
    ) -> Result<(), StoreError> {
        todo!()
    }

    pub async fn agent_state(
        &self,
        _session_id: &str,
        _key: &str,
    ) -> Result<Option<String>, StoreError> {
        todo!()
    }

    /// The principal with that name, created if missing.
    pub async fn ensure_principal(&self, _name: &str) -> Result<PrincipalRow, StoreError> {
        todo!()
    }

    /// Stores a token (only its hash).
    pub async fn insert_token(
        &self,
        _principal_id: &str,
        _name: &str,
        _hash: &str,
    ) -> Result<TokenRow, StoreError> {
        todo!()
    }

    /// The live (not revoked) token with that hash and its principal; marks it used.
    pub async fn token_by_hash(
        &self,
        _hash: &str,
    ) -> Result<Option<(TokenRow, PrincipalRow)>, StoreError> {
        todo!()
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        todo!()
    }

    pub async fn revoke_token(&self, _id: &str) -> Result<bool, StoreError> {
        todo!()
    }
}

//! The two connection pools behind `Store`: URL parsing, connecting, migrations, error triage.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{StoreError, StoreKind};

/// Both migration folders hold the same file names, so both migrators know the same versions.
static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

/// Newest journal disk format this build reads and writes (`meta.journal_format`).
pub const JOURNAL_FORMAT: i64 = 3;

/// A request waits at most this long for a pooled connection, so an unreachable database turns
/// into a clear `StoreError::Unavailable` instead of a hang.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long SQLite waits on another connection's write lock before reporting busy.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite writer connection's page cache, as `cache_size` takes it (negative: KiB).
const WRITER_CACHE_KIB: i64 = -16 * 1024;

/// WAL frames (pages, 4 KiB by default) past which the checkpoint task makes a SQLite file's
/// WAL start over (`checkpoint.rs`).
pub(crate) const WAL_RESTART_FRAMES: i64 = 4096;

/// Bytes past which a SQLite file's WAL is truncated when it starts over
/// (`journal_size_limit`): 4× the restart size at 4 KiB pages.
const WAL_FILE_LIMIT: i64 = WAL_RESTART_FRAMES * 4096 * 4;

/// Enum dispatch over the two pools; both are cheap `Arc` handles.
#[derive(Clone, Debug)]
pub(crate) enum Pool {
    /// Readers, and the writer: a pool of one connection that every write goes through
    /// (`on_write!`). SQLite lets one connection write at a time, and a second one that asks
    /// sleeps in SQLite's busy handler, 1 ms and up, even when the lock is freed microseconds
    /// later; queued here instead, a write waits exactly as long as the one before it.
    Sqlite(SqlitePool, SqlitePool),
    Postgres(PgPool),
}

/// Runs the same block against whichever pool is in use. The block is compiled once per
/// backend, so it may only use SQL both understand (`$N` placeholders work in SQLite too).
macro_rules! on_pool {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            $crate::backend::Pool::Sqlite($p, _) => $body,
            $crate::backend::Pool::Postgres($p) => $body,
        }
    };
}
pub(crate) use on_pool;

/// `on_pool!` for a block that writes: on SQLite it runs on the one writer connection, so
/// writes queue in acpd instead of in SQLite's busy handler. The block must not wait for
/// another write outside its own connection (the writer is taken until it ends).
macro_rules! on_write {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            $crate::backend::Pool::Sqlite(_, $p) => $body,
            $crate::backend::Pool::Postgres($p) => $body,
        }
    };
}
pub(crate) use on_write;

/// The statement opening a write transaction. SQLite takes the write lock up front
/// (`IMMEDIATE`) so a transaction never has to upgrade a read lock, which fails with
/// `SQLITE_BUSY` without waiting for the busy timeout.
pub(crate) fn begin_write(pool: &Pool) -> &'static str {
    match pool {
        Pool::Sqlite(..) => "BEGIN IMMEDIATE",
        Pool::Postgres(_) => "BEGIN",
    }
}

/// Takes `PATH.lock` beside a SQLite file for this process alone (see
/// `StoreOptions::exclusive`); `None` for Postgres and in-memory databases. The lock file
/// names the holder's pid so the refusal can say who it is.
pub(crate) fn claim_sqlite(url: &str) -> Result<Option<std::fs::File>, StoreError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    if !url.starts_with("sqlite:") || url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(None);
    }
    let opts = SqliteConnectOptions::from_str(url)
        .map_err(|e| StoreError::InvalidUrl(format!("{url}: {e}")))?;
    let mut path = opts.get_filename().as_os_str().to_owned();
    path.push(".lock");
    let path = std::path::PathBuf::from(path);
    let io = |e: std::io::Error| StoreError::Unavailable(format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Private like every file of the data directory.
    let mut file = std::fs::OpenOptions::new()
        .mode(0o600)
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => String::new(),
                pid => format!(" (pid {pid})"),
            };
            return Err(StoreError::InUse(format!(
                "another acpd{holder} already serves the SQLite store {}; SQLite is \
                 single-replica: stop it, or put several replicas on Postgres",
                opts.get_filename().display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(Some(file))
}

/// An in-memory SQLite database: one connection, kept forever.
async fn connect_sqlite_memory(opts: SqliteConnectOptions) -> Result<SqlitePool, StoreError> {
    // An in-memory database lives as long as one of its connections: keep exactly
    // one, forever, for reads and writes. One connection also avoids shared-cache
    // table locks, which fail immediately instead of honouring the busy timeout.
    SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(opts)
        .await
        .map_err(db)
}

/// A SQLite file in WAL mode: a pool of readers and the one writer.
async fn connect_sqlite_file(
    opts: SqliteConnectOptions,
    max_connections: u32,
) -> Result<(SqlitePool, SqlitePool), StoreError> {
    if let Some(dir) = opts
        .get_filename()
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| StoreError::Unavailable(format!("creating {}: {e}", dir.display())))?;
    }
    // WAL lets readers run beside the journal writer. synchronous=NORMAL in WAL mode
    // fsyncs at checkpoints, not at every commit: a commit survives an acpd crash
    // but the last commits before a power loss or OS crash may be rolled back, so
    // the durable watermark means "survives the process", not "survives the machine".
    // That trade buys an order of magnitude in commit rate.
    let opts = opts
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    // Checkpoints run on a task of their own (`checkpoint.rs`), never inside a
    // commit that someone waits for.
    let opts = opts.pragma("wal_autocheckpoint", "0");
    // When the WAL starts over a file past `WAL_FILE_LIMIT` is truncated to it: a
    // burst leaves no WAL of its size on disk, and a steady stream rewrites blocks
    // the file has rather than extending it again after every restart.
    let opts = opts.pragma("journal_size_limit", WAL_FILE_LIMIT.to_string());
    // No ping before each acquire: a connection to a local file does not go stale
    // the way a server's does, and the ping is one more round trip to sqlx's SQLite
    // thread in front of every group commit.
    let file_pool = || {
        SqlitePoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(ACQUIRE_TIMEOUT)
    };
    let readers = file_pool()
        .max_connections(max_connections)
        .connect_with(opts.clone())
        .await
        .map_err(db)?;
    // The writer is kept for the daemon's life: its prepared statements (the
    // journal's inserts among them) stay cached.
    // The writer's page cache holds the journal index's leaf of every streaming session
    // (one page each): SQLite's default 2 MiB held ~500, and a group commit over 1 000
    // sessions read the rest back from the file at every commit. Pages are allocated as they
    // are used, so an idle daemon pays nothing for the bound.
    let wopts = opts
        .clone()
        .pragma("cache_size", WRITER_CACHE_KIB.to_string());
    let writer = file_pool()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(wopts)
        .await
        .map_err(db)?;
    Ok((readers, writer))
}

/// A Postgres pool; `idle_tx` as in `Pool::connect`.
async fn connect_postgres(
    url: &str,
    max_connections: u32,
    idle_tx: Option<Duration>,
) -> Result<Pool, StoreError> {
    let mut opts = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::InvalidUrl(format!("{}: {e}", redact(url))))?;
    if let Some(t) = idle_tx {
        let ms = t.as_millis().to_string();
        opts = opts.options([("idle_in_transaction_session_timeout", ms.as_str())]);
    }
    // test_before_acquire (the default) pings idle connections, so connections killed
    // by a server restart are replaced instead of failing the next query. (Pinging only
    // connections idle for a second saved a round trip per statement, but let every
    // query right after a restart fail once: the store tests that kill connections
    // mid-stream caught a read failing.)
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(true)
        .connect_with(opts)
        .await
        .map(Pool::Postgres)
        .map_err(db)
}

impl Pool {
    /// Connects to the store named by `url` without touching its schema.
    /// `idle_tx`: Postgres ends a session whose transaction sits idle longer (replicas).
    pub(crate) async fn connect(
        url: &str,
        max_connections: u32,
        idle_tx: Option<Duration>,
    ) -> Result<Pool, StoreError> {
        let max_connections = max_connections.max(1);
        if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::InvalidUrl(format!("{url}: {e}")))?;
            let in_memory = sqlite_in_memory(url);
            // foreign_keys: journal and agent_state rows must belong to a session.
            let opts = opts
                .create_if_missing(true)
                .foreign_keys(true)
                .busy_timeout(SQLITE_BUSY_TIMEOUT);
            let (readers, writer) = if in_memory {
                let pool = connect_sqlite_memory(opts).await?;
                (pool.clone(), pool)
            } else {
                connect_sqlite_file(opts, max_connections).await?
            };
            Ok(Pool::Sqlite(readers, writer))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            connect_postgres(url, max_connections, idle_tx).await
        } else {
            Err(StoreError::InvalidUrl(format!(
                "{}: expected sqlite://PATH, sqlite::memory: or postgres://...",
                redact(url)
            )))
        }
    }

    /// The options of a SQLite file's pool (WAL, checkpointed by `checkpoint.rs`); `None`
    /// for Postgres and in-memory SQLite.
    pub(crate) fn sqlite_file(&self, url: &str) -> Option<std::sync::Arc<SqliteConnectOptions>> {
        match self {
            Pool::Sqlite(p, _) if !sqlite_in_memory(url) => Some(p.connect_options()),
            _ => None,
        }
    }

    pub(crate) fn kind(&self) -> StoreKind {
        match self {
            Pool::Sqlite(..) => StoreKind::Sqlite,
            Pool::Postgres(_) => StoreKind::Postgres,
        }
    }

    /// Refuses a schema newer than this build knows, applies pending migrations, checks the
    /// journal format, and returns the schema version now in place.
    pub(crate) async fn migrate(&self) -> Result<i64, StoreError> {
        let migrator = match self {
            Pool::Sqlite(..) => &SQLITE_MIGRATOR,
            Pool::Postgres(_) => &POSTGRES_MIGRATOR,
        };
        let known = migrator
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .map(|m| m.version)
            .max()
            .unwrap_or(0);
        // Checked before sqlx runs: its own check would report a bare "missing migration".
        if let Some(found) = self.applied_version().await?
            && found > known
        {
            return Err(StoreError::SchemaTooNew { found, known });
        }
        match self {
            Pool::Sqlite(_, w) => migrator.run(w).await?,
            Pool::Postgres(p) => migrator.run(p).await?,
        }
        let format: Option<String> = on_pool!(self, |p| sqlx::query_scalar(
            "SELECT value FROM meta WHERE key = 'journal_format'"
        )
        .fetch_optional(p)
        .await
        .map_err(db)?);
        let format = format.and_then(|f| f.parse::<i64>().ok()).unwrap_or(0);
        if format > JOURNAL_FORMAT {
            return Err(StoreError::SchemaTooNew {
                found: format,
                known: JOURNAL_FORMAT,
            });
        }
        Ok(self.applied_version().await?.unwrap_or(0))
    }

    /// Highest migration version recorded in the database, `None` before the first migration.
    async fn applied_version(&self) -> Result<Option<i64>, StoreError> {
        let exists: bool = match self {
            Pool::Sqlite(p, _) => sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master \
                 WHERE type = 'table' AND name = '_sqlx_migrations')",
            )
            .fetch_one(p)
            .await
            .map_err(db)?,
            Pool::Postgres(p) => {
                sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
                    .fetch_one(p)
                    .await
                    .map_err(db)?
            }
        };
        if !exists {
            return Ok(None);
        }
        on_pool!(self, |p| sqlx::query_scalar(
            "SELECT MAX(version) FROM _sqlx_migrations"
        )
        .fetch_one(p)
        .await
        .map_err(db))
    }

    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(r, w) => {
                r.close().await;
                w.close().await;
            }
            Pool::Postgres(p) => p.close().await,
        }
    }
}

/// Drops the password from a URL before it goes into an error message.
fn sqlite_in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let host_start = rest.find('/').unwrap_or(rest.len());
    match rest[..host_start].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// How a failed statement should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The database could not be reached or was busy: the same statement may succeed later.
    Transient,
    /// The data itself was rejected (constraint, bad value): retrying the same rows is useless.
    Data,
    /// Anything else (a bug, a broken schema).
    Other,
}

pub(crate) fn classify(e: &sqlx::Error) -> Failure {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Failure::Transient,
        sqlx::Error::Encode(_) => Failure::Data,
        sqlx::Error::Database(d) => {
            let code = d.code().unwrap_or_default();
            if d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                // SQLSTATE classes: 08 connection, 40 rollback (serialization, deadlock),
                // 53 resources, 57 operator intervention (e.g. pg_terminate_backend, shutdown),
                // 58 system I/O; 22 data exception, 23 integrity violation.
                match code.get(..2) {
                    Some("08" | "40" | "53" | "57" | "58") => Failure::Transient,
                    Some("22" | "23") => Failure::Data,
                    _ => Failure::Other,
                }
            } else {
                // SQLite: an extended result code; the low byte is the primary code.
                match code.parse::<i64>().map(|n| n & 0xff) {
                    // BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN, PROTOCOL
                    Ok(5 | 6 | 7 | 10 | 13 | 14 | 15) => Failure::Transient,
                    // TOOBIG, CONSTRAINT, MISMATCH, RANGE
                    Ok(18 | 19 | 20 | 25) => Failure::Data,
                    _ => Failure::Other,
                }
            }
        }
        _ => Failure::Other,
    }
}

/// Maps a driver error to the store boundary: connectivity problems become `Unavailable`.
pub(crate) fn db(e: sqlx::Error) -> StoreError {
    if classify(&e) == Failure::Transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Database(e)
    }
}

/// True when `e` says the connection itself is gone (a Postgres server restart, a terminated
/// backend): the statement never ran there, or its answer was lost with the connection.
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(d) => {
            d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
                && d.code()
                    .is_some_and(|c| c.starts_with("08") || c.starts_with("57P"))
        }
        _ => false,
    }
}

/// Tries of a statement whose connection was lost (a server restart between the ping and the
/// statement): each lost try drops
/// its connection, and the pool's other idle ones may be as dead.
const LOST_TRIES: usize = 4;

/// Runs `op` again (a few times) while it fails for a lost connection; for statements that
/// may run twice (reads, a patch, an insert that tells its own row apart). Returns the last
/// result and whether an earlier try was lost (it may have committed).
pub(crate) async fn again_if_lost<T, F, Fut>(mut op: F) -> (Result<T, sqlx::Error>, bool)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut lost = false;
    for _ in 1..LOST_TRIES {
        match op().await {
            Err(e) if connection_lost(&e) => {
                tracing::debug!(error = %e, "statement lost its connection; trying again");
                lost = true;
            }
            r => return (r, lost),
        }
    }
    (op().await, lost)
}

/// True when `e` is a unique or foreign-key violation, which the caller reports as a conflict.
pub(crate) fn is_constraint(e: &sqlx::Error) -> bool {
    matches!(
        e.as_database_error().map(|d| d.kind()),
        Some(sqlx::error::ErrorKind::UniqueViolation | sqlx::error::ErrorKind::ForeignKeyViolation)
    )
}

/// Current time as Unix epoch milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A unique or foreign-key violation becomes `Conflict(what)`; anything else maps as usual.
pub(crate) fn conflict_or_db(
    what: impl FnOnce() -> String,
) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| {
        if is_constraint(&e) {
            StoreError::Conflict(what())
        } else {
            db(e)
        }
    }
}

/// How the journal writer retries a write while the database is away: from 50 ms, doubling,
/// capped at 2 s, for ever (nothing queued is dropped; `append` pushes back meanwhile).
pub(crate) fn write_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_password_only() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact("nonsense"), "nonsense");
    }
}

//! SQLite WAL checkpoints on a connection and a task of their own.
//!
//! SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1000 pages,
//! and with `synchronous=NORMAL` that is where the WAL and the database file are fsynced: a
//! few milliseconds (here 3–5 ms every ~100 `session/new`s) on whichever commit it falls,
//! a `session/new`'s row insert or a journal group commit, with a client waiting on it. The
//! pool's connections have it off (`wal_autocheckpoint=0`, `backend.rs`) and this task runs a
//! PASSIVE checkpoint every `EVERY`: it copies what it can without waiting on any reader or
//! writer, so nobody waits on its fsyncs. Durability is the same either way: a commit is
//! durable (against a crash of acpd) once it is in the WAL, and an open replays the WAL.
//! The last connection to close checkpoints once more (SQLite's own close).
//!
//! A PASSIVE checkpoint alone never lets the WAL start over under a steady stream of
//! commits: SQLite rewinds the WAL only when a write transaction begins with every frame
//! copied back, and a checkpoint that runs beside the writer always ends a few commits short.
//! The WAL then grows for the daemon's whole life (measured: 173 MB after 6 000
//! `session/new`s, 143 MB after 600 000 updates), and every commit extends the file, which
//! on ext4 waits on the journal behind the checkpoint's fsync (the p99 of `session/new`).
//! So a PASSIVE checkpoint that leaves `WAL_RESTART_FRAMES` (`backend.rs`) in the WAL is
//! followed at once by a RESTART: it holds new writers for the few frames left and waits
//! (`RESTART_WAIT` at most, then it gives up like a PASSIVE one) for readers to leave the
//! WAL, so the next commit rewinds it; `journal_size_limit` (`backend.rs`) truncates a file
//! left past `WAL_FILE_LIMIT`.
//!
//! So the WAL stays bounded while the daemon runs, whatever the write rate (tests/it
//! `durability::the_sqlite_wal_stays_bounded_while_the_daemon_journals`).

use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio::sync::watch;

use super::StoreError;
use super::backend::{WAL_RESTART_FRAMES, db};

/// How often the WAL is checkpointed. A PASSIVE checkpoint with nothing to copy costs a few
/// µs; what a busy daemon writes in this time is what the next one copies.
const EVERY: Duration = Duration::from_millis(250);

/// How long a RESTART checkpoint may hold new writers while it waits for the writer in
/// progress and for readers still in the WAL (the busy timeout of its connection).
const RESTART_WAIT: Duration = Duration::from_millis(20);

/// The checkpointing task; `stop` ends it and closes its connection.
pub(crate) struct Checkpoints {
    stop: watch::Sender<bool>,
    /// Resolves (with an error) once the task is gone: it only drops its sender.
    finished: watch::Receiver<()>,
}

impl Checkpoints {
    /// Opens a connection of its own with the pool's options (not a pool connection: the
    /// task never waits for one, and never holds one up) and starts the task.
    pub(crate) async fn start(opts: &SqliteConnectOptions) -> Result<Checkpoints, StoreError> {
        let opts = opts.clone().busy_timeout(RESTART_WAIT);
        let mut conn = SqliteConnection::connect_with(&opts).await.map_err(db)?;
        let (stop, mut stopped) = watch::channel(false);
        let (finished_tx, finished) = watch::channel(());
        tokio::spawn(async move {
            let _finished = finished_tx;
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    // A stop, or the store gone without one.
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {
                        let frames = match checkpoint(&mut conn, PASSIVE).await {
                            Ok(frames) => frames,
                            Err(e) => {
                                tracing::warn!(error = %e, "WAL checkpoint failed; the next one retries");
                                continue;
                            }
                        };
                        if frames >= WAL_RESTART_FRAMES
                            && let Err(e) = checkpoint(&mut conn, RESTART).await
                        {
                            tracing::warn!(error = %e, "WAL restart failed; the next one retries");
                        }
                    }
                }
            }
            let _ = conn.close().await;
        });
        Ok(Checkpoints { stop, finished })
    }

    /// Ends the task and waits until its connection is closed.
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut finished = self.finished.clone();
        let _ = finished.changed().await;
    }
}

const PASSIVE: &str = "PRAGMA wal_checkpoint(PASSIVE)";
const RESTART: &str = "PRAGMA wal_checkpoint(RESTART)";

/// Runs one checkpoint; returns the frames the WAL holds. (SQLite answers (busy, WAL frames,
/// frames copied); busy only means a reader or writer kept some frames for the next one.)
async fn checkpoint(conn: &mut SqliteConnection, sql: &'static str) -> Result<i64, sqlx::Error> {
    let (_busy, frames, _copied) = sqlx::query_as::<_, (i64, i64, i64)>(sql)
        .fetch_one(conn)
        .await?;
    Ok(frames)
}

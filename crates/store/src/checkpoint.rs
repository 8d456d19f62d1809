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

use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio::sync::watch;

use super::StoreError;
use super::backend::db;

/// How often the WAL is checkpointed. A PASSIVE checkpoint with nothing to copy costs a few
/// µs; what a busy daemon writes in this time is what the next one copies.
const EVERY: Duration = Duration::from_millis(250);

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
        let mut conn = SqliteConnection::connect_with(opts).await.map_err(db)?;
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
                        // (busy, WAL frames, frames checkpointed); busy only means a reader
                        // or writer kept some frames for the next one.
                        let done = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)")
                            .fetch_one(&mut conn)
                            .await;
                        if let Err(e) = done {
                            tracing::warn!(error = %e, "WAL checkpoint failed; the next one retries");
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

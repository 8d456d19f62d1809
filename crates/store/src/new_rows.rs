//! New session rows queued to the journal writer instead of inserted on `session/new`'s path,
//! and the gate that keeps a queued row from looking missing: every store call about a
//! session whose row is still queued waits for that row first (read-your-writes).
//!
//! Why: the insert was `session/new`'s one store round trip, and on SQLite its p99 was the WAL
//! checkpoint's fsync (issue 45). Queued, the row is committed by the writer before any entry
//! of its session (they can only be queued after it), so nothing acknowledged as durable about
//! the session (an update sent, a prompt answered) is durable without the row. After a crash
//! between the answer and the commit the id is simply unknown, never half there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use backon::Retryable;
use tokio::sync::watch;

use super::backend::{Pool, write_backoff};
use super::{DurableSeq, SessionRow, Store, StoreError, Watermark, sessions};

/// The watermark of a session whose row is queued, not committed: `durable` is raised to 0
/// when the row commits, and `rejected: Some(0)` says the database refused it.
pub const ROW_QUEUED: i64 = -1;

/// The rows queued and not yet committed, by session id. A std mutex: held for a map lookup,
/// insert or remove, never across an `.await`; shared by the writer and every store call.
#[derive(Default)]
pub(crate) struct NewRows(Mutex<HashMap<Arc<str>, watch::Receiver<Watermark>>>);

impl NewRows {
    pub(crate) fn queued(&self, id: Arc<str>, rx: watch::Receiver<Watermark>) {
        self.lock().insert(id, rx);
    }

    /// The writer is done with the row (committed or refused, its watch says which).
    pub(crate) fn done(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Waits until `id`'s row, if it is queued, is committed or refused.
    pub(crate) async fn settled(&self, id: &str) {
        let rx = self.lock().get(id).cloned();
        if let Some(rx) = rx {
            wait(rx).await;
        }
    }

    /// Waits until every row queued now is committed or refused (a listing sees them all).
    pub(crate) async fn all_settled(&self) {
        let rxs: Vec<_> = self.lock().values().cloned().collect();
        for rx in rxs {
            wait(rx).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, watch::Receiver<Watermark>>> {
        // A panic while held cannot leave the map half changed (each use is one call).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn wait(mut rx: watch::Receiver<Watermark>) {
    // An error: the writer is gone with the watch's sender; nothing will change any more.
    let _ = rx
        .wait_for(|w| w.durable > ROW_QUEUED || w.rejected.is_some())
        .await;
}

impl Store {
    /// Waits for `id`'s row if it is queued (see the module doc).
    pub(crate) async fn row_settled(&self, id: &str) {
        self.inner.new_rows.settled(id).await
    }
}

/// Most rows one statement inserts, and most rows a batch of rows alone waits for (`writer`).
pub(crate) const ROWS_MAX: usize = 16;

/// The writer's commit of a batch's rows: `ROWS_MAX` at a time in one statement (a row's
/// commit costs SQLite about as much as sixteen's: the pages it writes), and one by one
/// when that fails, so each row gets its own verdict and retries.
pub(crate) async fn commit_all(
    pool: &Pool,
    rows: &NewRows,
    batch: &[(Box<SessionRow>, Arc<DurableSeq>)],
) {
    for chunk in batch.chunks(ROWS_MAX) {
        let mut maybe_in = false;
        if let [_, _, ..] = chunk {
            let all: Vec<&SessionRow> = chunk.iter().map(|(row, _)| &**row).collect();
            match sessions::insert_sessions(pool, &all).await {
                Ok(()) => {
                    for (row, durable) in chunk {
                        raise(durable);
                        rows.done(&row.id);
                    }
                    continue;
                }
                // Not the database's verdict (the connection went): the statement may have
                // committed, so a row found there afterwards is ours.
                Err(e) => maybe_in = e.as_database_error().is_none(),
            }
        }
        for (row, durable) in chunk {
            commit(pool, rows, row, durable, maybe_in).await;
        }
    }
}

/// The commit of one queued row: retried while the database is away (as the writer's
/// batches are), refused for good otherwise. Raises or stops `durable`, then lets the store
/// calls waiting for the row go. `maybe_in`: an earlier try may have committed it.
async fn commit(
    pool: &Pool,
    rows: &NewRows,
    row: &SessionRow,
    durable: &DurableSeq,
    maybe_in: bool,
) {
    let mut retried = maybe_in;
    let result = (|| sessions::insert_session(pool, row))
        .retry(write_backoff())
        .sleep(tokio::time::sleep)
        .when(|e| matches!(e, StoreError::Unavailable(_)))
        .notify(|e, wait| {
            retried = true;
            tracing::warn!(error = %e, session_id = %row.id, retry_in_ms = wait.as_millis() as u64,
                "cannot insert a new session's row; retrying");
        })
        .await;
    match result {
        Ok(()) => raise(durable),
        // A try that failed as unreachable may have committed: the id is fresh, so a row
        // already there after a retry is this one.
        Err(StoreError::Conflict(_)) if retried => raise(durable),
        Err(e) => {
            metrics::counter!(crate::metrics::STORE_ERRORS_TOTAL).increment(1);
            tracing::error!(error = %e, session_id = %row.id,
                "the database refused a new session's row; the session ends unknown");
            durable.send_modify(|w| w.rejected = w.rejected.or(Some(0)));
        }
    }
    rows.done(&row.id);
}

fn raise(durable: &DurableSeq) {
    durable.send_if_modified(|w| {
        let raise = w.durable < 0 && w.rejected.is_none();
        if raise {
            w.durable = 0;
        }
        raise
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queued_row_holds_its_waiters_until_the_writer_is_done() {
        let rows = Arc::new(NewRows::default());
        let (durable, rx) = super::super::watermark(ROW_QUEUED);
        rows.queued(Arc::from("s1"), rx);
        // Another id's call does not wait.
        rows.settled("s2").await;
        let waiter = tokio::spawn({
            let rows = rows.clone();
            async move { rows.settled("s1").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        raise(&durable);
        rows.done("s1");
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiter goes once the row commits")
            .unwrap();
        assert_eq!(durable.borrow().durable, 0);
        rows.all_settled().await;
    }

    #[test]
    fn a_refused_row_is_never_raised() {
        let (durable, _rx) = super::super::watermark(ROW_QUEUED);
        durable.send_modify(|w| w.rejected = Some(0));
        raise(&durable);
        assert_eq!(durable.borrow().durable, ROW_QUEUED);
    }
}

//! The group-commit journal writer: one task that owns the batch and commits appends together.
//!
//! Appends arrive over a bounded channel. The writer takes one, adds whatever else is already
//! queued (up to `journal_batch_max`), commits them in one transaction and only then advances
//! each touched session's durable watermark. It never waits for companions: a lone append
//! commits at once (a prompt's first update is not held back), and appends that arrive while a
//! commit runs queue up and form the next batch, so batches grow with the load by themselves.
//! A failed commit keeps the batch and retries with capped backoff: nothing is dropped because
//! the database went away, and the bounded channel pushes back on `append` meanwhile.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::backend::{Failure, Pool, begin_write, classify, on_pool};
use super::journal::{Ins, JournalSql};
use super::{DurableSeq, NewEntry, StoreOptions};

const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(crate) enum Msg {
    Append(NewEntry, Arc<DurableSeq>),
    /// Stop accepting appends and commit everything already queued.
    Close,
}

/// Resolves `changed()` with an error once the writer task has ended (its sender is dropped
/// then, also if it panicked): every append it ever accepted is committed or reported.
pub(crate) type Finished = watch::Receiver<()>;

/// Starts the writer; it runs until a `Close` or until every sender is gone, and in both cases
/// commits what was queued before it stops.
pub(crate) fn spawn(pool: Pool, opts: &StoreOptions) -> (mpsc::Sender<Msg>, Finished) {
    let (tx, rx) = mpsc::channel(opts.journal_queue.max(1));
    let (finished_tx, finished) = watch::channel(());
    let writer = Writer {
        pool,
        rx,
        batch_max: opts.journal_batch_max.max(1),
        open: true,
        _finished: finished_tx,
    };
    tokio::spawn(writer.run());
    (tx, finished)
}

struct Writer {
    pool: Pool,
    rx: mpsc::Receiver<Msg>,
    batch_max: usize,
    /// False once the channel is closed and drained.
    open: bool,
    /// Dropped with the writer; see `Finished`.
    _finished: watch::Sender<()>,
}

type Batch = Vec<(NewEntry, Arc<DurableSeq>)>;

impl Writer {
    async fn run(mut self) {
        let mut batch: Batch = Vec::with_capacity(self.batch_max);
        while self.open {
            match self.rx.recv().await {
                Some(msg) => self.accept(msg, &mut batch),
                None => self.open = false,
            }
            if !batch.is_empty() {
                self.fill(&mut batch);
                let dropped = self.commit(&batch).await;
                advance(&batch, &dropped);
                batch.clear();
            }
        }
    }

    fn accept(&mut self, msg: Msg, batch: &mut Batch) {
        match msg {
            Msg::Append(entry, durable) => batch.push((entry, durable)),
            // Refuse new appends; those already queued are still received and committed.
            Msg::Close => self.rx.close(),
        }
    }

    /// Adds the appends already queued to `batch`, until it is full or the queue is empty.
    fn fill(&mut self, batch: &mut Batch) {
        while self.open && batch.len() < self.batch_max {
            match self.rx.try_recv() {
                Ok(msg) => self.accept(msg, batch),
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => self.open = false,
            }
        }
    }

    /// Commits the batch, retrying until it is in; returns the indexes of entries the database
    /// rejected as data (e.g. a session that never existed), which are logged and skipped.
    async fn commit(&self, batch: &Batch) -> Vec<usize> {
        match self.commit_with_retry(batch).await {
            Ok(()) => Vec::new(),
            Err(e) => {
                // Some row poisons the whole transaction: find it by committing one by one, so
                // the good rows still go in.
                tracing::warn!(
                    error = %e,
                    entries = batch.len(),
                    "journal batch rejected; committing entries one by one"
                );
                let mut dropped = Vec::new();
                for (i, item) in batch.iter().enumerate() {
                    if let Err(e) = self.commit_with_retry(std::slice::from_ref(item)).await {
                        tracing::error!(
                            error = %e,
                            session_id = %item.0.session_id,
                            seq = item.0.seq,
                            "journal entry rejected by the database; it is not stored"
                        );
                        dropped.push(i);
                    }
                }
                dropped
            }
        }
    }

    /// Retries transient failures forever with capped backoff; returns a data error.
    async fn commit_with_retry(
        &self,
        items: &[(NewEntry, Arc<DurableSeq>)],
    ) -> Result<(), sqlx::Error> {
        let mut backoff = BACKOFF_START;
        let mut attempt = 1u32;
        loop {
            let started = std::time::Instant::now();
            match write(&self.pool, items).await {
                Ok(()) => {
                    metrics::histogram!(crate::metrics::JOURNAL_APPEND_SECONDS)
                        .record(started.elapsed().as_secs_f64());
                    metrics::histogram!(crate::metrics::JOURNAL_BATCH_SIZE)
                        .record(items.len() as f64);
                    metrics::counter!(crate::metrics::JOURNAL_ENTRIES_TOTAL)
                        .increment(items.len() as u64);
                    if attempt > 1 {
                        tracing::info!(
                            attempt,
                            entries = items.len(),
                            "journal batch committed after retrying"
                        );
                    }
                    return Ok(());
                }
                Err(e) if classify(&e) == Failure::Data => return Err(e),
                Err(e) => {
                    metrics::counter!(crate::metrics::STORE_ERRORS_TOTAL).increment(1);
                    tracing::warn!(
                        error = %e,
                        attempt,
                        entries = items.len(),
                        retry_in_ms = backoff.as_millis() as u64,
                        "journal commit failed; keeping the batch and retrying"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }
}

/// One transaction: raise the touched sessions' `last_seq`, then insert every entry.
async fn write(pool: &Pool, items: &[(NewEntry, Arc<DurableSeq>)]) -> Result<(), sqlx::Error> {
    let mut marks: BTreeMap<&str, i64> = BTreeMap::new();
    for (e, _) in items {
        let m = marks.entry(&*e.session_id).or_insert(e.seq);
        *m = (*m).max(e.seq);
    }
    let marks: Vec<(&str, i64)> = marks.into_iter().collect();
    let rows: Vec<Ins<'_>> = items
        .iter()
        .map(|(e, _)| Ins {
            session_id: &e.session_id,
            seq: e.seq,
            kind: &e.kind,
            body: &e.body,
            at_ms: e.at_ms,
        })
        .collect();
    on_pool!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await?;
        tx.raise_last_seq(&marks).await?;
        tx.insert_entries(&rows).await?;
        tx.commit().await
    })
}

/// Raises each session's watermark to the highest seq committed for it in this batch, using
/// the newest watch the session layer handed in.
fn advance(batch: &Batch, dropped: &[usize]) {
    let mut marks: BTreeMap<&str, (i64, &Arc<DurableSeq>)> = BTreeMap::new();
    for (i, (e, durable)) in batch.iter().enumerate() {
        if dropped.contains(&i) {
            continue;
        }
        let m = marks.entry(&*e.session_id).or_insert((e.seq, durable));
        m.0 = m.0.max(e.seq);
        m.1 = durable;
    }
    for (seq, durable) in marks.into_values() {
        durable.send_if_modified(|v| {
            if *v < seq {
                *v = seq;
                true
            } else {
                false
            }
        });
    }
}

//! The group-commit journal writer: one task that owns the batch and commits appends together.
//!
//! Appends arrive over a bounded channel. The writer takes one, adds whatever else is already
//! queued (up to `journal_batch_max`), commits them in one transaction and only then advances
//! each touched session's durable watermark. It never waits for companions: a lone append
//! commits at once (a prompt's first update is not held back), and appends that arrive while a
//! commit runs queue up and form the next batch, so batches grow with the load by themselves.
//! A failed commit keeps the batch and retries with capped backoff (`backon`): nothing is
//! dropped because the database went away, and the bounded channel pushes back on `append`
//! meanwhile. An entry the database refuses as data is never skipped silently: it stops its
//! session's watermark (`Watermark::rejected`), which the session reports as an error.
//! So does an entry whose lease epoch is stale (`NewEntry::epoch`, several replicas): the
//! check runs in the insert's own transaction, under the session row's lock (fencing).
//! New sessions' rows (`Msg::Create`, `new_rows.rs`) ride the same queue and commit first in
//! their batch, so no entry of a session is durable before its row.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use backon::Retryable;
use tokio::sync::{mpsc, watch};

use super::backend::{Failure, Pool, begin_write, classify, on_write, write_backoff};
use super::form::BodyForm;
use super::journal::{JournalSql, Mark};
use super::new_rows::{self, NewRows, ROW_QUEUED};
use super::pack::Ins;
use super::{DurableSeq, JournalWatch, NewEntry, SessionRow, StoreError, StoreOptions};
use super::{journal_pg, journal_sqlite};

/// How long new rows with nothing else to commit wait for company (`Writer::linger`): the
/// crash window in which an answered `session/new` may end unknown, and how long a store
/// call about such a session may wait for its row.
const ROW_LINGER: Duration = Duration::from_millis(2);

pub(crate) enum Msg {
    Append(NewEntry, Arc<DurableSeq>),
    /// A new session's row, queued before anything else of its session (`new_rows.rs`).
    Create(Box<SessionRow>, Arc<DurableSeq>),
    /// Stop accepting appends and commit everything already queued.
    Close,
}

/// Room for one append in the writer's queue (`Store::append_room`).
pub struct AppendRoom(pub(crate) mpsc::OwnedPermit<Msg>);

impl AppendRoom {
    /// Queues the append in the room held (as `Store::append` would).
    pub fn append(self, entry: NewEntry, durable: Arc<DurableSeq>) {
        self.0.send(Msg::Append(entry, durable));
    }
}

/// Why `Store::try_append` did not queue an append.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error("the store's write queue is full (the database is away or far behind)")]
    Full,
    #[error("the store is closed")]
    Closed,
}

/// Resolves `changed()` with an error once the writer task has ended (its sender is dropped
/// then, also if it panicked): every append it ever accepted is committed or reported.
pub(crate) type Finished = watch::Receiver<()>;

/// Starts the writer; it runs until a `Close` or until every sender is gone, and in both cases
/// commits what was queued before it stops.
pub(crate) fn spawn(
    pool: Pool,
    opts: &StoreOptions,
    new_rows: Arc<NewRows>,
) -> (mpsc::Sender<Msg>, Finished, Arc<Stall>) {
    let (tx, rx) = mpsc::channel(opts.journal_queue.max(1));
    let (finished_tx, finished) = watch::channel(());
    let failing = Arc::new(Stall::default());
    let writer = Writer {
        failing: failing.clone(),
        pool,
        new_rows,
        rx,
        batch_max: opts.journal_batch_max.max(1),
        form: opts.body_form.clone(),
        open: true,
        _finished: finished_tx,
    };
    tokio::spawn(writer.run());
    (tx, finished, failing)
}

/// Whether the writer is stuck: retrying a failed commit, or in one commit for longer than
/// `STALLED_AFTER` (a lock, a database that stopped answering).
pub(crate) struct Stall {
    base: std::time::Instant,
    retrying: AtomicBool,
    /// Milliseconds after `base` (plus one) when the running commit started; 0: none runs.
    since: AtomicU64,
}

/// How long one commit may run before the writer counts as stalled.
const STALLED_AFTER: Duration = Duration::from_secs(1);

impl Default for Stall {
    fn default() -> Stall {
        Stall {
            base: std::time::Instant::now(),
            retrying: AtomicBool::new(false),
            since: AtomicU64::new(0),
        }
    }
}

impl Stall {
    fn started(&self) {
        let ms = self.base.elapsed().as_millis() as u64 + 1;
        self.since.store(ms, Ordering::Relaxed);
    }

    fn ended(&self) {
        self.since.store(0, Ordering::Relaxed);
    }

    pub(crate) fn stalled(&self) -> bool {
        if self.retrying.load(Ordering::Relaxed) {
            return true;
        }
        let since = self.since.load(Ordering::Relaxed);
        since != 0
            && self.base.elapsed().as_millis() as u64 + 1 - since
                >= STALLED_AFTER.as_millis() as u64
    }
}

struct Writer {
    pool: Pool,
    /// The rows queued and not yet committed; the writer settles them.
    new_rows: Arc<NewRows>,
    rx: mpsc::Receiver<Msg>,
    batch_max: usize,
    /// How bodies are stored (`StoreOptions::body_form`).
    form: Arc<dyn BodyForm>,
    /// False once the channel is closed and drained.
    open: bool,
    /// Dropped with the writer; see `Finished`.
    _finished: watch::Sender<()>,
    /// Whether commits are stuck (`Store::writes_stalled`).
    failing: Arc<Stall>,
}

type Item = (NewEntry, Arc<DurableSeq>);

/// Why a commit failed.
#[derive(Debug, thiserror::Error)]
enum CommitError {
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    /// An entry of the batch carried a lease epoch that is not the session's any more.
    #[error("session {session}: lease epoch {epoch} is stale (another replica owns the session)")]
    Fenced { session: String, epoch: i64 },
}

impl CommitError {
    fn transient(&self) -> bool {
        matches!(self, CommitError::Sql(e) if classify(e) == Failure::Transient)
    }
}
/// What one pass commits: new sessions' rows first, then the entries (of those sessions too).
#[derive(Default)]
struct Batch {
    rows: Vec<(Box<SessionRow>, Arc<DurableSeq>)>,
    items: Vec<Item>,
}

impl Batch {
    fn len(&self) -> usize {
        self.rows.len() + self.items.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.items.clear();
    }
}

impl Writer {
    async fn run(mut self) {
        let mut batch = Batch {
            rows: Vec::new(),
            items: Vec::with_capacity(self.batch_max),
        };
        while self.open {
            match self.rx.recv().await {
                Some(msg) => self.accept(msg, &mut batch),
                None => self.open = false,
            }
            if !batch.is_empty() {
                self.fill(&mut batch);
                self.linger(&mut batch).await;
                self.commit(&batch).await;
                batch.clear();
            }
        }
    }

    fn accept(&mut self, msg: Msg, batch: &mut Batch) {
        match msg {
            Msg::Append(entry, durable) => batch.items.push((entry, durable)),
            Msg::Create(row, durable) => batch.rows.push((row, durable)),
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

    /// Holds a batch of new rows alone (no entries) up to `ROW_LINGER` for more, so sessions
    /// created one after another share a commit. Nothing waits for it: `session/new` answered
    /// already, and an entry (of any session) ends it at once, as does a full batch.
    async fn linger(&mut self, batch: &mut Batch) {
        let deadline = tokio::time::Instant::now() + ROW_LINGER;
        while self.open && batch.items.is_empty() && batch.rows.len() < new_rows::ROWS_MAX {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(msg)) => {
                    self.accept(msg, batch);
                    self.fill(batch);
                }
                Ok(None) => self.open = false,
                Err(_) => return,
            }
        }
    }

    /// Commits the batch and advances the watermarks. Appends through a stopped watch are
    /// dropped unwritten. If the batch as a whole is rejected, some row poisons the
    /// transaction: the entries are committed one by one, so the good ones still go in and
    /// the bad one stops its session's watermark (and that session's later entries).
    async fn commit(&self, batch: &Batch) {
        // Rows first: an entry of a session created in this batch needs its row.
        new_rows::commit_all(&self.pool, &self.new_rows, &batch.rows).await;
        let live: Vec<&Item> = batch.items.iter().filter(|(_, d)| !stopped(d)).collect();
        if live.is_empty() {
            return;
        }
        let Err(e) = self.commit_with_retry(&live).await else {
            advance(&live);
            return;
        };
        tracing::warn!(
            error = %e,
            entries = live.len(),
            "journal batch rejected; committing entries one by one"
        );
        for item in live {
            // An earlier entry of this batch may have stopped the same watch.
            if stopped(&item.1) {
                continue;
            }
            match self.commit_with_retry(&[item]).await {
                Ok(()) => advance(&[item]),
                Err(e) => reject(item, &e),
            }
        }
    }

    /// Retries transient failures (the database went away, was busy) forever with capped
    /// backoff; returns any other error at once: one about the data itself, or one no retry is
    /// known to fix (which then rejects the entries rather than wedging every session).
    async fn commit_with_retry(&self, items: &[&Item]) -> Result<(), CommitError> {
        let mut retried = false;
        let backoff = write_backoff();
        let attempt = || async {
            let started = std::time::Instant::now();
            write(&self.pool, &*self.form, items)
                .await
                .map(|()| started.elapsed())
        };
        self.failing.started();
        let result = attempt
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(CommitError::transient)
            .notify(|e, wait| {
                retried = true;
                self.failing.retrying.store(true, Ordering::Relaxed);
                metrics::counter!(crate::metrics::STORE_ERRORS_TOTAL).increment(1);
                tracing::warn!(
                    error = %e,
                    entries = items.len(),
                    retry_in_ms = wait.as_millis() as u64,
                    "journal commit failed; keeping the batch and retrying"
                );
            })
            .await;
        self.failing.ended();
        if let Ok(took) = result {
            self.failing.retrying.store(false, Ordering::Relaxed);
            metrics::histogram!(crate::metrics::JOURNAL_APPEND_SECONDS).record(took.as_secs_f64());
            metrics::histogram!(crate::metrics::JOURNAL_BATCH_SIZE).record(items.len() as f64);
            metrics::counter!(crate::metrics::JOURNAL_ENTRIES_TOTAL).increment(items.len() as u64);
            if retried {
                tracing::info!(
                    entries = items.len(),
                    "journal batch committed after retrying"
                );
            }
        }
        result.map(drop)
    }
}

/// One transaction: raise the touched sessions' `last_seq` and `updated_at_ms` (which
/// row-locks them), check the lease epochs the entries carry, then insert every entry. On
/// Postgres a batch without epochs is one statement instead (`journal_pg`).
async fn write(pool: &Pool, form: &dyn BodyForm, items: &[&Item]) -> Result<(), CommitError> {
    let fences: BTreeSet<(&str, i64)> = items
        .iter()
        .filter_map(|(e, _)| e.epoch.map(|epoch| (&*e.session_id, epoch)))
        .collect();
    let fences: Vec<(&str, i64)> = fences.into_iter().collect();
    let mut marks: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (e, _) in items.iter().copied() {
        let m = marks.entry(&*e.session_id).or_insert((e.seq, e.at_ms));
        *m = (m.0.max(e.seq), m.1.max(e.at_ms));
    }
    let marks: Vec<Mark<'_>> = marks
        .into_iter()
        .map(|(id, (seq, at_ms))| (id, seq, at_ms))
        .collect();
    let rows: Vec<Ins<'_>> = items
        .iter()
        .map(|(e, _)| Ins::new(form, &e.session_id, e.seq, &e.kind, &e.body, e.at_ms))
        .collect();
    // Postgres without fencing: the whole commit is one statement, one round trip. A
    // position already taken (a retry, a second writer) comes through the transaction below.
    if let (Pool::Postgres(p), true) = (pool, fences.is_empty()) {
        let mut conn = p.acquire().await?;
        if journal_pg::commit(&mut conn, &marks, &rows).await? {
            return Ok(());
        }
    }
    // SQLite, one session's batch (an LLM's pace): one round trip to sqlx's SQLite thread.
    if let (Pool::Sqlite(_, p), true) = (pool, fences.is_empty()) {
        let mut conn = p.acquire().await?;
        if journal_sqlite::commit(&mut conn, &marks, &rows).await? {
            return Ok(());
        }
    }
    on_write!(pool, |p| {
        let mut tx = p.begin_with(begin_write(pool)).await?;
        tx.raise_last_seq(&marks).await?;
        // Dropping the transaction rolls it back: nothing of a fenced batch goes in.
        if let Some((session, epoch)) = tx.stale_epoch(&fences).await? {
            return Err(CommitError::Fenced { session, epoch });
        }
        tx.insert_entries(&rows).await?;
        tx.commit().await.map_err(CommitError::from)
    })
}

impl super::Store {
    /// Queues a new session's row to the journal writer, ahead of anything else of that session,
    /// and returns its journal's watch: at `ROW_QUEUED` until the row commits (then 0), or
    /// rejected at 0 if the database refuses it. Every store call about the session waits for
    /// the row meanwhile. Waits only while the writer's queue is full.
    pub async fn queue_session(&self, row: SessionRow) -> Result<JournalWatch, StoreError> {
        let (durable, rx) = super::watermark(ROW_QUEUED);
        let id: Arc<str> = Arc::from(row.id.as_str());
        self.inner.new_rows.queued(id.clone(), rx.clone());
        let sent = self
            .inner
            .appends
            .send(Msg::Create(Box::new(row), durable.clone()));
        if sent.await.is_err() {
            self.inner.new_rows.done(&id);
            return Err(StoreError::Unavailable("the store is closed".into()));
        }
        Ok((durable, rx))
    }
}

fn stopped(durable: &DurableSeq) -> bool {
    durable.borrow().rejected.is_some()
}

/// Raises each watch to the highest seq committed through it in `items`. Keyed by the watch,
/// not the session: a session opened again hands in a new watch, and the old one must not be
/// raised past what was committed through it.
fn advance(items: &[&Item]) {
    let mut marks: BTreeMap<*const DurableSeq, (i64, &DurableSeq)> = BTreeMap::new();
    for (e, durable) in items.iter().copied() {
        let m = marks
            .entry(Arc::as_ptr(durable))
            .or_insert((e.seq, durable));
        m.0 = m.0.max(e.seq);
    }
    for (seq, durable) in marks.into_values() {
        durable.send_if_modified(|v| {
            if v.rejected.is_none() && v.durable < seq {
                v.durable = seq;
                true
            } else {
                false
            }
        });
    }
}

/// Stops the watch of an entry the database refused: its session learns of it, and nothing
/// after it goes in through that watch (the journal keeps no gap).
fn reject((entry, durable): &Item, e: &CommitError) {
    let fenced = matches!(e, CommitError::Fenced { .. });
    if fenced {
        tracing::warn!(
            error = %e,
            session_id = %entry.session_id,
            seq = entry.seq,
            "journal entry fenced: another replica owns the session now"
        );
    } else {
        metrics::counter!(crate::metrics::STORE_ERRORS_TOTAL).increment(1);
        tracing::error!(
            error = %e,
            session_id = %entry.session_id,
            seq = entry.seq,
            "journal entry rejected by the database; the session's journal stops before it"
        );
    }
    durable.send_modify(|v| {
        if v.rejected.is_none() {
            v.rejected = Some(entry.seq);
            v.fenced = fenced;
        }
    });
}

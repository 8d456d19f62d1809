//! A journal entry as appended and as read, and the durable watermark the writer reports.

use std::sync::Arc;

use tokio::sync::watch;

/// One journal entry as stored: the exact JSON text that was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Shared by the entries of one stored pack (one allocation per row read, not per entry).
    pub session_id: Arc<str>,
    pub seq: i64,
    /// What the body is, e.g. the `sessionUpdate` kind; opaque to the store. Shared by the
    /// entries of one stored pack.
    pub kind: Arc<str>,
    /// Shared, so that a catch-up queues it for its client as read, without another copy.
    pub body: Arc<str>,
    pub at_ms: i64,
}

/// Where one session's journal stands, as the writer reports it through a `DurableSeq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    /// Every entry appended with a seq up to this one is committed.
    pub durable: i64,
    /// The seq of an entry the database rejected (a constraint, a bad value): the watermark
    /// stops below it for good, and later appends through the same watch are not written.
    pub rejected: Option<i64>,
    /// The rejection was fencing: the entry carried an epoch that is no longer the session's
    /// lease epoch (another replica took the session over).
    pub fenced: bool,
}

impl Watermark {
    /// A journal committed up to `seq`, nothing rejected.
    pub fn at(seq: i64) -> Watermark {
        Watermark {
            durable: seq,
            rejected: None,
            fenced: false,
        }
    }

    /// True once `seq` is committed, or once it never will be (the watermark stopped).
    pub fn settled(&self, seq: i64) -> bool {
        self.durable >= seq || self.rejected.is_some()
    }
}

/// Durable watermark of one session's journal, set by the writer only. One watch per live
/// session: a rejection stops this watch, and a new watch (the session opened again from its
/// row's `last_seq`) starts afresh.
pub type DurableSeq = watch::Sender<Watermark>;

/// One session journal's watch: the writer's end and the session's.
pub type JournalWatch = (Arc<DurableSeq>, watch::Receiver<Watermark>);

/// A fresh watch for a journal committed up to `last_seq`.
pub fn watermark(last_seq: i64) -> JournalWatch {
    let (tx, rx) = watch::channel(Watermark::at(last_seq));
    (Arc::new(tx), rx)
}

/// An append on its way to the group-commit writer.
#[derive(Debug, Clone)]
pub struct NewEntry {
    pub session_id: Arc<str>,
    pub seq: i64,
    pub kind: Arc<str>,
    pub body: Arc<str>,
    pub at_ms: i64,
    /// The lease epoch its writer holds (several replicas), checked against the session's in
    /// the insert's transaction: a stale one is refused (`Watermark::fenced`). `None`: no
    /// lease (a single daemon), no check.
    pub epoch: Option<i64>,
}

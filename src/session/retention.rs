//! Retention: keeps one session's journal under its caps (entries, bytes) without breaking
//! `session/load`. Message chunks are merged first (`compaction::compact`); only if that is
//! not enough do the oldest entries go.
//!
//! Never holds the journal in memory: merging reads only the stretches the database points out
//! (neighbours of one mergeable kind), a page at a time, replacing each page's range; the
//! oldest entries are dropped by `Store::trim_journal`, which counts and sums in the database.
//! A 1 000 000-entry journal costs a page of memory, not a journal.
//!
//! Nor is the journal measured after every turn: the actor keeps an upper bound of its size
//! (`Estimate`: the last measure plus what it appended since), and a turn that leaves that
//! bound under both caps starts no pass, so a long session's turns do not each sum its
//! journal in the database.

use std::sync::Arc;

use super::compaction;
use acpd_store::{JournalEntry, Store, StoreError};

/// Entries read per page while compacting.
const PAGE: i64 = 5000;

/// What a retention pass did.
#[derive(Debug)]
pub(super) struct Outcome {
    pub before: usize,
    pub after: usize,
    pub dropped_oldest: usize,
}

/// A journal's size as retention counts it: entries, and their bytes as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Size {
    pub entries: u64,
    pub bytes: u64,
}

impl Size {
    fn measured((count, bytes): (i64, i64)) -> Size {
        Size {
            entries: count.max(0) as u64,
            bytes: bytes.max(0) as u64,
        }
    }

    /// Over a cap (0: no cap).
    fn over(self, max_entries: u64, max_bytes: u64) -> bool {
        (max_entries > 0 && self.entries > max_entries) || (max_bytes > 0 && self.bytes > max_bytes)
    }

    fn plus(self, other: Size) -> Size {
        Size {
            entries: self.entries.saturating_add(other.entries),
            bytes: self.bytes.saturating_add(other.bytes),
        }
    }
}

/// A pass's result: what it did (`None`: nothing, the journal was under the caps) and the
/// journal's size when it measured last.
pub(super) type Pass = (Option<Outcome>, Size);

/// What a session's actor knows of its journal's size between passes: never less than the
/// real size, so "under the caps" by the estimate means under them in the store. Pure: the
/// actor tells it what happened, it says whether a pass is needed.
#[derive(Debug, Default)]
pub(super) struct Estimate {
    /// The last measure plus the appends since; `None` until a pass has measured (an actor
    /// starts with a journal it has not counted) or after a pass failed.
    known: Option<Size>,
    /// Appended while a pass runs (`Some` exactly while one runs): the pass's measure may
    /// miss them.
    during_pass: Option<Size>,
}

impl Estimate {
    /// One entry of `bytes` stored bytes was appended.
    pub fn appended(&mut self, bytes: u64) {
        let one = Size { entries: 1, bytes };
        if let Some(k) = &mut self.known {
            *k = k.plus(one);
        }
        if let Some(d) = &mut self.during_pass {
            *d = d.plus(one);
        }
    }

    /// Whether a pass must look at the journal: its size is unknown or may be over a cap.
    pub fn needs_pass(&self, max_entries: u64, max_bytes: u64) -> bool {
        self.known.is_none_or(|k| k.over(max_entries, max_bytes))
    }

    pub fn pass_running(&self) -> bool {
        self.during_pass.is_some()
    }

    pub fn pass_started(&mut self) {
        self.during_pass = Some(Size::default());
    }

    /// The pass measured `size` (`None`: it failed) at some point after it started.
    pub fn pass_ended(&mut self, size: Option<Size>) {
        let during = self.during_pass.take().unwrap_or_default();
        self.known = size.map(|s| s.plus(during));
    }
}

/// Checks the caps and compacts when over. Entries appended meanwhile have higher seqs and are
/// outside the replaced ranges, so a pass can run while the session goes on.
pub(super) async fn enforce(
    store: Store,
    session_id: Arc<str>,
    max_entries: u64,
    max_bytes: u64,
) -> Result<Pass, StoreError> {
    enforce_paged(&store, &session_id, max_entries, max_bytes, PAGE).await
}

async fn enforce_paged(
    store: &Store,
    session_id: &str,
    max_entries: u64,
    max_bytes: u64,
    page: i64,
) -> Result<Pass, StoreError> {
    let size = Size::measured(store.journal_size(session_id).await?);
    if !size.over(max_entries, max_bytes) {
        return Ok((None, size));
    }
    merge_chunks(store, session_id, page).await?;
    let merged = Size::measured(store.journal_size(session_id).await?);
    let dropped_oldest = if merged.over(max_entries, max_bytes) {
        store
            .trim_journal(session_id, max_entries, max_bytes)
            .await?
    } else {
        0
    };
    let after = Size::measured(store.journal_size(session_id).await?);
    let outcome = Outcome {
        before: size.entries as usize,
        after: after.entries as usize,
        dropped_oldest: dropped_oldest as usize,
    };
    Ok((Some(outcome), after))
}

/// A run of chunks that may go on in the next page, merged so far but not yet written back:
/// the journal still holds its `rows` original entries, from seq `start` on.
struct Carry {
    start: i64,
    rows: usize,
    merged: JournalEntry,
}

/// The kinds whose neighbouring entries `compaction::compact` may merge.
const MERGEABLE: [&str; 3] = [
    "user_message_chunk",
    "agent_message_chunk",
    "agent_thought_chunk",
];

/// Merges the chunk runs of the whole journal. The database points out where neighbours share
/// a mergeable kind (`journal_neighbours`, no bodies read); only those stretches are read, a
/// page at a time. A journal with nothing to merge costs one scan in the database.
async fn merge_chunks(store: &Store, session_id: &str, page: i64) -> Result<(), StoreError> {
    let mut after = 0;
    loop {
        let pairs = store
            .journal_neighbours(session_id, after, &MERGEABLE, page)
            .await?;
        let (Some(first), Some(last)) = (pairs.first(), pairs.last()) else {
            return Ok(());
        };
        after = merge_span(store, session_id, first.0 - 1, last.1, page).await?;
        if (pairs.len() as i64) < page {
            return Ok(());
        }
    }
}

/// Merges the entries after `from` up to at least `until`, one page at a time, and on until no
/// run is left open; returns the last seq it looked at. A run crossing a page boundary is
/// carried (as one merged entry) into the next page, so the result is what `compact` over the
/// whole stretch gives and every range is written once.
async fn merge_span(
    store: &Store,
    session_id: &str,
    from: i64,
    until: i64,
    page: i64,
) -> Result<i64, StoreError> {
    let mut after = from;
    let mut carry: Option<Carry> = None;
    loop {
        let read = store.journal_after(session_id, after, page).await?;
        let Some(last_read) = read.last().map(|e| e.seq) else {
            // The journal ended right at a page boundary: write the carried run back.
            if let Some(c) = carry.filter(|c| c.rows > 1) {
                store
                    .replace_journal_range(session_id, c.start, c.merged.seq, &[c.merged])
                    .await?;
            }
            return Ok(after);
        };
        let full = read.len() as i64 == page;
        after = last_read;
        let (start, mut rows) = match &carry {
            Some(c) => (c.start, c.rows + read.len()),
            None => (read[0].seq, read.len()),
        };
        let mut input = Vec::with_capacity(read.len() + 1);
        input.extend(carry.take().map(|c| c.merged));
        input.extend(read);
        let mut kept = compaction::compact(&input);
        let mut end = last_read;
        if full && kept.last().is_some_and(may_continue) {
            let merged = kept.pop().expect("checked above");
            // The run holds every entry after the last kept one (or the whole window).
            let run_start = kept.last().map_or(start, |e| e.seq + 1);
            let run_rows = match kept.last() {
                Some(k) => input.iter().filter(|e| e.seq > k.seq).count(),
                None => rows,
            };
            rows -= run_rows;
            end = run_start - 1;
            carry = Some(Carry {
                start: run_start,
                rows: run_rows,
                merged,
            });
        }
        if kept.len() < rows && start <= end {
            store
                .replace_journal_range(session_id, start, end, &kept)
                .await?;
        }
        if !full || (after >= until && carry.is_none()) {
            return Ok(after);
        }
    }
}

/// Whether the next page might continue this entry's run: it is a mergeable text chunk.
fn may_continue(e: &JournalEntry) -> bool {
    MERGEABLE.contains(&&*e.kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use acpd_store::{NewEntry, SessionRow};

    fn body(seq: i64, kind: &str, message: &str) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s","update":{{"sessionUpdate":"{kind}","messageId":"{message}","content":{{"type":"text","text":"<{seq}>"}}}},"_meta":{{"acpd":{{"seq":{seq}}}}}}}}}"#
        )
    }

    async fn journal(store: &Store) -> Vec<JournalEntry> {
        store.journal_after("s", 0, 1_000_000).await.unwrap()
    }

    /// Runs of every length, some across page boundaries, one over several pages: merging a
    /// page at a time gives exactly what merging the whole journal at once gives.
    /// A store holding one session "s" whose journal is runs of the given lengths.
    async fn store_with_runs(runs: &[usize]) -> Store {
        // The daemon's journal form: merged runs go back in shortened, and read back whole.
        let opts = crate::session::journal_form::store_options();
        let store = Store::open("sqlite::memory:", opts).await.unwrap();
        let row = SessionRow {
            id: "s".into(),
            principal_id: "p".into(),
            agent: "a".into(),
            agent_session_id: None,
            cwd: "/".into(),
            additional_dirs: "[]".into(),
            title: None,
            mode_id: None,
            config_values: "{}".into(),
            meta: "{}".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            closed: false,
            last_seq: 0,
            owner_instance: None,
            lease_until_ms: None,
        };
        store.insert_session(&row).await.unwrap();
        let (durable, mut rx) = acpd_store::watermark(0);
        let mut seq = 0;
        for (i, len) in runs.iter().enumerate() {
            for _ in 0..*len {
                seq += 1;
                let kind = if i % 5 == 4 {
                    "tool_call"
                } else {
                    "agent_message_chunk"
                };
                let entry = NewEntry {
                    session_id: "s".into(),
                    seq,
                    kind: kind.into(),
                    body: body(seq, kind, &format!("m{i}")).into(),
                    at_ms: seq,
                    epoch: None,
                };
                store.append(entry, durable.clone()).await.unwrap();
            }
        }
        rx.wait_for(|w| w.durable >= seq).await.unwrap();
        store
    }

    /// Runs of every length, some across page boundaries, one over several pages: merging a
    /// page at a time gives exactly what merging the whole journal at once gives.
    #[tokio::test]
    async fn merging_page_by_page_equals_merging_the_whole_journal() {
        let runs = [1, 3, 7, 2, 1, 25, 1, 6, 1, 1, 9, 4];
        for page in [1, 2, 4, 5, 7, 61, 100] {
            let store = store_with_runs(&runs).await;
            let expected = compaction::compact(&journal(&store).await);
            merge_chunks(&store, "s", page).await.unwrap();
            assert_eq!(journal(&store).await, expected, "page of {page}");
            // A second pass finds nothing more to merge.
            merge_chunks(&store, "s", page).await.unwrap();
            assert_eq!(journal(&store).await, expected, "again, page of {page}");
            store.close().await;
        }
    }

    /// Over both caps: merging first, then the oldest entries go until both hold.
    #[tokio::test]
    async fn the_caps_are_met_by_merging_then_by_dropping_the_oldest() {
        let store = store_with_runs(&[10, 1, 10, 1, 1, 1, 10]).await;
        let merged = compaction::compact(&journal(&store).await);
        assert_eq!(merged.len(), 7);
        // The byte cap counts bytes as stored (the journal form shortens updates).
        let stored = |e: &JournalEntry| {
            use acpd_store::BodyForm as _;
            let form = crate::session::journal_form::UpdateForm;
            form.shrink(&e.session_id, e.seq, &e.body)
                .map_or(e.body.len(), str::len) as u64
        };
        let newest_three: u64 = merged[4..].iter().map(stored).sum();
        assert!(newest_three < merged[4..].iter().map(|e| e.body.len() as u64).sum());
        let (outcome, size) = enforce_paged(&store, "s", 5, newest_three, 3)
            .await
            .unwrap();
        let outcome = outcome.expect("over the caps");
        assert_eq!(
            (outcome.before, outcome.after, outcome.dropped_oldest),
            (34, 3, 4)
        );
        let three = Size {
            entries: 3,
            bytes: newest_three,
        };
        assert_eq!(size, three, "the pass says what it left");
        assert_eq!(journal(&store).await, merged[4..].to_vec());
        let (again, size) = enforce_paged(&store, "s", 5, newest_three, 3)
            .await
            .unwrap();
        assert!(again.is_none());
        assert_eq!(size, three);
        store.close().await;
    }

    /// The estimate asks for a pass until one has measured, then only once the appends since
    /// may have crossed a cap; appends made while a pass runs count on top of its measure.
    #[test]
    fn the_estimate_asks_for_a_pass_only_when_a_cap_may_be_crossed() {
        let mut e = Estimate::default();
        assert!(e.needs_pass(10, 0), "a journal nobody measured");
        e.pass_started();
        e.appended(5);
        e.pass_ended(Some(Size {
            entries: 8,
            bytes: 80,
        }));
        assert_eq!(
            e.known,
            Some(Size {
                entries: 9,
                bytes: 85
            })
        );
        assert!(!e.needs_pass(10, 100));
        e.appended(10);
        assert!(!e.needs_pass(10, 100), "10 entries is the cap, not over it");
        e.appended(6);
        // 11 entries, 101 bytes.
        assert!(e.needs_pass(10, 0), "over the entry cap");
        assert!(e.needs_pass(0, 100), "over the byte cap");
        assert!(!e.needs_pass(0, 1000));
        assert!(!e.needs_pass(0, 0), "no caps");
        e.pass_started();
        e.pass_ended(None);
        assert!(
            e.needs_pass(0, 1000),
            "a failed pass leaves the size unknown"
        );
    }
}

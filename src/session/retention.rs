//! Retention: keeps one session's journal under its caps (entries, bytes) without breaking
//! `session/load`. Message chunks are merged first (`compaction::compact`); only if that is
//! not enough do the oldest entries go.

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

/// Checks the caps and compacts when over. Entries appended meanwhile have higher seqs and are
/// outside the replaced range, so a pass can run while the session goes on.
pub(super) async fn enforce(
    store: Store,
    session_id: Arc<str>,
    max_entries: u64,
    max_bytes: u64,
) -> Result<Option<Outcome>, StoreError> {
    let over = |count: u64, bytes: u64| {
        (max_entries > 0 && count > max_entries) || (max_bytes > 0 && bytes > max_bytes)
    };
    let (count, bytes) = store.journal_size(&session_id).await?;
    if !over(count.max(0) as u64, bytes.max(0) as u64) {
        return Ok(None);
    }
    let mut all: Vec<JournalEntry> = Vec::with_capacity(count.max(0) as usize);
    let mut after = 0;
    loop {
        let page = store.journal_after(&session_id, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        let n = page.len();
        all.extend(page);
        if (n as i64) < PAGE {
            break;
        }
    }
    let (Some(first), Some(last)) = (all.first().map(|e| e.seq), all.last().map(|e| e.seq)) else {
        return Ok(None);
    };
    let mut kept = compaction::compact(&all);
    let mut kept_bytes: u64 = kept.iter().map(|e| e.body.len() as u64).sum();
    let mut dropped_oldest = 0;
    while !kept.is_empty() && over(kept.len() as u64, kept_bytes) {
        let e = kept.remove(0);
        kept_bytes -= e.body.len() as u64;
        dropped_oldest += 1;
    }
    store
        .replace_journal_range(&session_id, first, last, &kept)
        .await?;
    Ok(Some(Outcome {
        before: all.len(),
        after: kept.len(),
        dropped_oldest,
    }))
}

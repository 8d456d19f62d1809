//! The journal position of one session, without I/O: the next seq, the durable watermark,
//! the appends held while the store's queue is full, and when the journal counts as stopped.
//! The actor (`journal.rs`) asks it and does the store calls.

use std::collections::VecDeque;
use std::sync::Arc;

use acpd_store::{DurableSeq, JournalWatch, NewEntry, Watermark};
use tokio::sync::watch;

/// Most appends held while the store's queue is full (the actor takes no agent events
/// meanwhile, so only the user's prompt blocks and acpd's notes add to them).
pub(super) const UNQUEUED_LIMIT: usize = 1024;

pub(super) struct Position {
    /// The seq the next journaled update gets.
    pub(super) next_seq: i64,
    pub(super) durable: Arc<DurableSeq>,
    pub(super) durable_rx: watch::Receiver<Watermark>,
    /// The clock read once for a burst of agent events, while it is handled: its updates are
    /// journaled microseconds apart, and a read per update was ~1 % of acpd's CPU.
    pub(super) burst_ms: Option<i64>,
    /// The journal stopped because the store took no writes (`stop`).
    pub(super) store_outage: bool,
    /// Appends the store's full queue did not take yet, in seq order.
    unqueued: VecDeque<NewEntry>,
    /// Several replicas: the lease this replica holds on the session; every append carries
    /// its epoch, and its `lost` token lets the session go.
    pub(super) lease: Option<crate::cluster::Lease>,
}

impl Position {
    /// A journal committed up to `last_seq`.
    pub(super) fn new(last_seq: i64, lease: Option<crate::cluster::Lease>) -> Position {
        Position::watching(last_seq + 1, acpd_store::watermark(last_seq), lease)
    }

    /// A new session's journal, empty, whose row is queued to the store's writer: `watch` is
    /// at `ROW_QUEUED` until the row commits, and nothing is sent past it meanwhile.
    pub(super) fn queued(watch: JournalWatch, lease: Option<crate::cluster::Lease>) -> Position {
        Position::watching(1, watch, lease)
    }

    fn watching(
        next_seq: i64,
        (durable, durable_rx): JournalWatch,
        lease: Option<crate::cluster::Lease>,
    ) -> Position {
        Position {
            next_seq,
            durable,
            durable_rx,
            burst_ms: None,
            store_outage: false,
            unqueued: VecDeque::new(),
            lease,
        }
    }

    /// The seq of the last update journaled (or found in the journal at the start).
    pub(super) fn last(&self) -> i64 {
        self.next_seq - 1
    }

    /// Takes the next seq for an update about to be journaled.
    pub(super) fn assign(&mut self) -> i64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The epoch an append carries (`None` without a lease).
    pub(super) fn epoch(&self) -> Option<i64> {
        self.lease.as_ref().map(|l| l.epoch)
    }

    /// The journal stopped at a rejected entry (or `stop`): nothing after it is journaled.
    pub(super) fn stopped(&self) -> bool {
        self.durable_rx.borrow().rejected.is_some()
    }

    /// Whether appends are held for a full queue: later ones queue behind them, in order, and
    /// the actor takes no agent events meanwhile.
    pub(super) fn holding(&self) -> bool {
        !self.unqueued.is_empty()
    }

    /// The first held append's seq.
    pub(super) fn first_held(&self) -> Option<i64> {
        self.unqueued.front().map(|e| e.seq)
    }

    /// Holds an append the store's queue did not take. Too many held: `Err(seq)`, the journal
    /// must stop at it.
    pub(super) fn hold(&mut self, entry: NewEntry) -> Result<(), i64> {
        if self.unqueued.len() >= UNQUEUED_LIMIT {
            return Err(entry.seq);
        }
        self.unqueued.push_back(entry);
        Ok(())
    }

    /// The first held append, to go to the room the store made.
    pub(super) fn take_first(&mut self) -> Option<NewEntry> {
        self.unqueued.pop_front()
    }

    /// Releases the held appends in seq order while `send` takes them; the first it refuses
    /// stays first.
    pub(super) fn release_while(&mut self, mut send: impl FnMut(&NewEntry) -> bool) {
        while let Some(e) = self.unqueued.front() {
            if !send(e) {
                break;
            }
            self.unqueued.pop_front();
        }
    }

    /// The store is not taking the session's writes: the journal stops before `at` as if the
    /// store had rejected it, and what is held (at `at` or after it) is never written.
    pub(super) fn stop(&mut self, at: i64) {
        self.store_outage = true;
        self.unqueued.clear();
        self.durable.send_if_modified(|m| {
            let stop = m.rejected.is_none();
            if stop {
                m.rejected = Some(at);
            }
            stop
        });
    }

    /// Held appends and a stalled store (`stalled`): where the journal stops.
    pub(super) fn stall_stop(&self, stalled: bool) -> Option<i64> {
        self.first_held().filter(|_| stalled)
    }

    /// `session/cancel` while the store is away (`stalled`): the seq the journal stops at so
    /// the turn need not wait for updates that are not durable (`None`: all are).
    pub(super) fn cancel_stop(&self, stalled: bool) -> Option<i64> {
        let durable = self.durable_rx.borrow().durable;
        (stalled && durable < self.last()).then_some(durable + 1)
    }

    /// The journal stopped for an outage and the store's writer is still stuck (`stalled`):
    /// the session waits for that commit to be over before it ends.
    pub(super) fn settling(&self, stalled: bool) -> bool {
        self.store_outage && stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: i64) -> NewEntry {
        NewEntry {
            session_id: Arc::from("s"),
            seq,
            kind: Arc::from("agent_message_chunk"),
            body: Arc::from("{}"),
            at_ms: 0,
            epoch: None,
        }
    }

    #[test]
    fn seqs_follow_the_journal_end() {
        let mut p = Position::new(7, None);
        assert_eq!(p.last(), 7);
        assert_eq!(p.assign(), 8);
        assert_eq!(p.assign(), 9);
        assert_eq!(p.last(), 9);
        assert_eq!(p.epoch(), None);
    }

    #[test]
    fn held_appends_release_in_order_up_to_the_first_refused() {
        let mut p = Position::new(0, None);
        assert!(!p.holding());
        for seq in 1..=4 {
            p.hold(entry(seq)).unwrap();
        }
        assert_eq!(p.first_held(), Some(1));
        assert_eq!(p.take_first().map(|e| e.seq), Some(1));
        let mut sent = Vec::new();
        p.release_while(|e| {
            if e.seq == 4 {
                return false;
            }
            sent.push(e.seq);
            true
        });
        assert_eq!(sent, [2, 3]);
        assert_eq!(p.first_held(), Some(4));
        p.release_while(|_| true);
        assert!(!p.holding());
    }

    #[test]
    fn too_many_held_stops_at_the_next() {
        let mut p = Position::new(0, None);
        for seq in 1..=UNQUEUED_LIMIT as i64 {
            p.hold(entry(seq)).unwrap();
        }
        let next = UNQUEUED_LIMIT as i64 + 1;
        assert_eq!(p.hold(entry(next)), Err(next));
    }

    #[test]
    fn a_stop_drops_what_is_held_and_stops_once() {
        let mut p = Position::new(3, None);
        p.hold(entry(4)).unwrap();
        assert!(!p.stopped());
        assert_eq!(p.stall_stop(false), None);
        assert_eq!(p.stall_stop(true), Some(4));
        p.stop(4);
        assert!(p.stopped());
        assert!(!p.holding());
        assert!(p.settling(true));
        assert!(!p.settling(false));
        // The first stop stands.
        p.stop(9);
        assert_eq!(p.durable_rx.borrow().rejected, Some(4));
    }

    #[test]
    fn cancel_in_an_outage_stops_after_what_is_durable() {
        let mut p = Position::new(2, None);
        assert_eq!(p.cancel_stop(true), None);
        p.assign();
        p.assign();
        assert_eq!(p.cancel_stop(false), None);
        assert_eq!(p.cancel_stop(true), Some(3));
        p.durable.send_modify(|m| m.durable = 4);
        assert_eq!(p.cancel_stop(true), None);
    }
}

//! How much of one agent's output acpd holds for its sessions: the updates its router has
//! handed on that their sessions have not taken yet. The router reads the agent's stdout no
//! further ahead than `HELD_MAX` of them, so an agent streaming to many sessions at once waits
//! in its own pipe, not behind a thousand session queues (1 024 each, and a backlog of 8 192
//! behind each): the memory an agent's output takes in acpd is bounded per agent, not per
//! session, and an update waits behind at most that much (issue 45's fanout row: p99 from
//! 2.6 s to 0.5 s).
//!
//! Each routed update carries a `Held` share of the count, given back when it is dropped: when
//! its session has taken it, or with a queue that closed. No share outlives its update, so the
//! count needs no bookkeeping per session.

use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use tokio::sync::Notify;

/// Updates held for an agent's sessions at which its router stops reading the agent. Measured
/// with 1 000 sessions streaming: at 512 each session journals about one update per pass (a
/// row each) and the aggregate rate fell by half; 16 384 was no faster than 4 096 and doubled
/// the p99 wait.
pub(crate) const HELD_MAX: isize = 4096;
/// Reading goes on once the held updates are down to this.
const RESUME_AT: isize = HELD_MAX / 2;

#[derive(Default)]
struct Count {
    /// Signed: `forget` takes back shares still out, which are given back again when dropped;
    /// the count then reads low (the agent is read a little further ahead), never stuck high.
    held: AtomicIsize,
    /// Told once per fall to `RESUME_AT`.
    room: Notify,
}

/// One agent's count (its router's); cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct HeldOutput(Arc<Count>);

impl HeldOutput {
    /// A share for one update about to be handed to a session.
    pub(crate) fn hold(&self) -> Held {
        self.0.held.fetch_add(1, Ordering::Relaxed);
        Held(Some(self.0.clone()))
    }

    /// At `HELD_MAX`: the router reads no more of the agent until `room`.
    pub(crate) fn full(&self) -> bool {
        self.0.held.load(Ordering::Acquire) >= HELD_MAX
    }

    /// Resolves once the count has fallen to `RESUME_AT` since the last call resolved (at once
    /// if it did meanwhile): the caller checks `full` again.
    pub(crate) async fn room(&self) {
        self.0.room.notified().await
    }

    /// Stops counting `n` shares held by a session cut from its agent (which may never take
    /// them); each is given back again if it ever is.
    pub(crate) fn forget(&self, n: usize) {
        self.0.held.fetch_sub(n as isize, Ordering::AcqRel);
    }

    #[cfg(test)]
    fn count(&self) -> isize {
        self.0.held.load(Ordering::Acquire)
    }
}

/// One routed update's share of its agent's `HeldOutput`; `Held::none()` before it is routed.
#[derive(Debug)]
pub struct Held(Option<Arc<Count>>);

impl Held {
    pub(crate) fn none() -> Held {
        Held(None)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            // Every share is given back one at a time and none is taken while the router
            // waits, so the fall through `RESUME_AT + 1` is seen exactly once per wait.
            if c.held.fetch_sub(1, Ordering::AcqRel) == RESUME_AT + 1 {
                c.room.notify_one();
            }
        }
    }
}

impl std::fmt::Debug for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.held.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn full_at_the_limit_and_room_once_half_is_given_back() {
        let out = HeldOutput::default();
        let mut shares: Vec<Held> = (0..HELD_MAX).map(|_| out.hold()).collect();
        assert!(out.full());
        // Not yet: a share back is not room.
        shares.truncate((RESUME_AT + 1) as usize);
        let early = tokio::time::timeout(Duration::from_millis(20), out.room()).await;
        assert!(early.is_err(), "room before the count fell to RESUME_AT");
        shares.pop();
        tokio::time::timeout(Duration::from_secs(5), out.room())
            .await
            .expect("room once the count fell to RESUME_AT");
        assert!(!out.full());
        drop(shares);
        assert_eq!(out.count(), 0);
    }

    #[tokio::test]
    async fn room_told_before_the_wait_is_not_lost() {
        let out = HeldOutput::default();
        let shares: Vec<Held> = (0..HELD_MAX).map(|_| out.hold()).collect();
        // Given back before the router waits: the wait still ends.
        drop(shares);
        tokio::time::timeout(Duration::from_secs(5), out.room())
            .await
            .expect("the room told before the wait");
    }

    #[test]
    fn a_forgotten_share_given_back_leaves_the_count_low_never_high() {
        let out = HeldOutput::default();
        let shares: Vec<Held> = (0..HELD_MAX).map(|_| out.hold()).collect();
        out.forget(HELD_MAX as usize);
        assert!(!out.full());
        drop(shares);
        assert_eq!(out.count(), -HELD_MAX);
        assert!(!out.full());
        drop(Held::none());
        assert_eq!(out.count(), -HELD_MAX);
    }
}

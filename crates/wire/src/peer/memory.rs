//! `memory_pair`: two `Link`s joined back to back in memory, for agents that run inside acpd.

use tokio::sync::mpsc;

use super::{InFrame, Link, OutFrame};

/// Two links joined back to back in memory, for an agent that runs inside acpd.
///
/// One task carries both directions, each through a one-message slot: a side that is slow to
/// take its messages pauses only the direction towards it. A side that hangs up ends the other
/// side's incoming once what it sent has been delivered; the task ends when both are done.
pub fn memory_pair() -> (Link, Link, impl Future<Output = ()> + Send) {
    let (a_out, a_out_rx) = mpsc::channel::<OutFrame>(crate::LINK_QUEUE);
    let (b_out, b_out_rx) = mpsc::channel::<OutFrame>(crate::LINK_QUEUE);
    let (a_in_tx, a_in) = mpsc::channel(crate::LINK_QUEUE);
    let (b_in_tx, b_in) = mpsc::channel(crate::LINK_QUEUE);
    let carry = async move {
        let mut a_to_b = Carry::new(a_out_rx, b_in_tx);
        let mut b_to_a = Carry::new(b_out_rx, a_in_tx);
        while !(a_to_b.done() && b_to_a.done()) {
            tokio::select! {
                step = a_to_b.step() => a_to_b.apply(step),
                step = b_to_a.step() => b_to_a.apply(step),
            }
        }
    };
    (
        Link {
            incoming: a_in,
            outgoing: a_out,
        },
        Link {
            incoming: b_in,
            outgoing: b_out,
        },
        carry,
    )
}

/// One direction of a `memory_pair`.
struct Carry {
    from: Option<mpsc::Receiver<OutFrame>>,
    to: Option<mpsc::Sender<InFrame>>,
    /// Taken from `from`, waiting for room in `to`.
    held: Option<OutFrame>,
}

enum Step {
    Took(Option<OutFrame>),
    Room(Option<mpsc::OwnedPermit<InFrame>>),
}

impl Carry {
    fn new(from: mpsc::Receiver<OutFrame>, to: mpsc::Sender<InFrame>) -> Carry {
        Carry {
            from: Some(from),
            to: Some(to),
            held: None,
        }
    }

    fn done(&self) -> bool {
        self.to.is_none()
    }

    /// Waits for the next thing this direction can do; pending forever once it is done.
    async fn step(&mut self) -> Step {
        match (&mut self.from, &self.to, &self.held) {
            (_, Some(to), Some(_)) => Step::Room(to.clone().reserve_owned().await.ok()),
            (Some(from), Some(_), None) => Step::Took(from.recv().await),
            _ => std::future::pending().await,
        }
    }

    fn apply(&mut self, step: Step) {
        match step {
            Step::Took(Some(t)) => self.held = Some(t),
            // The sender hung up: its side's end reaches the receiver.
            Step::Took(None) => {
                self.from = None;
                self.to = None;
            }
            Step::Room(Some(p)) => {
                if let Some(t) = self.held.take() {
                    p.send(InFrame::Text(t.into_string()));
                }
            }
            // The receiver hung up: nothing more to carry this way.
            Step::Room(None) => {
                self.held = None;
                self.from = None;
                self.to = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_side_that_does_not_read_stops_only_its_own_direction() {
        let (mut a, b, carry) = memory_pair();
        let carry = tokio::spawn(carry);
        // B never reads: A's messages fill B's incoming, the slot, then A's outgoing.
        let mut sent = 0;
        while a.outgoing.try_send(format!("to b {sent}").into()).is_ok() {
            sent += 1;
            tokio::task::yield_now().await;
        }
        assert!(sent > crate::LINK_QUEUE, "only {sent} queued");
        // B -> A still flows.
        b.outgoing.send("to a".into()).await.expect("send");
        let got = tokio::time::timeout(Duration::from_secs(5), a.incoming.recv())
            .await
            .expect("B -> A stalled behind the jammed A -> B");
        assert!(matches!(got, Some(InFrame::Text(t)) if t == "to a"));
        // A hangs up: B still gets everything A sent, then the end.
        drop(a);
        let mut b_in = b.incoming;
        let mut n = 0;
        while let Some(InFrame::Text(t)) = b_in.recv().await {
            assert_eq!(t, format!("to b {n}"));
            n += 1;
        }
        assert_eq!(n, sent);
        drop(b.outgoing);
        tokio::time::timeout(Duration::from_secs(5), carry)
            .await
            .expect("carry ended")
            .expect("carry panicked");
    }
}

//! The lane: a peer's second command queue, the one its owner's fan-out uses. Deep (a
//! client's whole outgoing queue), bounded by bytes as well as count, and never awaited:
//! `try_send_raw` and `try_respond` hand a message back when it is full, and the session layer
//! then feeds that client from the journal. Requests a session relays to a client
//! (`lane_request`, `try_request`) take the lane too, so they never overtake an update queued
//! before them. So do `try_request_in_band` / `try_notify`, for an owner that must not wait on
//! the other side (the session actors of a hosted agent): a burst of them (1 000 sessions
//! prompted at once) is queued, not refused, and a full lane means the other side has stopped
//! taking for a long while. (They took the small `Command` queue before: 256 messages, full
//! within a burst, and a session that found it full cut an agent that was reading fine.)
//! Everything else keeps the small `Command` queue, whose senders wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::{
    Command, OutFrame, OutgoingRequest, PeerError, PeerHandle, PeerTask, Reply, RequestId,
    Responder, ResponseError,
};

/// Why a `try_` send did not queue its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("the peer's queue is full (the other side is not taking what it is sent)")]
    Full,
    #[error("the connection is closed")]
    Closed,
}

impl<T> From<mpsc::error::TrySendError<T>> for QueueError {
    fn from(e: mpsc::error::TrySendError<T>) -> QueueError {
        match e {
            mpsc::error::TrySendError::Full(_) => QueueError::Full,
            mpsc::error::TrySendError::Closed(_) => QueueError::Closed,
        }
    }
}

/// What the lane carries: small, since a channel allocates its first block of slots up front.
pub(super) enum LaneItem {
    /// A shared serialization (`try_send_raw`), its bytes counted in `Queued`.
    Shared(Arc<str>),
    Reply(Box<(RequestId, Result<Value, ResponseError>)>),
    Request(Box<LaneRequest>),
    /// `try_request_in_band`, `try_notify`.
    Command(Box<Command>),
}

/// A request to send through the lane (`PeerHandle::lane_request`), in order with what is
/// queued there. Dropped unsent, its `OutgoingRequest` answers `Disconnected`.
#[derive(Debug)]
pub struct LaneRequest {
    id: u64,
    method: String,
    params: Option<Value>,
    reply: oneshot::Sender<Result<Value, PeerError>>,
}

/// What the owner sees of its lane: the lane is a client's one outgoing queue, so the session
/// layer reads its fill and progress here.
#[derive(Default)]
pub(super) struct Queued {
    /// Bytes of `LaneItem::Shared` queued and not yet taken by the peer task.
    bytes: AtomicUsize,
    /// Lane messages taken by the peer task so far.
    taken: AtomicU64,
}

/// An answer handed back by `try_respond`.
pub type Answer = Box<(Responder, Result<Value, ResponseError>)>;

/// Most bytes of shared messages (`try_send_raw`) queued in one peer's lane.
pub(super) const QUEUE_BYTES: usize = 8 * 1024 * 1024;
/// Most messages queued in one peer's lane; its slots are allocated as they fill, so an idle
/// link pays for none of them.
pub(super) const QUEUE_MESSAGES: usize = 32_768;

impl PeerHandle {
    /// Queues an already serialized message in the lane without waiting, behind everything
    /// queued there before it. `Err` hands it back when the lane is full, by count
    /// (`QUEUE_MESSAGES`) or by bytes (`QUEUE_BYTES`); a closed peer counts as sent (its owner
    /// learns of that otherwise). The session layer's fan-out: every client of a session shares
    /// one `Arc`, and a client that cannot take it is fed from the journal instead of waited for.
    pub fn try_send_raw(&self, text: Arc<str>) -> Result<(), Arc<str>> {
        let n = text.len();
        if self.queued.bytes.load(Ordering::Relaxed) + n > QUEUE_BYTES {
            return Err(text);
        }
        // Counted before the send: the peer task may take it (and subtract) at once.
        self.queued.bytes.fetch_add(n, Ordering::Relaxed);
        match self.lane.try_send(LaneItem::Shared(text)) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.queued.bytes.fetch_sub(n, Ordering::Relaxed);
                match e {
                    mpsc::error::TrySendError::Full(LaneItem::Shared(text)) => Err(text),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Answers a request through the lane, in order behind what `try_send_raw` queued there;
    /// hands the answer back (boxed: it is large, and its holder queues it boxed) when the
    /// lane is full. A responder for another link's request is answered on its own link. A
    /// closed link counts as answered.
    pub fn try_respond(
        &self,
        mut responder: Responder,
        result: Result<Value, ResponseError>,
    ) -> Result<(), Answer> {
        let Some(id) = responder.id.take() else {
            return Ok(());
        };
        if !responder.is_for(self) {
            return match responder.tx.try_send(Command::Reply { id, result }.into()) {
                Err(mpsc::error::TrySendError::Full(slot)) => {
                    let Command::Reply { id, result } = Command::from(slot) else {
                        unreachable!("the reply just sent")
                    };
                    responder.id = Some(id);
                    Err(Box::new((responder, result)))
                }
                _ => Ok(()),
            };
        }
        match self.lane.try_send(LaneItem::Reply(Box::new((id, result)))) {
            Err(mpsc::error::TrySendError::Full(LaneItem::Reply(r))) => {
                let (id, result) = *r;
                responder.id = Some(id);
                Err(Box::new((responder, result)))
            }
            _ => Ok(()),
        }
    }

    /// A request to queue with `try_request`, and the handle to its answer. The wire id is
    /// taken now; a handle dropped before the request leaves withdraws it (it is not sent).
    pub fn lane_request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> (LaneRequest, OutgoingRequest) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let req = LaneRequest {
            id,
            method: method.to_owned(),
            params,
            reply,
        };
        let answer = OutgoingRequest {
            id,
            rx,
            tx: self.tx.clone(),
            tasks: self.tasks.clone(),
            done: false,
        };
        (req, answer)
    }

    /// Queues a request in the lane without waiting, behind everything queued there before
    /// it; hands it back when the lane is full (by count). A closed peer counts as sent (its
    /// answer handle then says `Disconnected`).
    pub fn try_request(&self, req: LaneRequest) -> Result<(), LaneRequest> {
        match self.lane.try_send(LaneItem::Request(Box::new(req))) {
            Err(mpsc::error::TrySendError::Full(LaneItem::Request(r))) => Err(*r),
            _ => Ok(()),
        }
    }

    /// `request_in_band` without waiting, through the lane: `QueueError::Full` when the lane
    /// is full (the other side has not taken what it was sent: its link, the write queue and
    /// `QUEUE_MESSAGES` behind them), so a caller that must not wait on the other side decides
    /// what then.
    pub fn try_request_in_band(
        &self,
        method: &str,
        params: Option<Value>,
        route: &str,
        tag: u64,
    ) -> Result<u64, QueueError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = Reply::InBand {
            route: route.to_owned(),
            tag,
        };
        let cmd = Command::Request {
            id,
            method: method.to_owned(),
            params,
            reply,
        };
        self.lane
            .try_send(LaneItem::Command(Box::new(cmd)))
            .map_err(QueueError::from)?;
        Ok(id)
    }

    /// `notify` without waiting, through the lane, in order with `try_request_in_band`.
    pub fn try_notify(&self, method: &str, params: Option<Value>) -> Result<(), QueueError> {
        let cmd = Command::Notify {
            method: method.to_owned(),
            params,
        };
        self.lane
            .try_send(LaneItem::Command(Box::new(cmd)))
            .map_err(QueueError::from)
    }

    /// Whether the lane has drained below half, by count and by bytes.
    pub fn queue_half_empty(&self) -> bool {
        self.lane.capacity() > QUEUE_MESSAGES / 2
            && self.queued.bytes.load(Ordering::Relaxed) < QUEUE_BYTES / 2
    }

    /// How many lane messages the peer task has taken so far: whether a client is reading.
    pub fn taken(&self) -> u64 {
        self.queued.taken.load(Ordering::Relaxed)
    }
}

impl PeerTask {
    pub(super) fn on_lane(&mut self, item: LaneItem) {
        self.queued.taken.fetch_add(1, Ordering::Relaxed);
        match item {
            LaneItem::Shared(text) => {
                self.queued.bytes.fetch_sub(text.len(), Ordering::Relaxed);
                // Shared, not copied: a transport that frames it anew copies it once there.
                self.to_write.push_back(OutFrame::Shared(text));
            }
            LaneItem::Reply(reply) => {
                let (id, result) = *reply;
                self.on_command(Command::Reply { id, result });
            }
            LaneItem::Request(req) => {
                let LaneRequest {
                    id,
                    method,
                    params,
                    reply,
                } = *req;
                // Withdrawn before it left: the other side never sees it.
                if reply.is_closed() {
                    return;
                }
                let reply = Reply::Oneshot(reply);
                self.on_command(Command::Request {
                    id,
                    method,
                    params,
                    reply,
                });
            }
            LaneItem::Command(cmd) => self.on_command(*cmd),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::timeout;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::peer::{InFrame, Incoming, Link, spawn};

    /// A peer on channels the test holds: frames in, text out.
    fn peer() -> (
        PeerHandle,
        mpsc::Receiver<Incoming>,
        mpsc::Sender<InFrame>,
        mpsc::Receiver<OutFrame>,
    ) {
        let (in_tx, incoming) = mpsc::channel(8);
        let (outgoing, out_rx) = mpsc::channel(8);
        let (handle, owner, _task) = spawn(Link { incoming, outgoing }, CancellationToken::new());
        (handle, owner, in_tx, out_rx)
    }

    async fn next(out: &mut mpsc::Receiver<OutFrame>) -> String {
        timeout(Duration::from_secs(5), out.recv())
            .await
            .unwrap()
            .unwrap()
            .into_string()
    }

    #[tokio::test]
    async fn lane_messages_and_answers_leave_in_the_order_queued() {
        let (peer, mut owner, frames, mut out) = peer();
        let request = r#"{"jsonrpc":"2.0","id":7,"method":"m"}"#;
        frames.send(InFrame::Text(request.into())).await.unwrap();
        let Some(Incoming::Request(req)) = owner.recv().await else {
            panic!("no request")
        };
        peer.try_send_raw("a".into()).unwrap();
        peer.try_respond(req.responder, Ok(Value::from(1))).unwrap();
        peer.try_send_raw("b".into()).unwrap();
        assert_eq!(next(&mut out).await, "a");
        assert_eq!(
            next(&mut out).await,
            r#"{"jsonrpc":"2.0","id":7,"result":1}"#
        );
        assert_eq!(next(&mut out).await, "b");
        assert_eq!(peer.taken(), 3);
        assert!(peer.queue_half_empty());
    }

    #[tokio::test]
    async fn a_full_lane_hands_the_message_back_and_takes_it_once_drained() {
        // The test's runtime has one thread: the peer task runs only when the test awaits.
        let (peer, _owner, _frames, mut out) = peer();
        let big: Arc<str> = "x".repeat(QUEUE_BYTES / 2 + 1).into();
        peer.try_send_raw(big.clone()).unwrap();
        assert!(!peer.queue_half_empty());
        let back = peer.try_send_raw(big.clone()).unwrap_err();
        assert!(Arc::ptr_eq(&back, &big), "the same bytes come back");
        assert_eq!(next(&mut out).await.len(), big.len());
        peer.try_send_raw(back).unwrap();
        assert_eq!(next(&mut out).await.len(), big.len());
        assert_eq!(peer.taken(), 2);
    }

    #[tokio::test]
    async fn in_band_requests_beyond_the_command_queue_are_queued_while_the_other_side_reads_nothing()
     {
        // One thread: the peer task does not run until the test awaits, as when a thousand
        // session actors run before it. 1 000 is four times the small `Command` queue.
        let (peer, _owner, _frames, mut out) = peer();
        for tag in 1..=1000 {
            peer.try_request_in_band("m", None, "route", tag)
                .expect("queued: the lane is deep");
            peer.try_notify("n", None)
                .expect("queued: the lane is deep");
        }
        for _ in 0..1000 {
            let req: Value = serde_json::from_str(&next(&mut out).await).unwrap();
            assert_eq!(req["method"], "m");
            let note: Value = serde_json::from_str(&next(&mut out).await).unwrap();
            assert_eq!(note["method"], "n", "in the order queued");
        }
    }

    #[tokio::test]
    async fn a_lane_request_leaves_behind_what_was_queued_before_it() {
        let (peer, _owner, frames, mut out) = peer();
        let (req, answer) = peer.lane_request("ask", None);
        peer.try_send_raw("update".into()).unwrap();
        peer.try_request(req).unwrap();
        assert_eq!(next(&mut out).await, "update");
        let sent: Value = serde_json::from_str(&next(&mut out).await).unwrap();
        assert_eq!(sent["method"], "ask");
        let reply = format!(r#"{{"jsonrpc":"2.0","id":{},"result":5}}"#, sent["id"]);
        frames.send(InFrame::Text(reply)).await.unwrap();
        assert_eq!(answer.wait().await.unwrap(), Value::from(5));
    }

    #[tokio::test]
    async fn a_lane_request_withdrawn_before_it_leaves_is_never_sent() {
        let (peer, _owner, _frames, mut out) = peer();
        let (req, answer) = peer.lane_request("ask", None);
        drop(answer);
        peer.try_request(req).unwrap();
        peer.try_send_raw("after".into()).unwrap();
        // Neither the request nor a `$/cancel_request` for it.
        assert_eq!(next(&mut out).await, "after");
        assert!(
            timeout(Duration::from_millis(50), out.recv())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn an_answer_for_another_link_goes_to_that_link() {
        let (a, mut a_owner, a_frames, mut a_out) = peer();
        let (b, _b_owner, _b_frames, mut b_out) = peer();
        let request = r#"{"jsonrpc":"2.0","id":"q","method":"m"}"#;
        a_frames.send(InFrame::Text(request.into())).await.unwrap();
        let Some(Incoming::Request(req)) = a_owner.recv().await else {
            panic!("no request")
        };
        b.try_respond(req.responder, Ok(Value::Null)).unwrap();
        assert_eq!(
            next(&mut a_out).await,
            r#"{"jsonrpc":"2.0","id":"q","result":null}"#
        );
        assert!(
            timeout(Duration::from_millis(50), b_out.recv())
                .await
                .is_err()
        );
        assert_eq!((a.taken(), b.taken()), (0, 0));
    }
}

//! Forwarding: a request that came over another link, passed on over this one, whose answer
//! this peer's task hands straight to the asker's link. A relayed call then needs no task of
//! its own to wait for the answer: the asker's connection sends it and moves on.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tokio::sync::mpsc;

#[cfg(test)]
use super::OutFrame;
use super::{Command, PeerError, PeerHandle, Reply, Responder, ResponseError, Slot};

/// How a failure of the forwarded request reads to the asker (the owner's error mapping).
pub type MapError = Arc<dyn Fn(PeerError) -> ResponseError + Send + Sync>;

/// The asker's side of a forwarded request: who to answer, how to word a failure, and what
/// to hold until then.
pub struct Forward {
    responder: Responder,
    map_err: MapError,
    /// What the asker keeps while the call is out (a permit of its in-flight bound, what keeps
    /// the callee running): dropped once the answer is queued.
    _hold: Box<dyn Send>,
}

impl Forward {
    pub fn new(responder: Responder, map_err: MapError, hold: impl Send + 'static) -> Self {
        Forward {
            responder,
            map_err,
            _hold: Box::new(hold),
        }
    }

    /// Answers the asker without waiting (its link's queue, or a task of that link when full).
    pub(super) fn answer(self, result: Result<Value, PeerError>) {
        let result = result.map_err(|e| (self.map_err)(e));
        self.responder.respond_now(result);
    }
}

/// A forward this link's queue could not take at once: `send` waits for room.
pub struct PendingForward {
    slot: Slot,
    tx: mpsc::Sender<Slot>,
}

impl PendingForward {
    /// Queues the request once there is room; a link that closes first answers the asker
    /// `Disconnected` (through its error mapping).
    pub async fn send(self) {
        if let Err(mpsc::error::SendError(slot)) = self.tx.send(self.slot).await {
            disconnected(slot.into());
        }
    }
}

/// Answers the asker of `cmd`, if it is a forward, that the link is gone.
pub(super) fn disconnected(cmd: Command) {
    if let Command::Request {
        reply: Reply::Forward(f),
        ..
    } = cmd
    {
        f.answer(Err(PeerError::Disconnected));
    }
}

impl PeerHandle {
    /// Sends a request whose answer goes straight to `forward`'s asker, from this peer's
    /// task. Never waits: a full queue hands the request back to be sent from a task; a
    /// closed link answers the asker at once.
    pub fn try_forward(
        &self,
        method: &str,
        params: Option<Value>,
        forward: Forward,
    ) -> Result<(), PendingForward> {
        let cmd = Command::Request {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            method: method.to_owned(),
            params,
            reply: Reply::Forward(Box::new(forward)),
        };
        match self.tx.try_send(cmd.into()) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(slot)) => Err(PendingForward {
                slot,
                tx: self.tx.clone(),
            }),
            Err(mpsc::error::TrySendError::Closed(slot)) => {
                disconnected(slot.into());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::Semaphore;
    use tokio::time::timeout;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::peer::{InFrame, Incoming, Link, spawn};

    struct Side {
        peer: PeerHandle,
        owner: mpsc::Receiver<Incoming>,
        frames: mpsc::Sender<InFrame>,
        out: mpsc::Receiver<OutFrame>,
    }

    fn side() -> Side {
        let (frames, incoming) = mpsc::channel(8);
        let (outgoing, out) = mpsc::channel(8);
        let (peer, owner, _task) = spawn(Link { incoming, outgoing }, CancellationToken::new());
        Side {
            peer,
            owner,
            frames,
            out,
        }
    }

    async fn next(out: &mut mpsc::Receiver<OutFrame>) -> String {
        timeout(Duration::from_secs(5), out.recv())
            .await
            .unwrap()
            .unwrap()
            .into_string()
    }

    /// A client's request, as the client's peer hands it to its owner.
    async fn asked(client: &mut Side, frame: &str) -> Responder {
        client
            .frames
            .send(InFrame::Text(frame.into()))
            .await
            .unwrap();
        match client.owner.recv().await {
            Some(Incoming::Request(r)) => r.responder,
            _ => panic!("no request"),
        }
    }

    fn worded() -> MapError {
        Arc::new(|e| ResponseError::internal(format!("agent: {e}")))
    }

    #[tokio::test]
    async fn the_answer_goes_to_the_asker_with_its_own_id() {
        let (mut client, mut agent) = (side(), side());
        let responder = asked(
            &mut client,
            r#"{"jsonrpc":"2.0","id":"c1","method":"_x/echo","params":{"n":1}}"#,
        )
        .await;
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().unwrap();
        let fwd = Forward::new(responder, worded(), permit);
        assert!(
            agent
                .peer
                .try_forward("_x/echo", Some(serde_json::json!({"n": 1})), fwd)
                .is_ok()
        );
        let sent: Value = serde_json::from_str(&next(&mut agent.out).await).unwrap();
        assert_eq!(sent["method"], "_x/echo");
        assert_eq!(permits.available_permits(), 0, "held while the call is out");
        let reply = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"n":1}}}}"#,
            sent["id"]
        );
        agent.frames.send(InFrame::Text(reply)).await.unwrap();
        assert_eq!(
            next(&mut client.out).await,
            r#"{"jsonrpc":"2.0","id":"c1","result":{"n":1}}"#
        );
        assert_eq!(permits.available_permits(), 1, "released with the answer");
    }

    #[tokio::test]
    async fn errors_are_worded_by_the_asker_and_a_closed_link_still_answers() {
        let (mut client, mut agent) = (side(), side());
        let r1 = asked(&mut client, r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).await;
        let r2 = asked(&mut client, r#"{"jsonrpc":"2.0","id":2,"method":"m"}"#).await;
        agent
            .peer
            .try_forward("m", None, Forward::new(r1, worded(), ()))
            .ok()
            .unwrap();
        agent
            .peer
            .try_forward("m", None, Forward::new(r2, worded(), ()))
            .ok()
            .unwrap();
        let first: Value = serde_json::from_str(&next(&mut agent.out).await).unwrap();
        let _second = next(&mut agent.out).await;
        let reply = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32000,"message":"no"}}}}"#,
            first["id"]
        );
        agent.frames.send(InFrame::Text(reply)).await.unwrap();
        let a: Value = serde_json::from_str(&next(&mut client.out).await).unwrap();
        assert_eq!(a["id"], 1);
        let worded = a["error"]["message"].as_str().unwrap();
        assert!(worded.contains("agent: "), "{a}");
        // The agent's link closes with the second call unanswered.
        drop(agent.frames);
        let b: Value = serde_json::from_str(&next(&mut client.out).await).unwrap();
        assert_eq!(b["id"], 2);
        assert!(b["error"]["message"].as_str().unwrap().contains("closed"));
    }

    #[tokio::test]
    async fn a_peer_is_closed_before_its_pending_calls_hear_of_it() {
        let (mut client, mut agent) = (side(), side());
        let r = asked(&mut client, r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#).await;
        // The asker's wording runs when the call is answered: it records whether the peer
        // already says it is closed then, as the connection asking again would see it.
        let closed = agent.peer.closed();
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let saw = seen.clone();
        let word: MapError = Arc::new(move |e| {
            saw.store(closed.is_cancelled(), std::sync::atomic::Ordering::SeqCst);
            ResponseError::internal(format!("agent: {e}"))
        });
        agent
            .peer
            .try_forward("m", None, Forward::new(r, word, ()))
            .ok()
            .unwrap();
        let _sent = next(&mut agent.out).await;
        drop(agent.frames);
        let a: Value = serde_json::from_str(&next(&mut client.out).await).unwrap();
        assert_eq!(a["id"], 1);
        assert!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            "the call heard of the closed link before the peer said it was closed"
        );
    }
}

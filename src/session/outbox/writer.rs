//! What the outbox knows of one attached connection: where it is in the journal, and the
//! lag (fed from the journal) when its queue filled. Its queue is its link's own: messages go
//! straight into the connection's `Peer` (`PeerHandle::try_send_raw`), which writes them to
//! the link in order; no task of the session's sits in between.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::Client;
use acpd_wire::{Answer, LaneRequest, Responder, ResponseError};

/// Most messages (answers, agent requests, presence) held for one lagging client.
pub(super) const HELD_LIMIT: usize = 4096;

/// What a client is sent, in order.
pub(super) enum ClientOut {
    Raw(Arc<str>),
    /// Boxed (the large variant): as `try_respond` hands it back when the queue is full.
    Reply(Answer),
    /// An agent's request relayed to the client: in the same queue as its updates, so it
    /// never overtakes one the agent sent before it.
    Request(Box<LaneRequest>),
}

/// One attached client. Its messages queue on its connection's peer, which sends them even
/// after the client is detached (a close or delete answer may be last).
pub(super) struct Writer {
    pub client: Client,
    pub sent_upto: i64,
    /// Set while the client is fed from the journal instead of live. Boxed: a lag is rare and
    /// big (~300 bytes), and every live session holds a `Writer` per client.
    pub lag: Option<Box<Lag>>,
}

pub(super) struct Lag {
    /// `PeerHandle::taken` when last looked at, and when it last moved.
    pub taken: u64,
    pub moved_at: Instant,
    /// A journal page is being read for this client.
    pub reading: bool,
    /// `flushed_upto` when that read started: the journal had every entry up to it.
    pub read_upto: i64,
    /// Non-journal messages for the client, in order, each after the updates up to its seq.
    pub held: VecDeque<(i64, ClientOut)>,
    /// An attach replay: catch-up ignores the bootstrap hold until the answer, held behind
    /// the replay up to this seq, is out; then the hold starts.
    pub replay: Option<(i64, Duration)>,
    /// A `session/load` replay is formed (messages merged, the state after the history)
    /// until its answer is out; other catch-up is exact per seq.
    pub form: Option<crate::session::compaction::Replay>,
    /// Counts this lag in `acpd_clients_catching_up` for as long as it lasts, however it ends.
    _counted: Counted,
}

/// Why a client is fed from the journal: the `cause` label of `acpd_client_catch_ups_total`.
#[derive(Clone, Copy)]
pub(super) enum Cause {
    /// An attach (load, resume, attach) has journal entries to replay to it.
    Attach,
    /// Its connection's queue filled.
    Behind,
}

struct Counted;

impl Counted {
    fn new(cause: Cause) -> Counted {
        let cause = match cause {
            Cause::Attach => "attach",
            Cause::Behind => "behind",
        };
        metrics::counter!(crate::metrics::CLIENT_CATCH_UPS_TOTAL, "cause" => cause).increment(1);
        metrics::gauge!(crate::metrics::CLIENTS_CATCHING_UP).increment(1);
        Counted
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::CLIENTS_CATCHING_UP).decrement(1);
    }
}

/// A client the outbox starts sending to, having been sent everything up to `sent_upto`.
pub(super) fn new(client: Client, sent_upto: i64) -> Writer {
    Writer {
        client,
        sent_upto,
        lag: None,
    }
}

impl Writer {
    /// Queues on the client's connection without waiting (see `queue`).
    pub fn queue(&self, out: ClientOut) -> Result<(), ClientOut> {
        queue(&self.client, out)
    }

    /// The client's lag, started now unless one is under way (what it holds stays held).
    pub fn start_lag(&mut self, cause: Cause) -> &mut Lag {
        let (conn, seq, taken) = (&self.client.conn, self.sent_upto, self.client.peer.taken());
        self.lag.get_or_insert_with(|| {
            // Counted before it is logged: whoever reads the log finds it counted.
            let counted = Counted::new(cause);
            tracing::info!(conn = %conn, seq, "client lags; feeding it from the journal");
            Box::new(Lag {
                _counted: counted,
                taken,
                moved_at: Instant::now(),
                reading: false,
                read_upto: 0,
                held: VecDeque::new(),
                replay: None,
                form: None,
            })
        })
    }

    /// Queues a message that is not journaled, or holds it (in order) while the client lags.
    /// A lagging client with `HELD_LIMIT` messages held is cut off, as one that stopped
    /// reading is: its connection ends, it detaches, and it can reload from the journal.
    pub fn send_or_hold(&mut self, upto: i64, out: ClientOut) {
        if let Some(lag) = &mut self.lag {
            if lag.held.len() >= HELD_LIMIT {
                if !self.client.peer.is_closed() {
                    tracing::warn!(conn = %self.client.conn, "client lags with too many messages held for it; disconnecting it (it can reload from the journal)");
                }
                self.client.peer.close();
                return;
            }
            lag.held.push_back((upto, out));
        } else if let Err(out) = self.queue(out) {
            self.start_lag(Cause::Behind).held.push_back((upto, out));
        }
    }

    /// A load's replay has been sent the whole history: the session's state follows it,
    /// once, right before the answer (held behind the replay).
    pub fn state_after_replay(&mut self) {
        let Some(lag) = self.lag.as_mut() else { return };
        let Some((at, _)) = lag.replay.filter(|(at, _)| self.sent_upto >= *at) else {
            return;
        };
        let Some(mut form) = lag.form.take() else {
            return;
        };
        let from = lag.held.iter().position(|(u, _)| *u >= at);
        let from = from.unwrap_or(lag.held.len());
        for (pos, e) in (from..).zip(form.state()) {
            lag.held.insert(pos, (at, ClientOut::Raw(e.body)));
        }
    }

    /// Queues the held messages whose updates the client has been sent.
    pub fn release_held(&mut self) {
        let Some(lag) = &mut self.lag else { return };
        while let Some((upto, _)) = lag.held.front() {
            if *upto > self.sent_upto {
                break;
            }
            let Some((upto, out)) = lag.held.pop_front() else {
                break;
            };
            if let Err(out) = queue(&self.client, out) {
                lag.held.push_front((upto, out));
                break;
            }
        }
    }
}

pub(super) fn reply(responder: Responder, result: Result<Value, ResponseError>) -> ClientOut {
    ClientOut::Reply(Box::new((responder, result)))
}

/// Queues on the client's connection without waiting; hands the message back when that queue
/// is full (by count or bytes). A closed connection counts as sent: the Detach command follows.
fn queue(client: &Client, out: ClientOut) -> Result<(), ClientOut> {
    match out {
        ClientOut::Raw(text) => client.peer.try_send_raw(text).map_err(ClientOut::Raw),
        ClientOut::Reply(reply) => {
            let (responder, result) = *reply;
            client
                .peer
                .try_respond(responder, result)
                .map_err(ClientOut::Reply)
        }
        ClientOut::Request(req) => client
            .peer
            .try_request(*req)
            .map_err(|r| ClientOut::Request(Box::new(r))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::session::roles::Role;
    use acpd_wire::Link;

    #[tokio::test]
    async fn a_lagging_client_with_too_much_held_is_cut_off() {
        let (_frames, incoming) = mpsc::channel(8);
        let (outgoing, _out) = mpsc::channel(1);
        let (peer, _owner, _task) =
            acpd_wire::spawn(Link { incoming, outgoing }, CancellationToken::new());
        let client = Client {
            conn: "c1".into(),
            peer: peer.clone(),
            init: Arc::new(json!({})),
            role: Role::Controller,
            principal: "p".into(),
            principal_name: "p".into(),
            mcp_tunnel: false,
        };
        let mut w = new(client, 0);
        w.start_lag(Cause::Behind);
        for _ in 0..HELD_LIMIT + 10 {
            w.send_or_hold(1, ClientOut::Raw("x".into()));
        }
        assert_eq!(w.lag.as_ref().map(|l| l.held.len()), Some(HELD_LIMIT));
        tokio::time::timeout(Duration::from_secs(5), peer.closed().cancelled())
            .await
            .expect("the client's connection is closed");
    }
}

//! One connection's writer task and what the outbox knows of it: its bounded queue, the
//! counters the task keeps, and the lag (fed from the journal) when the queue filled.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::Client;
use acpd_wire::{Responder, ResponseError};

/// Messages queued for one client before it counts as too slow and is disconnected.
pub(super) const CLIENT_QUEUE: usize = 32_768;
/// Bytes queued for one client before it counts as too slow.
pub(super) const CLIENT_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// Most messages a writer task takes off its queue at once.
const WRITER_BURST: usize = 128;

/// What a client's writer task sends, in order.
pub(super) enum ClientOut {
    Raw(Arc<str>),
    /// Boxed: it is the large variant, and full queues hand messages back by value.
    Reply(Box<(Responder, Result<Value, ResponseError>)>),
}

/// One attached client and its writer task. Dropping it closes the queue: the task sends
/// what is queued (a close or delete answer may be last) and ends; if the connection is gone
/// it ends at the first failed send.
pub(super) struct Writer {
    pub client: Client,
    pub sent_upto: i64,
    pub tx: mpsc::Sender<ClientOut>,
    /// Counters the writer task updates; only their bounds and movement matter.
    pub progress: Arc<Progress>,
    /// Set while the client is fed from the journal instead of live.
    pub lag: Option<Lag>,
}

#[derive(Default)]
pub(super) struct Progress {
    /// Bytes queued and not yet handed to the connection.
    pub queued: AtomicUsize,
    /// Messages handed to the connection so far.
    pub handed: AtomicU64,
}

pub(super) struct Lag {
    /// `progress.handed` when last looked at, and when it last moved.
    pub handed: u64,
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
}

/// Starts the writer task of one connection.
pub(super) fn spawn(tasks: &TaskTracker, client: Client, sent_upto: i64) -> Writer {
    let (tx, mut rx) = mpsc::channel(CLIENT_QUEUE);
    let peer = client.peer.clone();
    let progress = Arc::new(Progress::default());
    let p = progress.clone();
    tasks.spawn(async move {
        // Taken a burst at a time: one wake-up of this task per burst of updates. Each is
        // handed to the peer on its own, so the peer's bounded queue is what holds a stuck
        // client's backlog in place (a batch per command would multiply its bound).
        let mut burst = Vec::with_capacity(WRITER_BURST);
        'run: while rx.recv_many(&mut burst, WRITER_BURST).await > 0 {
            for out in burst.drain(..) {
                match out {
                    ClientOut::Raw(text) => {
                        let n = text.len();
                        let ok = peer.send_raw(String::from(&*text)).await.is_ok();
                        p.queued.fetch_sub(n, Ordering::Relaxed);
                        if !ok {
                            break 'run;
                        }
                    }
                    ClientOut::Reply(reply) => {
                        let (responder, result) = *reply;
                        responder.respond(result).await
                    }
                }
                p.handed.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Writer {
        client,
        sent_upto,
        tx,
        progress,
        lag: None,
    }
}

impl Writer {
    pub fn start_lag(&mut self) -> &mut Lag {
        tracing::info!(conn = %self.client.conn, seq = self.sent_upto, "client lags; feeding it from the journal");
        self.lag.insert(Lag {
            handed: self.progress.handed.load(Ordering::Relaxed),
            moved_at: Instant::now(),
            reading: false,
            read_upto: 0,
            held: VecDeque::new(),
            replay: None,
        })
    }

    /// Queues a message that is not journaled, or holds it (in order) while the client lags.
    pub fn send_or_hold(&mut self, upto: i64, out: ClientOut) {
        if let Some(lag) = &mut self.lag {
            lag.held.push_back((upto, out));
        } else if let Err(out) = queue_out(&self.tx, &self.progress, out) {
            self.start_lag().held.push_back((upto, out));
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
            if let Err(out) = queue_out(&self.tx, &self.progress, out) {
                lag.held.push_front((upto, out));
                break;
            }
        }
    }
}

pub(super) fn reply(responder: Responder, result: Result<Value, ResponseError>) -> ClientOut {
    ClientOut::Reply(Box::new((responder, result)))
}

/// Queues without waiting unless the queue is full (by count or bytes). A closed queue counts
/// as sent: its connection is gone and the Detach command follows.
pub(super) fn queue_out(
    tx: &mpsc::Sender<ClientOut>,
    p: &Progress,
    out: ClientOut,
) -> Result<(), ClientOut> {
    let n = match &out {
        ClientOut::Raw(t) => t.len(),
        ClientOut::Reply(..) => 0,
    };
    if p.queued.load(Ordering::Relaxed) + n > CLIENT_QUEUE_BYTES {
        return Err(out);
    }
    match tx.try_send(out) {
        Ok(()) => {
            p.queued.fetch_add(n, Ordering::Relaxed);
            Ok(())
        }
        Err(mpsc::error::TrySendError::Full(out)) => Err(out),
        Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
    }
}

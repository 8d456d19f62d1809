//! WebSocket transport per the ACP "Streamable HTTP & WebSocket" RFD: one JSON-RPC message
//! per text frame, binary frames ignored, pings answered, a close frame on shutdown.

use std::ops::ControlFlow;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use acpd_wire::{InFrame, Link};

/// Why the server closed a socket; the close frame carries it.
#[derive(Debug, Clone)]
pub struct CloseReason {
    pub code: u16,
    pub reason: &'static str,
}

impl CloseReason {
    pub const CUT_OFF: CloseReason = CloseReason {
        code: close_code::POLICY,
        reason: "closed by acpd (client too slow, or access revoked); reconnect and reload",
    };
    pub const SHUTDOWN: CloseReason = CloseReason {
        code: close_code::AWAY,
        reason: "acpd is shutting down; reconnect later",
    };
    /// A frame far over `max_message_bytes` (tungstenite refused to read it).
    pub const TOO_BIG: CloseReason = CloseReason {
        code: close_code::SIZE,
        reason: "message too big for acpd's max_message_bytes",
    };
}

/// Whether a read error is tungstenite's size limit (`Error::Capacity`, which axum wraps
/// without exposing the type: its text is the only handle, "Space limit exceeded: …").
pub(crate) fn is_too_big(e: &axum::Error) -> bool {
    e.to_string().contains("Space limit exceeded")
}

/// Runs the pump for one upgraded socket. Returns the link for the peer and the pump's future.
/// Text frames over `max_message_bytes` are reported as `InFrame::TooLarge`, not read.
///
/// The server pings every `keepalive`. A frame read is held until the link has room for it and
/// only then is the next one read; writes, pings and the close frame never wait for that. A
/// write the client takes no bytes of for `write_deadline(keepalive)` ends the socket.
pub fn pump(
    socket: WebSocket,
    max_message_bytes: usize,
    keepalive: Duration,
    cancel: CancellationToken,
) -> (Link, impl Future<Output = ()> + Send) {
    let (in_tx, in_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<acpd_wire::OutFrame>(acpd_wire::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let deadline = super::write_deadline(keepalive);
    let fut = async move {
        let (mut sink, mut stream) = socket.split();
        let mut ping = tokio::time::interval(keepalive);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        // `None` once the client said goodbye or the connection stopped reading; writing goes
        // on until acpd's side is done.
        let mut in_tx = Some(in_tx);
        let mut input = Input {
            done: false,
            client_left: false,
            held: None,
        };
        // Looked up once: a registry lookup hashes the name on every call.
        let bytes_in = metrics::counter!(crate::metrics::BYTES_IN_TOTAL);
        let bytes_out = metrics::counter!(crate::metrics::BYTES_OUT_TOTAL);
        let close = loop {
            if input.done {
                in_tx = None;
            }
            let step = tokio::select! {
                _ = cancel.cancelled() => ControlFlow::Break(End::Close(Some(CloseReason::SHUTDOWN))),
                permit = reserve(in_tx.as_ref()), if input.held.is_some() => {
                    input.on_room(permit)
                }
                msg = stream.next(), if in_tx.is_some() && input.held.is_none() => {
                    input.on_read(msg, max_message_bytes, &bytes_in)
                }
                out = out_rx.recv() => match out {
                    Some(text) => {
                        write_out(&mut sink, text, &mut out_rx, &bytes_out, deadline, &cancel).await
                    }
                    None => ControlFlow::Break(End::Close(Some(link_ended(&cancel, input.client_left)))),
                },
                _ = ping.tick() => on_ping(&mut sink, deadline).await,
            };
            match step {
                ControlFlow::Continue(()) => {}
                ControlFlow::Break(End::Close(close)) => break close,
                ControlFlow::Break(End::Abandon) => return,
            }
        };
        // Bounded: a client that takes no bytes cannot hold the pump (or the drain) here.
        let goodbye = async {
            match close {
                Some(r) => goodbye(&mut sink, &mut stream, r).await,
                None => {
                    let _ = sink.close().await;
                }
            }
        };
        let _ = tokio::time::timeout(deadline.min(CLOSE_WAIT), goodbye).await;
    };
    (link, fut)
}

/// Why a pump ends: with a close frame (`None`: the socket failed, only the closing handshake
/// is tried), or abandoned (a write deadline passed: the client takes no bytes).
enum End {
    Close(Option<CloseReason>),
    Abandon,
}

type Step = ControlFlow<End>;

/// The pump's input side.
struct Input {
    /// The client said goodbye or the connection stopped reading: nothing more is read.
    done: bool,
    client_left: bool,
    /// A frame read but not yet taken by the link: while it waits, nothing more is read.
    held: Option<InFrame>,
}

impl Input {
    /// Room in the link for the held frame.
    fn on_room(&mut self, permit: Option<mpsc::Permit<'_, InFrame>>) -> Step {
        match permit {
            Some(p) => {
                if let Some(f) = self.held.take() {
                    p.send(f)
                }
            }
            // The connection is gone; what it still queued is written, then the close.
            None => {
                self.held = None;
                self.done = true;
            }
        }
        ControlFlow::Continue(())
    }

    fn on_read(
        &mut self,
        msg: Option<Result<Message, axum::Error>>,
        max_message_bytes: usize,
        bytes_in: &metrics::Counter,
    ) -> Step {
        match msg {
            Some(Ok(Message::Text(t))) if t.len() > max_message_bytes => {
                bytes_in.increment(t.len() as u64);
                self.held = Some(InFrame::TooLarge(t.len()));
            }
            Some(Ok(Message::Text(t))) => {
                bytes_in.increment(t.len() as u64);
                self.held = Some(InFrame::Text(t.to_string()));
            }
            Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Close(_))) | None => {
                self.done = true;
                self.client_left = true;
            }
            Some(Err(e)) if is_too_big(&e) => {
                tracing::info!(error = %e, "websocket frame over the size limit; closing");
                return ControlFlow::Break(End::Close(Some(CloseReason::TOO_BIG)));
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "websocket read failed");
                return ControlFlow::Break(End::Close(None));
            }
        }
        ControlFlow::Continue(())
    }
}

/// Writes `text` and the burst queued behind it, within the write deadline.
async fn write_out(
    sink: &mut SplitSink<WebSocket, Message>,
    text: acpd_wire::OutFrame,
    out_rx: &mut mpsc::Receiver<acpd_wire::OutFrame>,
    bytes_out: &metrics::Counter,
    deadline: Duration,
    cancel: &CancellationToken,
) -> Step {
    let write = tokio::time::timeout(deadline, write_burst(sink, text, out_rx, bytes_out));
    let written = tokio::select! {
        _ = cancel.cancelled() => return ControlFlow::Break(End::Close(Some(CloseReason::SHUTDOWN))),
        w = write => w,
    };
    match written {
        Ok(Ok(())) => ControlFlow::Continue(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "websocket write failed");
            ControlFlow::Break(End::Close(None))
        }
        Err(_) => {
            tracing::info!(
                ?deadline,
                "websocket write deadline passed (the client takes no bytes); closing"
            );
            ControlFlow::Break(End::Abandon)
        }
    }
}

/// The link ended on acpd's side: shutting down, or the client was cut off (too slow, token
/// revoked) while it was still there.
fn link_ended(cancel: &CancellationToken, client_left: bool) -> CloseReason {
    if cancel.is_cancelled() {
        CloseReason::SHUTDOWN
    } else if !client_left {
        CloseReason::CUT_OFF
    } else {
        CloseReason {
            code: close_code::NORMAL,
            reason: "",
        }
    }
}

async fn on_ping(sink: &mut SplitSink<WebSocket, Message>, deadline: Duration) -> Step {
    let sent = tokio::time::timeout(deadline, sink.send(Message::Ping(Default::default())));
    match sent.await {
        Ok(Ok(())) => ControlFlow::Continue(()),
        Ok(Err(_)) => ControlFlow::Break(End::Close(None)),
        Err(_) => {
            tracing::info!(
                ?deadline,
                "websocket write deadline passed on a ping (the client takes no bytes); closing"
            );
            ControlFlow::Break(End::Abandon)
        }
    }
}

/// Sends `r`'s close frame, reads what the client still sends until its own (`linger`), and
/// closes the write half (here and on resumable links). Callers bound it.
pub(super) async fn goodbye(
    sink: &mut SplitSink<WebSocket, Message>,
    stream: &mut SplitStream<WebSocket>,
    r: CloseReason,
) {
    let frame = CloseFrame {
        code: r.code,
        reason: r.reason.into(),
    };
    let _ = sink.send(Message::Close(Some(frame))).await;
    linger(stream).await;
    let _ = sink.close().await;
}

/// A lingering close, after acpd's close frame went out: what the client still sends is read
/// and dropped until its own close frame (or EOF). A socket closed with unread input is reset
/// by the kernel, and the reset can throw away our close frame before the client has read it
/// (a flooding client saw the socket end with no close frame). Callers bound it.
pub(super) async fn linger(stream: &mut SplitStream<WebSocket>) {
    while let Some(Ok(m)) = stream.next().await {
        if matches!(m, Message::Close(_)) {
            break;
        }
    }
}

/// Longest wait for the close frame to go out and the client's to come back.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Room in `tx` for one frame; `None` when the receiver is gone. Never ready without a sender.
async fn reserve(tx: Option<&mpsc::Sender<InFrame>>) -> Option<mpsc::Permit<'_, InFrame>> {
    match tx {
        Some(tx) => tx.reserve().await.ok(),
        None => std::future::pending().await,
    }
}

/// Most frames written before one flush (here and on resumable links).
pub(super) const BURST: usize = 64;

/// Writes `first` and whatever else is already queued (up to `BURST` frames), then flushes
/// once: a streaming turn costs one socket write per burst, not one per update.
async fn write_burst<S>(
    sink: &mut S,
    first: acpd_wire::OutFrame,
    queue: &mut mpsc::Receiver<acpd_wire::OutFrame>,
    bytes_out: &metrics::Counter,
) -> Result<(), S::Error>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let mut next = Some(first);
    let mut n = 0;
    while let Some(text) = next {
        bytes_out.increment(text.len() as u64);
        sink.feed(Message::Text(text.into_string().into())).await?;
        n += 1;
        next = if n < BURST {
            queue.try_recv().ok()
        } else {
            None
        };
    }
    sink.flush().await
}

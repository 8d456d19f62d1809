//! WebSocket transport per the ACP "Streamable HTTP & WebSocket" RFD: one JSON-RPC message
//! per text frame, binary frames ignored, pings answered, a close frame on shutdown.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use acpd_wire::{InFrame, Link};

/// How often the server pings an idle socket, so proxies keep it and dead peers are noticed.
const PING_EVERY: Duration = Duration::from_secs(20);

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
}

/// Runs the pump for one upgraded socket. Returns the link for the peer and the pump's future.
/// Text frames over `max_message_bytes` are reported as `InFrame::TooLarge`, not read.
pub fn pump(
    socket: WebSocket,
    max_message_bytes: usize,
    cancel: CancellationToken,
) -> (Link, impl Future<Output = ()> + Send) {
    let (in_tx, in_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<String>(acpd_wire::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let fut = async move {
        let (mut sink, mut stream) = socket.split();
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        let mut in_tx = Some(in_tx);
        // Looked up once: a registry lookup hashes the name on every call.
        let bytes_in = metrics::counter!(crate::metrics::BYTES_IN_TOTAL);
        let bytes_out = metrics::counter!(crate::metrics::BYTES_OUT_TOTAL);
        let close = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Some(CloseReason::SHUTDOWN),
                msg = stream.next(), if in_tx.is_some() => {
                    let frame = match msg {
                        Some(Ok(Message::Text(t))) if t.len() > max_message_bytes => {
                            bytes_in.increment(t.len() as u64);
                            InFrame::TooLarge(t.len())
                        }
                        Some(Ok(Message::Text(t))) => {
                            bytes_in.increment(t.len() as u64);
                            InFrame::Text(t.to_string())
                        }
                        Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Close(_))) | None => {
                            in_tx = None;
                            continue;
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "websocket read failed");
                            break None;
                        }
                    };
                    if let Some(tx) = &in_tx
                        && tx.send(frame).await.is_err()
                    {
                        break None;
                    }
                }
                out = out_rx.recv() => match out {
                    Some(text) => {
                        if let Err(e) = write_burst(&mut sink, text, &mut out_rx, &bytes_out).await {
                            tracing::debug!(error = %e, "websocket write failed");
                            break None;
                        }
                    }
                    // The link ended on acpd's side: shutting down, or the client was cut off
                    // (too slow, token revoked) while it was still there.
                    None if cancel.is_cancelled() => break Some(CloseReason::SHUTDOWN),
                    None if in_tx.is_some() => break Some(CloseReason::CUT_OFF),
                    None => break Some(CloseReason { code: close_code::NORMAL, reason: "" }),
                },
                _ = ping.tick() => {
                    if sink.send(Message::Ping(Default::default())).await.is_err() {
                        break None;
                    }
                }
            }
        };
        if let Some(r) = close {
            let frame = CloseFrame {
                code: r.code,
                reason: r.reason.into(),
            };
            let _ = sink.send(Message::Close(Some(frame))).await;
        }
        let _ = sink.close().await;
    };
    (link, fut)
}

/// Most frames written before one flush (here and on resumable links).
pub(super) const BURST: usize = 64;

/// Writes `first` and whatever else is already queued (up to `BURST` frames), then flushes
/// once: a streaming turn costs one socket write per burst, not one per update.
async fn write_burst<S>(
    sink: &mut S,
    first: String,
    queue: &mut mpsc::Receiver<String>,
    bytes_out: &metrics::Counter,
) -> Result<(), S::Error>
where
    S: futures_util::Sink<Message> + Unpin,
{
    let mut next = Some(first);
    let mut n = 0;
    while let Some(text) = next {
        bytes_out.increment(text.len() as u64);
        sink.feed(Message::Text(text.into())).await?;
        n += 1;
        next = if n < BURST {
            queue.try_recv().ok()
        } else {
            None
        };
    }
    sink.flush().await
}

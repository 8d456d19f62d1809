//! Newline-delimited JSON-RPC over any byte stream: raw TCP, and stdio for `acpd stdio`.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::jsonrpc::{InFrame, Link};

/// Runs the pump for one line stream; returns the link for the peer and the pump's future,
/// which ends when either side closes or `cancel` fires.
pub fn pump<R, W>(
    reader: R,
    writer: W,
    max_message_bytes: usize,
    cancel: CancellationToken,
) -> (Link, impl Future<Output = ()> + Send)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (in_tx, in_rx) = mpsc::channel(super::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<String>(super::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let fut = async move {
        let mut lines = FramedRead::new(reader, LinesCodec::new_with_max_length(max_message_bytes));
        let mut sink = FramedWrite::new(writer, LinesCodec::new());
        // Dropped at end of input, which tells the peer; writing goes on until it is done.
        let mut in_tx = Some(in_tx);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                line = lines.next(), if in_tx.is_some() => {
                    let frame = match line {
                        Some(Ok(l)) if l.trim().is_empty() => continue,
                        Some(Ok(l)) => InFrame::Text(l),
                        // The codec skips the rest of an overlong line and carries on.
                        Some(Err(LinesCodecError::MaxLineLengthExceeded)) => InFrame::TooLarge(max_message_bytes + 1),
                        Some(Err(LinesCodecError::Io(e))) => {
                            tracing::debug!(error = %e, "line transport read failed");
                            in_tx = None;
                            continue;
                        }
                        None => {
                            in_tx = None;
                            continue;
                        }
                    };
                    if let Some(tx) = &in_tx
                        && tx.send(frame).await.is_err()
                    {
                        break;
                    }
                }
                out = out_rx.recv() => match out {
                    Some(text) => {
                        if let Err(e) = sink.send(text).await {
                            tracing::debug!(error = %e, "line transport write failed");
                            break;
                        }
                    }
                    // The peer is done: everything it wanted written has been written.
                    None => break,
                },
            }
        }
        let _ = SinkExt::<String>::flush(&mut sink).await;
    };
    (link, fut)
}

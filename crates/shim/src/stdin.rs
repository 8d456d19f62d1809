//! What the shim reads from the editor: newline-delimited lines through the daemon's own
//! decoder, handed to the loop one by one.

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use acpd_wire::lines::{Line, LineDecoder};

/// Editor lines to the loop, bad ones included (the loop answers them); ends (dropping `tx`)
/// at end of input. The daemon's own decoder: an overlong or non-UTF-8 line is one item, and
/// the stream goes on after it.
pub async fn read_stdin(tx: mpsc::Sender<Line>, max_line: usize, cancel: CancellationToken) {
    let mut lines = FramedRead::new(tokio::io::stdin(), LineDecoder::new(max_line));
    loop {
        let line = tokio::select! {
            _ = cancel.cancelled() => return,
            l = lines.next() => l,
        };
        match line {
            Some(Ok(l)) => {
                if tx.send(l).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "stdin read failed");
                return;
            }
            None => return,
        }
    }
}

//! What the shim reads from the editor: newline-delimited lines through the daemon's own
//! decoder, handed to the loop one by one.

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::pipe;
use acpd_wire::lines::{Line, LineDecoder};

/// Editor lines to the loop, bad ones included (the loop answers them); ends (dropping `tx`)
/// at end of input. The daemon's own decoder: an overlong or non-UTF-8 line is one item, and
/// the stream goes on after it.
pub async fn read_stdin(tx: mpsc::Sender<Line>, max_line: usize, cancel: CancellationToken) {
    let mut lines = FramedRead::new(pipe::stdin(), LineDecoder::new(max_line));
    read_lines(&mut lines, tx, cancel).await;
    pipe::restore_stdin(lines.into_inner());
}

async fn read_lines(
    lines: &mut FramedRead<pipe::Stdin, LineDecoder>,
    tx: mpsc::Sender<Line>,
    cancel: CancellationToken,
) {
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

//! Newline-delimited JSON-RPC over any byte stream: raw TCP, and stdio for `acpd stdio`.

use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, FramedRead, FramedWrite, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::{InFrame, Link, OutFrame};

/// Runs the pump for one line stream without a write deadline (`acpd stdio`, a login's
/// agent); see `pump_with`. A hosted agent's pipes get a long one.
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
    pump_with(reader, writer, max_message_bytes, None, cancel)
}

/// Runs the pump for one line stream; returns the link for the peer and the pump's future,
/// which ends when either side closes, `cancel` fires, or (with `write_deadline`) one write
/// takes no bytes for that long.
///
/// Reading and writing never wait on each other: a line read is held until the link has room
/// for it, and only then is the next one read, while writes go on. A peer that is slow to take
/// what it is sent therefore pauses reading, never writing (a cycle of full queues through the
/// connection could otherwise stop both).
// long: the one loop of the hot path (read, split, write, flush) kept whole so that every
// await of a message's way through it is visible at once; its pieces share the buffers.
pub fn pump_with<R, W>(
    reader: R,
    writer: W,
    max_message_bytes: usize,
    write_deadline: Option<Duration>,
    cancel: CancellationToken,
) -> (Link, impl Future<Output = ()> + Send)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (in_tx, in_rx) = mpsc::channel(crate::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<OutFrame>(crate::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let fut = async move {
        let mut lines = FramedRead::new(reader, LineDecoder::new(max_message_bytes));
        let mut sink = FramedWrite::new(writer, LinesCodec::new());
        // Dropped at end of input, which tells the peer; writing goes on until it is done.
        let mut in_tx = Some(in_tx);
        // A line read but not yet taken by the link: while it waits, nothing more is read.
        let mut held: Option<InFrame> = None;
        let mut input_done = false;
        loop {
            if input_done {
                in_tx = None;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                permit = reserve(in_tx.as_ref()), if held.is_some() => match permit {
                    Some(p) => {
                        if let Some(f) = held.take() { p.send(f) }
                        if let Some(tx) = &in_tx {
                            (held, input_done) = read_ready(&mut lines, tx);
                        }
                    }
                    // The peer stopped reading; what it still queued is written.
                    None => {
                        held = None;
                        input_done = true;
                    }
                },
                line = lines.next(), if in_tx.is_some() && held.is_none() => match line {
                    Some(Ok(line)) => {
                        held = Some(line.into());
                        if let Some(tx) = &in_tx && let Ok(p) = tx.try_reserve() {
                            if let Some(f) = held.take() { p.send(f) }
                            (held, input_done) = read_ready(&mut lines, tx);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "line transport read failed");
                        input_done = true;
                    }
                    None => input_done = true,
                },
                out = out_rx.recv() => match out {
                    Some(text) => {
                        let write = within(write_deadline, write_burst(&mut sink, text, &mut out_rx));
                        let written = tokio::select! {
                            _ = cancel.cancelled() => break,
                            w = write => w,
                        };
                        match written {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "line transport write failed");
                                break;
                            }
                            Err(_) => {
                                tracing::info!(deadline = ?write_deadline, "line transport: write deadline passed (peer takes no bytes); closing");
                                return;
                            }
                        }
                    }
                    // The peer is done: everything it wanted written has been written.
                    None => break,
                },
            }
        }
        // Bounded: at shutdown a stuck peer must not hold the drain.
        let last = write_deadline.unwrap_or(FINAL_FLUSH);
        let _ = tokio::time::timeout(last, SinkExt::<OutFrame>::flush(&mut sink)).await;
    };
    (link, fut)
}

/// How long the last flush may take when no write deadline is set.
const FINAL_FLUSH: Duration = Duration::from_secs(5);

/// Most lines written before one flush.
const BURST: usize = 64;

/// Writes `first` and whatever else is already queued (up to `BURST` lines), flushing once.
async fn write_burst<W: AsyncWrite + Unpin>(
    sink: &mut FramedWrite<W, LinesCodec>,
    first: OutFrame,
    queue: &mut mpsc::Receiver<OutFrame>,
) -> Result<(), LinesCodecError> {
    sink.feed(first).await?;
    for _ in 1..BURST {
        match queue.try_recv() {
            Ok(text) => sink.feed(text).await?,
            Err(_) => break,
        }
    }
    SinkExt::<OutFrame>::flush(sink).await
}

/// Hands the link the lines that can be had without waiting (already buffered, or one
/// non-blocking read away), up to `BURST`, while it has room: a burst of an agent's output
/// costs one pass of the pump's loop, not one per line. Returns the line that found no room
/// (held until there is) and whether input ended.
fn read_ready<R: AsyncRead + Unpin>(
    lines: &mut FramedRead<R, LineDecoder>,
    tx: &mpsc::Sender<InFrame>,
) -> (Option<InFrame>, bool) {
    for _ in 0..BURST {
        let frame = match lines.next().now_or_never() {
            Some(Some(Ok(line))) => InFrame::from(line),
            Some(Some(Err(e))) => {
                tracing::debug!(error = %e, "line transport read failed");
                return (None, true);
            }
            Some(None) => return (None, true),
            None => break,
        };
        match tx.try_send(frame) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(f)) => return (Some(f), false),
            Err(mpsc::error::TrySendError::Closed(_)) => return (None, true),
        }
    }
    (None, false)
}

/// `fut` under an optional deadline.
async fn within<F: Future>(
    deadline: Option<Duration>,
    fut: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    match deadline {
        Some(d) => tokio::time::timeout(d, fut).await,
        None => Ok(fut.await),
    }
}

/// Room in `tx` for one frame; `None` when the receiver is gone. Never ready without a sender.
async fn reserve(tx: Option<&mpsc::Sender<InFrame>>) -> Option<mpsc::Permit<'_, InFrame>> {
    match tx {
        Some(tx) => tx.reserve().await.ok(),
        None => std::future::pending().await,
    }
}

/// One line as the decoder reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// A line over the limit, skipped: its size (so far) and its first bytes (up to
    /// `HEAD_BYTES`), enough to find a request id near the start.
    TooLarge {
        size: usize,
        head: Vec<u8>,
    },
    /// A line whose bytes are not UTF-8.
    NotUtf8,
}

impl From<Line> for InFrame {
    fn from(l: Line) -> InFrame {
        match l {
            Line::Text(t) => InFrame::Text(t),
            Line::TooLarge { size, .. } => InFrame::TooLarge(size),
            Line::NotUtf8 => InFrame::NotUtf8,
        }
    }
}

/// How much of an overlong line `Line::TooLarge` keeps.
pub const HEAD_BYTES: usize = 1024;

/// Newline framing that survives bad input: an overlong line is reported once as `TooLarge`
/// and skipped, a line that is not UTF-8 is reported as `NotUtf8`, blank lines are dropped.
/// (`LinesCodec` reports both as errors, and an error ends a `FramedRead`: one bad line
/// used to cost the whole connection.) The daemon's line transports and acp-shim's stdin use it.
pub struct LineDecoder {
    max: usize,
    /// Where to resume the search for `\n` in the buffer.
    searched: usize,
    /// Inside an overlong line: drop bytes up to the next `\n`.
    discarding: bool,
}

impl LineDecoder {
    pub fn new(max: usize) -> LineDecoder {
        LineDecoder {
            max,
            searched: 0,
            discarding: false,
        }
    }

    fn frame(line: &[u8]) -> Option<Line> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(match std::str::from_utf8(line) {
            Ok(text) => Line::Text(text.to_owned()),
            Err(_) => Line::NotUtf8,
        })
    }

    fn too_large(size: usize, line: &[u8]) -> Line {
        Line::TooLarge {
            size,
            head: line[..line.len().min(HEAD_BYTES)].to_vec(),
        }
    }
}

impl Decoder for LineDecoder {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        loop {
            let newline = memchr::memchr(b'\n', &buf[self.searched..]).map(|i| self.searched + i);
            match newline {
                Some(end) => {
                    let line = buf.split_to(end + 1);
                    self.searched = 0;
                    if std::mem::take(&mut self.discarding) {
                        continue;
                    }
                    if end > self.max {
                        return Ok(Some(Self::too_large(end, &line[..end])));
                    }
                    if let Some(frame) = Self::frame(&line[..end]) {
                        return Ok(Some(frame));
                    }
                }
                None if self.discarding => {
                    buf.clear();
                    self.searched = 0;
                    return Ok(None);
                }
                None if buf.len() > self.max => {
                    let seen = buf.len();
                    let line = Self::too_large(seen, buf);
                    buf.advance(seen);
                    self.searched = 0;
                    self.discarding = true;
                    return Ok(Some(line));
                }
                None => {
                    self.searched = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Line>> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        // A last line without its newline still counts.
        let rest = buf.split();
        self.searched = 0;
        if std::mem::take(&mut self.discarding) {
            return Ok(None);
        }
        Ok(Self::frame(&rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(max: usize, input: &[u8]) -> Vec<String> {
        let mut d = LineDecoder::new(max);
        let mut out = Vec::new();
        // Fed in small chunks, as a socket would.
        let mut buf = BytesMut::new();
        for chunk in input.chunks(7) {
            buf.extend_from_slice(chunk);
            while let Some(f) = d.decode(&mut buf).expect("decode") {
                out.push(f);
            }
        }
        while let Some(f) = d.decode_eof(&mut buf).expect("decode_eof") {
            out.push(f);
        }
        out.into_iter()
            .map(|f| match f {
                Line::Text(t) => t,
                Line::TooLarge { head, .. } => {
                    format!("<too large: {}>", String::from_utf8_lossy(&head))
                }
                Line::NotUtf8 => "<not utf-8>".into(),
            })
            .collect()
    }

    #[test]
    fn bad_lines_are_reported_and_the_stream_goes_on() {
        let input = b"one\r\n\n  \n\xff\xfe\n0123456789abcdef0123\ntwo\nlast";
        assert_eq!(
            decode_all(16, input),
            [
                "one",
                "<not utf-8>",
                "<too large: 0123456789abcdef0123>",
                "two",
                "last"
            ]
        );
    }
}

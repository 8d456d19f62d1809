//! Newline-delimited JSON-RPC over any byte stream: raw TCP, and stdio for `acpd stdio`.

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, FramedRead, FramedWrite, LinesCodec};
use tokio_util::sync::CancellationToken;

use crate::{InFrame, Link};

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
    let (in_tx, in_rx) = mpsc::channel(crate::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<String>(crate::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let fut = async move {
        let mut lines = FramedRead::new(reader, LineDecoder::new(max_message_bytes));
        let mut sink = FramedWrite::new(writer, LinesCodec::new());
        // Dropped at end of input, which tells the peer; writing goes on until it is done.
        let mut in_tx = Some(in_tx);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                line = lines.next(), if in_tx.is_some() => {
                    let frame = match line {
                        Some(Ok(frame)) => frame,
                        Some(Err(e)) => {
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

/// Newline framing that survives bad input: an overlong line is reported once as `TooLarge`
/// and skipped, a line that is not UTF-8 is reported as `NotUtf8`, blank lines are dropped.
/// (`LinesCodec` reports both as errors, and an error ends a `FramedRead`: one bad line
/// used to cost the whole connection.)
struct LineDecoder {
    max: usize,
    /// Where to resume the search for `\n` in the buffer.
    searched: usize,
    /// Inside an overlong line: drop bytes up to the next `\n`.
    discarding: bool,
}

impl LineDecoder {
    fn new(max: usize) -> LineDecoder {
        LineDecoder {
            max,
            searched: 0,
            discarding: false,
        }
    }

    fn frame(line: &[u8]) -> Option<InFrame> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(match std::str::from_utf8(line) {
            Ok(text) => InFrame::Text(text.to_owned()),
            Err(_) => InFrame::NotUtf8,
        })
    }
}

impl Decoder for LineDecoder {
    type Item = InFrame;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<InFrame>> {
        loop {
            let newline = buf[self.searched..]
                .iter()
                .position(|b| *b == b'\n')
                .map(|i| self.searched + i);
            match newline {
                Some(end) => {
                    let line = buf.split_to(end + 1);
                    self.searched = 0;
                    if std::mem::take(&mut self.discarding) {
                        continue;
                    }
                    if end > self.max {
                        return Ok(Some(InFrame::TooLarge(end)));
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
                    buf.advance(seen);
                    self.searched = 0;
                    self.discarding = true;
                    return Ok(Some(InFrame::TooLarge(seen)));
                }
                None => {
                    self.searched = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<InFrame>> {
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
                InFrame::Text(t) => t,
                InFrame::TooLarge(_) => "<too large>".into(),
                InFrame::NotUtf8 => "<not utf-8>".into(),
            })
            .collect()
    }

    #[test]
    fn bad_lines_are_reported_and_the_stream_goes_on() {
        let input = b"one\r\n\n  \n\xff\xfe\n0123456789abcdef0123\ntwo\nlast";
        assert_eq!(
            decode_all(16, input),
            ["one", "<not utf-8>", "<too large>", "two", "last"]
        );
    }
}

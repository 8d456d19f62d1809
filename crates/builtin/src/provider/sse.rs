//! Server-sent events from a model's response body, parsed by `sse-stream` (incremental,
//! CRLF / CR / LF line ends, chunks split anywhere), with a cap on what one event may
//! buffer: a provider streaming an endless line ends the call with an error instead of
//! growing memory without bound.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use sse_stream::{Sse, SseStream};

/// Largest event (its bytes on the wire) a provider may send: far above any real delta.
pub(super) const MAX_EVENT: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Event {
    pub event: Option<String>,
    pub data: String,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum SseError {
    #[error("an event exceeded {0} bytes")]
    TooLarge(usize),
    /// The body failed (a reset, or the read timeout).
    #[error(transparent)]
    Body(Box<dyn std::error::Error + Send + Sync>),
    #[error("malformed server-sent events: {0}")]
    Malformed(String),
}

/// Reading the body failed, as the parser sees it (it boxes this; `convert` unboxes it).
#[derive(Debug, thiserror::Error)]
enum ChunkError {
    #[error("an event exceeded {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Body(Box<dyn std::error::Error + Send + Sync>),
}

type Inner = Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>;

/// The events of one body. The bytes pulled from the body since the last event came out
/// are counted (the parser holds at most those plus the rest of one chunk), and reading
/// stops when they pass the cap.
pub(super) struct Events {
    inner: Inner,
    pending: Arc<AtomicUsize>,
}

impl Events {
    pub(super) fn new<S, E>(body: S, cap: usize) -> Events
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        // Shared by the counting adapter (inside the parser) and `poll_next` (which resets
        // it): an atomic counter, since the parser owns the body stream.
        let pending = Arc::new(AtomicUsize::new(0));
        let counter = pending.clone();
        let counted = body.map(move |r| {
            let bytes = r.map_err(|e| ChunkError::Body(Box::new(e)))?;
            let held = counter.fetch_add(bytes.len(), Ordering::Relaxed) + bytes.len();
            if held > cap {
                return Err(ChunkError::TooLarge(cap));
            }
            Ok(bytes)
        });
        Events {
            inner: Box::pin(SseStream::from_bytes_stream(counted)),
            pending,
        }
    }
}

fn convert(e: sse_stream::Error) -> SseError {
    match e {
        sse_stream::Error::Body(b) => match b.downcast::<ChunkError>() {
            Ok(c) => match *c {
                ChunkError::TooLarge(n) => SseError::TooLarge(n),
                ChunkError::Body(e) => SseError::Body(e),
            },
            Err(b) => SseError::Body(b),
        },
        other => SseError::Malformed(other.to_string()),
    }
}

impl Stream for Events {
    type Item = Result<Event, SseError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(sse))) => {
                self.pending.store(0, Ordering::Relaxed);
                Poll::Ready(Some(Ok(Event {
                    event: sse.event,
                    data: sse.data.unwrap_or_default(),
                })))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(convert(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;

    /// The events of `chunks`, fed one by one, until the end or the first error.
    async fn parse(chunks: &[&[u8]], cap: usize) -> (Vec<Event>, Option<SseError>) {
        let owned: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut events = Events::new(stream::iter(owned), cap);
        let mut out = vec![];
        while let Some(r) = events.next().await {
            match r {
                Ok(e) => out.push(e),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    fn ev(event: Option<&str>, data: &str) -> Event {
        Event {
            event: event.map(str::to_owned),
            data: data.to_owned(),
        }
    }

    #[tokio::test]
    async fn lf_crlf_and_bare_cr_line_ends() {
        let (got, err) = parse(
            &[b"event: a\ndata: lf\n\nevent: b\r\ndata: crlf\r\n\r\nevent: c\rdata: cr\r\r"],
            MAX_EVENT,
        )
        .await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(
            got,
            [
                ev(Some("a"), "lf"),
                ev(Some("b"), "crlf"),
                ev(Some("c"), "cr")
            ]
        );
    }

    #[tokio::test]
    async fn chunks_split_anywhere() {
        let whole =
            "event: a\r\ndata: {\"x\":\"h\u{e9}llo\"}\r\n\r\ndata: one\ndata: two\n\n: comment\n\n";
        let want = [
            ev(Some("a"), "{\"x\":\"h\u{e9}llo\"}"),
            ev(None, "one\ntwo"),
        ];
        // Every split point, including inside the CRLF pair and inside the two-byte é.
        for at in 0..whole.len() {
            let (a, b) = whole.as_bytes().split_at(at);
            let (got, err) = parse(&[a, b], MAX_EVENT).await;
            assert!(err.is_none(), "split at {at}: {err:?}");
            assert_eq!(got, want, "split at {at}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = whole.as_bytes().chunks(1).collect();
        assert_eq!(parse(&bytes, MAX_EVENT).await.0, want);
    }

    #[tokio::test]
    async fn an_endless_event_is_cut_off_at_the_cap() {
        let line = vec![b'x'; 1024];
        let mut chunks: Vec<&[u8]> = vec![b"data: "];
        chunks.extend(std::iter::repeat_n(line.as_slice(), 100));
        let (got, err) = parse(&chunks, 10 * 1024).await;
        assert!(got.is_empty());
        assert!(matches!(err, Some(SseError::TooLarge(10240))), "{err:?}");
    }

    #[tokio::test]
    async fn the_cap_is_per_event_not_per_stream() {
        // 100 events of ~1 KiB each pass a 4 KiB cap.
        let one = format!("data: {}\n\n", "y".repeat(1000));
        let chunks: Vec<&[u8]> = std::iter::repeat_n(one.as_bytes(), 100).collect();
        let (got, err) = parse(&chunks, 4096).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(got.len(), 100);
    }
}

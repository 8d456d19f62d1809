//! What the shim writes to the editor: one JSON message per line. A daemon message goes out as
//! the bytes of the frame it came in (a slice of the socket's own buffer, never copied); the
//! shim's own answers and rewritten messages are owned strings.

use std::ops::Range;

use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::pipe;

/// One line for stdout, without its newline.
pub enum OutLine {
    Owned(String),
    /// `range` of a frame received from the daemon.
    Slice(Utf8Bytes, Range<usize>),
}

impl OutLine {
    pub fn as_str(&self) -> &str {
        match self {
            OutLine::Owned(s) => s,
            OutLine::Slice(frame, r) => &frame[r.clone()],
        }
    }

    /// The same message on one line: JSON whitespace may hold newlines (strings cannot), and
    /// only then is it parsed and written again.
    pub fn one_line(self) -> OutLine {
        let m = self.as_str();
        // One SIMD pass for both bytes (this runs on every message the shim relays).
        if memchr::memchr2(b'\n', b'\r', m.as_bytes()).is_some()
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(m)
        {
            return OutLine::Owned(v.to_string());
        }
        self
    }
}

impl From<String> for OutLine {
    fn from(s: String) -> OutLine {
        OutLine::Owned(s)
    }
}

/// Lines to stdout, flushed whenever the queue runs dry.
pub async fn write_stdout(rx: mpsc::Receiver<OutLine>) {
    let out = write_lines(rx, pipe::stdout()).await;
    pipe::restore_stdout(out);
}

/// Room for a burst of updates: one write per burst.
const STDOUT_BUFFER: usize = 64 * 1024;

async fn write_lines(mut rx: mpsc::Receiver<OutLine>, stdout: pipe::Stdout) -> pipe::Stdout {
    use tokio::io::AsyncWriteExt;
    let mut out = tokio::io::BufWriter::with_capacity(STDOUT_BUFFER, stdout);
    while let Some(line) = rx.recv().await {
        let r = async {
            out.write_all(line.as_str().as_bytes()).await?;
            out.write_all(b"\n").await?;
            if rx.is_empty() {
                out.flush().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        if let Err(e) = r.await {
            tracing::warn!(error = %e, "stdout write failed");
            return out.into_inner();
        }
    }
    let _ = out.flush().await;
    out.into_inner()
}

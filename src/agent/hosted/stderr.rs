//! A hosted agent's stderr, to acpd's log one line at a time with a cap: at most
//! `MAX_STDERR_LINE` bytes of a line are kept and logged, the rest of an over-long line is
//! read and discarded (counted in its log line and in a metric), so an agent that writes a
//! line without end cannot grow acpd's memory.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The longest part of one stderr line acpd keeps.
pub(crate) const MAX_STDERR_LINE: usize = 8 * 1024;

/// One line being assembled: its kept head and how many bytes of it were discarded.
#[derive(Debug, Default)]
struct LineCap {
    kept: Vec<u8>,
    dropped: u64,
}

/// A finished line: its kept head (lossy UTF-8) and the bytes discarded after it.
#[derive(Debug, PartialEq)]
struct Line {
    text: String,
    dropped: u64,
}

impl LineCap {
    /// Takes from `buf` up to and including the first newline; returns how many bytes it
    /// used and the line if one ended.
    fn feed(&mut self, buf: &[u8]) -> (usize, Option<Line>) {
        let end = buf.iter().position(|&b| b == b'\n');
        let content = &buf[..end.unwrap_or(buf.len())];
        let room = MAX_STDERR_LINE - self.kept.len();
        let take = content.len().min(room);
        self.kept.extend_from_slice(&content[..take]);
        self.dropped += (content.len() - take) as u64;
        match end {
            Some(i) => (i + 1, Some(self.finish())),
            None => (buf.len(), None),
        }
    }

    /// The line so far, ended (at a newline or at the end of the stream).
    fn finish(&mut self) -> Line {
        let line = Line {
            text: String::from_utf8_lossy(&self.kept).into_owned(),
            dropped: self.dropped,
        };
        self.kept.clear();
        self.dropped = 0;
        line
    }

    fn is_empty(&self) -> bool {
        self.kept.is_empty() && self.dropped == 0
    }
}

fn log(agent: &str, line: Line) {
    if line.dropped == 0 {
        tracing::info!(target: "acpd::agent_stderr", agent = %agent, "{}", line.text);
    } else {
        metrics::counter!(crate::metrics::AGENT_STDERR_DROPPED_BYTES_TOTAL).increment(line.dropped);
        tracing::info!(
            target: "acpd::agent_stderr",
            agent = %agent,
            dropped_bytes = line.dropped,
            "{} [line cut: {} more bytes discarded]",
            line.text,
            line.dropped
        );
    }
}

/// Logs `stderr` until it ends or fails.
pub(crate) async fn forward(stderr: impl AsyncRead + Unpin, agent: String) {
    let mut reader = BufReader::new(stderr);
    let mut cap = LineCap::default();
    loop {
        let (used, line) = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(buf) => cap.feed(buf),
        };
        reader.consume(used);
        if let Some(line) = line {
            log(&agent, line);
        }
    }
    if !cap.is_empty() {
        log(&agent, cap.finish());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(cap: &mut LineCap, mut buf: &[u8]) -> Vec<Line> {
        let mut out = vec![];
        while !buf.is_empty() {
            let (used, line) = cap.feed(buf);
            out.extend(line);
            buf = &buf[used..];
        }
        out
    }

    #[test]
    fn lines_are_split_at_newlines_across_reads() {
        let mut cap = LineCap::default();
        let mut lines = feed_all(&mut cap, b"one\ntw");
        lines.extend(feed_all(&mut cap, b"o\n\nthree"));
        let texts: Vec<_> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["one", "two", ""]);
        assert!(lines.iter().all(|l| l.dropped == 0));
        assert!(!cap.is_empty());
        assert_eq!(
            cap.finish(),
            Line {
                text: "three".into(),
                dropped: 0
            }
        );
        assert!(cap.is_empty());
    }

    #[test]
    fn an_over_long_line_keeps_its_head_and_counts_the_rest() {
        let mut cap = LineCap::default();
        let long = vec![b'x'; MAX_STDERR_LINE + 100];
        // In pieces, as reads deliver it: the kept part never grows past the cap.
        for chunk in long.chunks(3000) {
            assert!(feed_all(&mut cap, chunk).is_empty());
            assert!(cap.kept.len() <= MAX_STDERR_LINE);
        }
        let lines = feed_all(&mut cap, b"\nnext\n");
        assert_eq!(lines[0].text.len(), MAX_STDERR_LINE);
        assert_eq!(lines[0].dropped, 100);
        assert_eq!(
            lines[1],
            Line {
                text: "next".into(),
                dropped: 0
            }
        );
    }
}

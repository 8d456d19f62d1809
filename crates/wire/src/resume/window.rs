//! The numbering of a resumable link, without I/O: envelopes, acks, the unacked buffer and
//! the position to resend from. The daemon's link owner and the shim both drive one.
//!
//! Wire format (one WebSocket text frame each):
//! `{"s":SEQ,"a":ACK,"m":MSG}` a message, `{"a":ACK}` an ack, `{"ping":N}` / `{"pong":N}`.
//! SEQ numbers one side's messages from 1; ACK is the last SEQ received from the other side.

use std::collections::VecDeque;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::OutFrame;

/// A protocol violation on a resumable link; the link cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame {got} skips ahead (expected {expected})")]
    Gap { got: u64, expected: u64 },
    #[error("ack {ack} for a frame never sent (last sent {sent})")]
    BadAck { ack: u64, sent: u64 },
    #[error("peer resumes from {peer}, but frames up to {acked} were acked and dropped")]
    Behind { peer: u64, acked: u64 },
}

/// One decoded frame. `Data` borrows the message from the frame text.
#[derive(Debug)]
pub enum Frame<'a> {
    Data {
        seq: u64,
        ack: Option<u64>,
        msg: &'a RawValue,
    },
    Ack(u64),
    Ping(u64),
    Pong(u64),
}

#[derive(Deserialize)]
struct Wire<'a> {
    s: Option<u64>,
    a: Option<u64>,
    #[serde(borrow)]
    m: Option<&'a RawValue>,
    ping: Option<u64>,
    pong: Option<u64>,
}

/// Decodes a frame; `m` stays raw (it is relayed, not read).
pub fn parse(text: &str) -> Result<Frame<'_>, WindowError> {
    let w: Wire<'_> =
        serde_json::from_str(text).map_err(|e| WindowError::Malformed(e.to_string()))?;
    match w {
        Wire {
            s: Some(seq),
            m: Some(msg),
            a,
            ..
        } => Ok(Frame::Data { seq, ack: a, msg }),
        Wire {
            ping: Some(n),
            s: None,
            ..
        } => Ok(Frame::Ping(n)),
        Wire {
            pong: Some(n),
            s: None,
            ..
        } => Ok(Frame::Pong(n)),
        Wire {
            a: Some(a),
            s: None,
            m: None,
            ..
        } => Ok(Frame::Ack(a)),
        _ => Err(WindowError::Malformed(
            "not a frame of acpd.resume.v1".into(),
        )),
    }
}

pub fn ping_frame(n: u64) -> String {
    format!("{{\"ping\":{n}}}")
}

pub fn pong_frame(n: u64) -> String {
    format!("{{\"pong\":{n}}}")
}

/// Ack at least this often (in frames received), besides the timer.
const ACK_EVERY: u32 = 256;

/// One side's view of a resumable link.
#[derive(Debug)]
pub struct Window {
    /// SEQ of the next message pushed.
    next_seq: u64,
    /// Messages not yet acked by the other side, oldest first, consecutive SEQs.
    unacked: VecDeque<(u64, OutFrame)>,
    unacked_bytes: usize,
    /// Highest SEQ handed to the current socket.
    written: u64,
    /// Highest SEQ ever handed to any socket: what lies beyond never left this side.
    ever_written: u64,
    /// Last SEQ received from the other side.
    received: u64,
    /// Last ACK we told the other side.
    ack_sent: u64,
    since_ack: u32,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            next_seq: 1,
            unacked: VecDeque::new(),
            unacked_bytes: 0,
            written: 0,
            ever_written: 0,
            received: 0,
            ack_sent: 0,
            since_ack: 0,
        }
    }
}

impl Window {
    pub fn new() -> Window {
        Window::default()
    }

    /// Numbers a message and keeps it until acked.
    pub fn push(&mut self, msg: impl Into<OutFrame>) {
        let msg = msg.into();
        self.unacked_bytes += msg.len();
        self.unacked.push_back((self.next_seq, msg));
        self.next_seq += 1;
    }

    /// Bytes held for a possible resend.
    pub fn buffered_bytes(&self) -> usize {
        self.unacked_bytes
    }

    /// Messages pushed but not yet handed to the current socket.
    pub fn unwritten(&self) -> u64 {
        self.next_seq - 1 - self.written
    }

    pub fn has_unwritten(&self) -> bool {
        self.unwritten() > 0
    }

    /// The envelope of the next message for the socket, carrying the current ack.
    pub fn next_frame(&mut self) -> Option<String> {
        let seq = self.written + 1;
        let first = self.unacked.front()?.0;
        let (_, msg) = self.unacked.get(usize::try_from(seq - first).ok()?)?;
        let mut f = String::with_capacity(msg.len() + 48);
        // No number is formatted into a `String` of its own, nor through `fmt`.
        let mut n = itoa::Buffer::new();
        f.push_str("{\"s\":");
        f.push_str(n.format(seq));
        f.push_str(",\"a\":");
        f.push_str(n.format(self.received));
        f.push_str(",\"m\":");
        f.push_str(msg);
        f.push('}');
        self.written = seq;
        self.ever_written = self.ever_written.max(seq);
        self.ack_sent = self.received;
        self.since_ack = 0;
        Some(f)
    }

    /// The other side has everything up to `ack`: drop it from the buffer.
    pub fn on_ack(&mut self, ack: u64) -> Result<(), WindowError> {
        if ack > self.written {
            return Err(WindowError::BadAck {
                ack,
                sent: self.written,
            });
        }
        while let Some((seq, _)) = self.unacked.front() {
            if *seq > ack {
                break;
            }
            if let Some((_, m)) = self.unacked.pop_front() {
                self.unacked_bytes -= m.len();
            }
        }
        Ok(())
    }

    /// A data frame arrived: `Ok(true)` deliver it, `Ok(false)` a duplicate to drop.
    pub fn on_data(&mut self, seq: u64) -> Result<bool, WindowError> {
        if seq <= self.received {
            return Ok(false);
        }
        if seq != self.received + 1 {
            return Err(WindowError::Gap {
                got: seq,
                expected: self.received + 1,
            });
        }
        self.received = seq;
        self.since_ack += 1;
        Ok(true)
    }

    /// Last SEQ received: what a resume presents.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// A new socket: the other side has seen up to `peer_received`; resend from there.
    pub fn resume_from(&mut self, peer_received: u64) -> Result<(), WindowError> {
        let acked = self.unacked.front().map_or(self.next_seq, |(s, _)| *s) - 1;
        if peer_received < acked {
            return Err(WindowError::Behind {
                peer: peer_received,
                acked,
            });
        }
        if peer_received > self.ever_written {
            return Err(WindowError::BadAck {
                ack: peer_received,
                sent: self.ever_written,
            });
        }
        self.written = self.ever_written;
        self.on_ack(peer_received)?;
        self.written = peer_received;
        // The new socket starts without our ack; the next frame or timer tells it.
        self.ack_sent = 0;
        Ok(())
    }

    /// Something received is not acked yet.
    pub fn ack_due(&self) -> bool {
        self.received > self.ack_sent
    }

    /// So many frames arrived since the last ack that one should go now.
    pub fn ack_urgent(&self) -> bool {
        self.since_ack >= ACK_EVERY
    }

    /// An ack-only frame; call `ack_sent_now` once it is on its way.
    pub fn ack_frame(&self) -> String {
        format!("{{\"a\":{}}}", self.received)
    }

    pub fn ack_sent_now(&mut self) {
        self.ack_sent = self.received;
        self.since_ack = 0;
    }

    /// Takes the messages that never left this side (none was handed to any socket).
    pub fn take_unwritten(&mut self) -> Vec<OutFrame> {
        let mut out = Vec::new();
        while let Some((seq, _)) = self.unacked.back() {
            if *seq <= self.ever_written {
                break;
            }
            if let Some((_, m)) = self.unacked.pop_back() {
                self.unacked_bytes -= m.len();
                out.push(m);
            }
        }
        out.reverse();
        self.next_seq = self.ever_written + 1;
        self.written = self.written.min(self.ever_written);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(f: &str) -> (u64, Option<u64>, String) {
        match parse(f).unwrap() {
            Frame::Data { seq, ack, msg } => (seq, ack, msg.get().to_owned()),
            other => panic!("not data: {other:?}"),
        }
    }

    #[test]
    fn frames_round_trip() {
        let mut w = Window::new();
        w.push(r#"{"jsonrpc":"2.0","method":"x"}"#);
        w.on_data(1).unwrap();
        let f = w.next_frame().unwrap();
        assert_eq!(
            data(&f),
            (1, Some(1), r#"{"jsonrpc":"2.0","method":"x"}"#.into())
        );
        assert!(matches!(parse(&ping_frame(3)).unwrap(), Frame::Ping(3)));
        assert!(matches!(parse(&pong_frame(4)).unwrap(), Frame::Pong(4)));
        assert!(matches!(parse(&w.ack_frame()).unwrap(), Frame::Ack(1)));
        assert!(parse(r#"{"x":1}"#).is_err());
        assert!(parse("[1]").is_err());
    }

    #[test]
    fn resume_resends_exactly_the_missing_frames() {
        let mut w = Window::new();
        for i in 0..5 {
            w.push(format!("{i}"));
        }
        while w.next_frame().is_some() {}
        w.on_ack(2).unwrap();
        assert_eq!(w.buffered_bytes(), 3);
        // The new socket's peer saw 3: frames 4 and 5 go again.
        w.resume_from(3).unwrap();
        assert_eq!(data(&w.next_frame().unwrap()).0, 4);
        assert_eq!(data(&w.next_frame().unwrap()).0, 5);
        assert!(w.next_frame().is_none());
        assert!(w.resume_from(1).is_err(), "behind what it acked");
        assert!(w.resume_from(9).is_err(), "ahead of what was sent");
    }

    #[test]
    fn duplicates_drop_and_gaps_fail() {
        let mut w = Window::new();
        assert!(w.on_data(1).unwrap());
        assert!(!w.on_data(1).unwrap());
        assert!(w.on_data(3).is_err());
        assert!(w.on_ack(1).is_err(), "nothing was sent");
    }

    #[test]
    fn unwritten_messages_can_be_taken_back() {
        let mut w = Window::new();
        w.push("a");
        w.push("b");
        w.next_frame();
        w.push("c");
        assert_eq!(
            w.take_unwritten(),
            vec![OutFrame::from("b"), OutFrame::from("c")]
        );
        assert_eq!(w.buffered_bytes(), 1);
        assert!(!w.has_unwritten());
    }
}

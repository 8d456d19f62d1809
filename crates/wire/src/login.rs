//! The remote login link: a WebSocket on `/acp/login?agent=NAME` (subprotocol
//! `acpd.login.v1`) between acpd, which runs an agent's login in a pseudo-terminal on its
//! host, and the terminal that shows it (acp-shim on the editor's machine, or the web
//! console).
//!
//! Control messages are JSON in text frames (`Control`); bytes travel in binary frames whose
//! first byte names the channel: `0` the terminal, `1` a forwarded TCP connection (then its
//! number, 4 bytes big-endian, then the bytes).

use serde::{Deserialize, Serialize};

/// The WebSocket subprotocol of the login link.
pub const SUBPROTOCOL: &str = "acpd.login.v1";
/// Appended to the daemon URL's path (`/acp` becomes `/acp/login`).
pub const PATH_SUFFIX: &str = "/login";

const TERMINAL: u8 = 0;
const TUNNEL: u8 = 1;

/// A control message of either side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Control {
    /// Daemon: the login runs (`command` as a shell would show it).
    Started { command: String },
    /// Daemon: the login listens on this loopback port of the daemon host.
    Listening { port: u16 },
    /// Daemon: the login printed this URL.
    Url { url: String },
    /// Daemon: the login ended; `code` is its exit status (124 when acpd ended it at its
    /// timeout), `message` says why when it did not exit by itself.
    Exit { code: i32, message: Option<String> },
    /// Daemon: the login could not start, or the link broke the protocol.
    Error { message: String },
    /// Client: the terminal's size.
    Resize { cols: u16, rows: u16 },
    /// Client: a connection to forwarded `port` opened on the client's side.
    Open { conn: u32, port: u16 },
    /// Either side: forwarded connection `conn` closed on the sender's side.
    Close { conn: u32 },
}

/// The bytes of a binary frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Data<'a> {
    /// Terminal output (daemon to client) or keystrokes (client to daemon).
    Terminal(&'a [u8]),
    /// Bytes of forwarded connection `conn`.
    Tunnel { conn: u32, bytes: &'a [u8] },
}

impl Data<'_> {
    /// The binary frame that carries it.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Data::Terminal(b) => {
                let mut v = Vec::with_capacity(b.len() + 1);
                v.push(TERMINAL);
                v.extend_from_slice(b);
                v
            }
            Data::Tunnel { conn, bytes } => {
                let mut v = Vec::with_capacity(bytes.len() + 5);
                v.push(TUNNEL);
                v.extend_from_slice(&conn.to_be_bytes());
                v.extend_from_slice(bytes);
                v
            }
        }
    }

    /// A binary frame's bytes, `None` if it is not one of ours.
    pub fn decode(frame: &[u8]) -> Option<Data<'_>> {
        match frame.split_first()? {
            (&TERMINAL, rest) => Some(Data::Terminal(rest)),
            (&TUNNEL, rest) if rest.len() >= 4 => {
                let (id, bytes) = rest.split_at(4);
                Some(Data::Tunnel {
                    conn: u32::from_be_bytes([id[0], id[1], id[2], id[3]]),
                    bytes,
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_frames_round_trip_and_junk_is_refused() {
        for d in [
            Data::Terminal(b"hi\r\n"),
            Data::Tunnel {
                conn: 70000,
                bytes: b"GET /",
            },
        ] {
            assert_eq!(Data::decode(&d.encode()), Some(d));
        }
        assert_eq!(Data::decode(&[]), None);
        assert_eq!(Data::decode(&[1, 0, 0]), None);
        assert_eq!(Data::decode(&[9, 1]), None);
    }

    #[test]
    fn control_messages_are_tagged_json() {
        let c = Control::Open {
            conn: 3,
            port: 8080,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"type":"open","conn":3,"port":8080}"#);
        assert_eq!(serde_json::from_str::<Control>(&text).unwrap(), c);
    }
}

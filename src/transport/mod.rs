//! Transports the daemon serves: WebSocket (plain and resumable) and Streamable HTTP (POST +
//! SSE), each turned into an `acpd_wire::Link` by one pump task (newline TCP and stdio use
//! `acpd_wire::lines`). They frame and limit sizes; they know nothing of ACP.

pub mod gate;
pub mod http_stream;
pub mod listen;
pub mod resume;
pub mod ws;

use std::time::Duration;

/// How long a socket may take no bytes of a write before it is closed: about three keepalive
/// intervals (the same silence that declares a resumable link dead), at least one second.
/// Measured per write operation (one burst, a ping, the close frame).
pub fn write_deadline(keepalive: Duration) -> Duration {
    (keepalive * 3).max(Duration::from_secs(1))
}

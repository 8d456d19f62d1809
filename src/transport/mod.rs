//! Transports: WebSocket, newline-delimited TCP and stdio, each turned into a `jsonrpc::Link`
//! by one pump task. They frame and limit sizes; they know nothing of ACP.

pub mod lines;
pub mod resume;
pub mod ws;

/// Depth of the channels between a pump and its peer: enough to keep a socket busy, small
/// enough that a stalled client pushes back on its sessions.
pub const LINK_QUEUE: usize = 256;

//! acpd's wire: JSON-RPC 2.0 messages, the `Peer` that runs one link, newline framing and the
//! link-resumption window. Knows nothing of ACP (that is `acpd-protocol`), HTTP or SQL; the
//! daemon, acp-shim and the built-in agent share it.

mod envelope;
pub mod lines;
pub mod local;
pub mod login;
mod members;
mod msg;
mod out_frame;
mod peer;
pub mod resume;

pub use envelope::RawNotification;
pub use members::{Members, str_member};
pub use msg::{
    Malformed, Message, Notification, Request, RequestId, Response, ResponseError, code,
};
pub use out_frame::OutFrame;
pub use peer::{
    Answer, Forward, InFrame, Incoming, IncomingRequest, LaneRequest, Link, MapError,
    OutgoingRequest, PeerError, PeerHandle, PendingForward, QueueError, Responder, memory_pair,
    send_ready, spawn,
};

/// Depth of the channels between a pump and its peer: enough to keep a socket busy, small
/// enough that a stalled client pushes back on its sessions.
pub const LINK_QUEUE: usize = 256;

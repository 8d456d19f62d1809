//! JSON-RPC 2.0: wire types and the `Peer` that runs one link. Knows nothing of ACP.

mod msg;
mod peer;

pub use msg::{
    Malformed, Message, Notification, Request, RequestId, Response, ResponseError, code,
};
pub use peer::{
    InFrame, Incoming, IncomingRequest, Link, OutgoingRequest, PeerError, PeerHandle, Responder,
    memory_pair, spawn,
};

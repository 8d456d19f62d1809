//! Transports the daemon serves: WebSocket (plain and resumable), each socket turned into an
//! `acpd_wire::Link` by one pump task (newline TCP and stdio use `acpd_wire::lines`). They
//! frame and limit sizes; they know nothing of ACP.

pub mod resume;
pub mod ws;

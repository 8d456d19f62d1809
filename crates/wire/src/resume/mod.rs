//! Link resumption (`acpd.resume.v1`) as both ends see it: the handshake's names and the
//! numbering window. The daemon's link owner and acp-shim's relay are built on these.

pub mod window;

/// The WebSocket subprotocol that turns resumption on.
pub const SUBPROTOCOL: &str = "acpd.resume.v1";
/// Request header: the `Acp-Connection-Id` of the link to resume.
pub const RESUME_HEADER: &str = "acpd-resume";
/// Request and response header: the last SEQ this side received on the link.
pub const LAST_SEQ_HEADER: &str = "acpd-last-seq";
/// Response header of a resumable upgrade: the daemon's `max_message_bytes`. acp-shim answers
/// a longer editor line itself rather than send what the daemon would refuse.
pub const MAX_MESSAGE_HEADER: &str = "acpd-max-message-bytes";
/// What acp-shim assumes before the first upgrade tells it (acpd's default).
pub const DEFAULT_MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Response header of every upgrade (RFD).
pub const CONNECTION_ID_HEADER: &str = "acp-connection-id";

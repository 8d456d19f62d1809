//! `AcpError` and the one place that turns errors into JSON-RPC error replies.
//!
//! Internal failures are logged in full and answered with a generic message; nothing about
//! the store or the host leaks to clients.

use std::sync::Arc;

use serde_json::json;

use crate::agent::AgentError;

/// The log target of hosted agents' stderr, which errors about failed agents point to.
const STDERR_TARGET: &str = "acpd::agent_stderr";
use acpd_store::StoreError;
use acpd_wire::{PeerError, ResponseError, code};

/// A client's role does not allow the command (shared sessions: an observer steering, a
/// grantee deleting, forking or sharing what it does not own).
pub const FORBIDDEN: i64 = -32010;
/// A prompt while a turn runs, refused (`busy_prompts = "refuse"`).
pub const BUSY: i64 = -32011;
/// The session is owned (a live lease) by another replica of the cluster.
pub const OWNED_ELSEWHERE: i64 = -32012;

#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error("initialize must come first")]
    NotInitialized,
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("session {0} not found")]
    SessionNotFound(String),
    #[error(transparent)]
    Agent(#[from] Arc<AgentError>),
    /// The agent answered with an error: passed to the client as it is.
    #[error("agent error: {0}")]
    AgentReply(ResponseError),
    #[error("the agent process exited ({0}); the next prompt restarts it")]
    AgentExited(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("the session is closing")]
    SessionGone,
    #[error("too many live sessions for this user")]
    TooManySessions,
    /// A command only a controller may send, from a client attached as an observer.
    #[error("{0} is not allowed for an observer of this session")]
    Observer(String),
    /// A command only the session's owner may send (delete, fork, share), from a principal
    /// that was only granted a role on it.
    #[error("{0} is for the session's owner only")]
    NotOwner(String),
    /// A prompt while a turn runs, under `busy_prompts = "refuse"`.
    #[error("a turn is running in this session")]
    Busy,
    /// Another replica holds the session's live lease (several replicas).
    #[error("session {session} is owned by replica {owner}")]
    OwnedElsewhere {
        session: String,
        owner: String,
        advertise_url: Option<String>,
        expires_in_ms: i64,
    },
    #[error("{0}")]
    Internal(String),
}

impl From<PeerError> for AcpError {
    fn from(e: PeerError) -> Self {
        match e {
            PeerError::Remote(r) => AcpError::AgentReply(r),
            PeerError::Disconnected => AcpError::AgentExited("its connection closed".into()),
        }
    }
}

impl From<AcpError> for ResponseError {
    fn from(e: AcpError) -> ResponseError {
        match e {
            AcpError::NotInitialized => {
                ResponseError::invalid_request("initialize must come first")
            }
            AcpError::InvalidParams(m) => ResponseError::invalid_params(m),
            AcpError::SessionNotFound(id) => {
                ResponseError::new(code::RESOURCE_NOT_FOUND, "Resource not found")
                    .with_data(json!({ "sessionId": id }))
            }
            AcpError::AgentReply(r) => r,
            AcpError::Agent(a) => match &*a {
                AgentError::UnknownProfile(_) | AgentError::ShuttingDown => {
                    ResponseError::internal(a.to_string())
                }
                AgentError::Spawn { profile, .. } | AgentError::Initialize { profile, .. } => {
                    tracing::error!(error = %a, "agent unavailable");
                    ResponseError::internal(format!(
                        "agent {profile:?} could not be started; its stderr is in acpd's log \
                         (target {STDERR_TARGET}, agent={profile})"
                    ))
                }
                AgentError::BackingOff {
                    profile,
                    failures,
                    next_start,
                    retry_in,
                } => {
                    let secs = retry_in.as_secs_f64().ceil() as u64;
                    ResponseError::internal(format!(
                        "agent {profile:?} failed {failures} times in a row; acpd starts it again \
                         at {next_start} (in {secs} s). Its stderr is in acpd's log (target \
                         {STDERR_TARGET}, agent={profile})"
                    ))
                    .with_data(json!({ "acpd": {
                        "agent": profile,
                        "failures": failures,
                        "nextStart": next_start,
                        "retryAfterMs": retry_in.as_millis() as u64,
                        "stderrLog": STDERR_TARGET,
                    }}))
                }
            },
            e @ AcpError::AgentExited(_) => ResponseError::internal(e.to_string()),
            AcpError::Store(StoreError::InvalidCursor) => {
                ResponseError::invalid_params("invalid cursor")
            }
            AcpError::Store(s) => {
                tracing::error!(error = %s, "store failure");
                ResponseError::internal("the session store is unavailable; try again")
            }
            AcpError::SessionGone => ResponseError::internal("the session is closing; try again"),
            AcpError::TooManySessions => ResponseError::internal(
                "too many live sessions for this user; close some (session/close) and retry",
            ),
            AcpError::Observer(method) => ResponseError::new(
                FORBIDDEN,
                format!(
                    "{method} is not allowed: this client is attached to the session as an \
                     observer (read-only); attach as a controller to steer it"
                ),
            )
            .with_data(json!({ "acpd": { "role": "observer" } })),
            AcpError::NotOwner(method) => ResponseError::new(
                FORBIDDEN,
                format!(
                    "{method} is for the session's owner only: this principal was granted a role \
                     on the session, which lets it attach and (as a controller) steer, not own it"
                ),
            )
            .with_data(json!({ "acpd": { "owner": false } })),
            AcpError::Busy => ResponseError::new(
                BUSY,
                "a turn is running in this session (busy_prompts = \"refuse\"); send the prompt \
                 when it has ended, or session/cancel it",
            ),
            AcpError::OwnedElsewhere {
                session,
                owner,
                advertise_url,
                expires_in_ms,
            } => ResponseError::new(
                OWNED_ELSEWHERE,
                "this session is live on another replica; connect there, or retry once its \
                 lease has expired",
            )
            .with_data(json!({ "acpd": {
                "sessionId": session,
                "owner": owner,
                "advertiseUrl": advertise_url,
                "retryAfterMs": expires_in_ms.max(0),
            }})),
            AcpError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                ResponseError::internal("internal error")
            }
        }
    }
}

//! `AcpError` and the one place that turns errors into JSON-RPC error replies: every error
//! object acpd sends is built here (`tests/it/vocabulary.rs` checks it), and so is every
//! custom code.
//!
//! Internal failures are logged in full and answered with a generic message; nothing about
//! the store or the host leaks to clients.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::agent::AgentError;

/// The log target of hosted agents' stderr, which errors about failed agents point to.
const STDERR_TARGET: &str = "acpd::agent_stderr";
use acpd_store::StoreError;
use acpd_wire::{PeerError, ResponseError, code};

/// A request over the connection's rate limit, or beyond the requests it may have in flight
/// (implementation-defined server error range).
pub const RATE_LIMITED: i64 = -32005;

/// A client's role does not allow the command (shared sessions: an observer steering, a
/// grantee deleting, forking or sharing what it does not own).
pub const FORBIDDEN: i64 = -32010;
/// A prompt while a turn runs, refused (`busy_prompts = "refuse"`).
pub const BUSY: i64 = -32011;
/// The session is owned (a live lease) by another replica of the cluster.
pub const OWNED_ELSEWHERE: i64 = -32012;
/// A `stop` budget is used up (the quotas RFD's `quotaExceeded`).
pub const QUOTA_EXCEEDED: i64 = -32013;

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
    /// A `stop` budget is used up: `message` names it and when it resets, `meter` is its
    /// reading.
    #[error("{message}")]
    QuotaExceeded {
        budget: String,
        message: String,
        meter: Value,
    },
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
    /// The session moved to another replica while it ran here (its lease was taken).
    #[error("session {0} moved to another replica")]
    Moved(String),
    /// A request over the connection's rate limit.
    #[error("rate limit exceeded")]
    RateLimited,
    /// A request beyond the handler tasks or agent calls a connection may have running.
    #[error("too many requests in flight")]
    TooManyInFlight,
    /// Notifications over the rate limit: the connection is closed with this.
    #[error("rate limit exceeded by notifications")]
    NotificationFlood,
    /// A method nobody here (or no session's agent) serves.
    #[error("method not found: {0}")]
    MethodNotFound(String),
    /// The store takes no writes (the database is away): the turn is stopped.
    #[error("the session store is not taking writes")]
    StoreOutage,
    /// The store refused this update of the session: nothing after it can be kept.
    #[error("the session store rejected update {0}")]
    UpdateRejected(i64),
    /// The store refused a new session's row, queued after `session/new` answered.
    #[error("the session store refused the new session's row")]
    SessionRowRefused,
    /// `_acpd/session/attach` after a seq the journal does not have yet.
    #[error("afterSeq {after_seq} is beyond the session's last seq {last_seq}")]
    AttachBeyondEnd { after_seq: i64, last_seq: i64 },
    /// An agent's request while its session is being restored.
    #[error("the session is being restored")]
    Restoring,
    /// An agent's request of a turn acpd already ended.
    #[error("the turn was cancelled")]
    TurnCancelled,
    /// An agent's request no client answered within `pending_request_timeout`.
    #[error("no client answered the request in time")]
    NoAnswer,
    /// An agent's request that needs a client capability (`fs`, `terminal`) no attached
    /// controller declared in `initialize` (`session::gate`).
    #[error("no attached client declared {need}, which {method} needs")]
    Undeclared { method: String, need: &'static str },
    /// The client an agent's request went to disconnected before answering (the words
    /// differ with the path that noticed: `went away` in the session, `is gone` forwarded).
    #[error("the client {0}")]
    ClientLeft(&'static str),
    #[error("{0}")]
    Internal(String),
}

/// A JSON-RPC error reply as a JSON value, for the transports that answer before (or
/// outside) a connection's peer: `id` is `null` when the input's id could not be read.
pub fn reply(id: &Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

/// `e` as an error reply with `id: null`, as one line of JSON text.
pub fn reply_text(e: AcpError) -> String {
    let e = ResponseError::from(e);
    reply(&Value::Null, e.code, &e.message).to_string()
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
    // long: the one flat table from an error to its wire code and text.
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
            AcpError::QuotaExceeded {
                budget,
                message,
                meter,
            } => ResponseError::new(QUOTA_EXCEEDED, message).with_data(json!({
                "reason": "quotaExceeded",
                "budget": budget,
                "resetsAt": meter.get("resetsAt"),
                "meter": meter,
            })),
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
            AcpError::Moved(id) => ResponseError::new(
                OWNED_ELSEWHERE,
                "this session moved to another replica; the next request opens it where it lives now",
            )
            .with_data(json!({ "acpd": { "sessionId": id, "moved": true } })),
            AcpError::RateLimited => {
                ResponseError::new(RATE_LIMITED, "Rate limit exceeded; slow down")
            }
            AcpError::TooManyInFlight => {
                ResponseError::new(RATE_LIMITED, "Too many requests in flight; slow down")
            }
            AcpError::NotificationFlood => ResponseError::new(
                RATE_LIMITED,
                "Rate limit exceeded by notifications; connection closed",
            ),
            AcpError::MethodNotFound(m) => ResponseError::method_not_found(&m),
            AcpError::StoreOutage => ResponseError::internal(
                "the session store is not taking writes (the database is away), so nothing \
                 more of this session can be kept; the turn is stopped and the session \
                 reopens from its journal on the next request",
            ),
            AcpError::SessionRowRefused => ResponseError::internal(
                "the session store refused this new session's row, so the session was not \
                 kept; start a new one with session/new",
            ),
            AcpError::UpdateRejected(seq) => ResponseError::internal(format!(
                "the session store rejected update {seq} of this session, so nothing \
                 after it can be kept; the turn is stopped and the session reopens from its \
                 journal on the next request"
            )),
            AcpError::AttachBeyondEnd { after_seq, last_seq } => ResponseError::invalid_params(format!(
                "afterSeq {after_seq} is beyond the session's last seq {last_seq}; nothing replayed; attach again from what you have (afterSeq <= {last_seq}) or session/load"
            ))
            .with_data(json!({ "lastSeq": last_seq })),
            e @ AcpError::Restoring => ResponseError::internal(e.to_string()),
            e @ AcpError::TurnCancelled => ResponseError::new(code::REQUEST_CANCELLED, e.to_string()),
            e @ AcpError::Undeclared { .. } => {
                ResponseError::new(code::METHOD_NOT_FOUND, e.to_string())
            }
            e @ (AcpError::NoAnswer | AcpError::ClientLeft(_)) => {
                ResponseError::internal(e.to_string())
            }
            AcpError::Internal(m) => {
                tracing::error!(error = %m, "internal error");
                ResponseError::internal("internal error")
            }
        }
    }
}

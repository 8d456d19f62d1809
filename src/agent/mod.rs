//! Agent backends behind sessions. `AgentPool` owns one agent process per (principal,
//! profile), started on first use and restarted on the next use after it died — unless it
//! is crash-looping (`backoff`). Each process is an ACP peer; `AgentHandle` is how sessions
//! talk to it. `pool` is the pool's actor; `home` gives a profile its own HOME;
//! `supervisor` is the per-agent process that owns an agent's whole tree; `login` is
//! `acpd agent login NAME`.

pub mod backoff;
pub mod home;
pub mod hosted;
pub mod login;
mod pool;
pub mod supervisor;

pub use pool::AgentPool;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use acpd_wire::{
    Forward, IncomingRequest, MapError, PeerError, PeerHandle, PendingForward, QueueError,
    RawNotification, Responder, ResponseError,
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("no agent profile named {0:?}")]
    UnknownProfile(String),
    #[error("cannot start agent {profile:?}: {source}")]
    Spawn {
        profile: String,
        source: std::io::Error,
    },
    #[error("agent {profile:?} failed to initialize: {message}")]
    Initialize { profile: String, message: String },
    #[error("acpd is shutting down")]
    ShuttingDown,
    /// Crash-loop backoff: no start before `next_start`.
    #[error("agent {profile:?} failed {failures} times in a row; next start at {next_start}")]
    BackingOff {
        profile: String,
        failures: u32,
        /// RFC 3339, UTC.
        next_start: String,
        retry_in: Duration,
    },
}

/// What the agent process sends about one of its sessions.
#[derive(Debug)]
pub enum AgentEvent {
    /// Params as the agent sent them: a `session/update` is journaled without being parsed.
    /// The `Held` is its share of what acpd holds of the agent's output, given back when the
    /// session has taken it (dropped).
    Notification(RawNotification, hosted::Held),
    /// Boxed, like `Response`'s result: these are rare, and a session's event channel holds
    /// a block of 32 slots of the largest variant for its whole life.
    Request(Box<IncomingRequest>),
    /// The answer to a request sent with `AgentHandle::request_in_band`.
    Response {
        tag: u64,
        result: Box<Result<Value, ResponseError>>,
    },
    /// The process is gone; `status` says how it ended.
    Exited { status: String },
}

/// Which process: agents are per principal so tokens never share an agent's memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentKey {
    pub principal: String,
    pub profile: String,
}

/// A live agent process. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    pub peer: PeerHandle,
    /// The agent's `initialize` result, unaltered.
    pub init: Arc<Value>,
    router: mpsc::Sender<hosted::RouterCommand>,
    /// Where a registration the router's full queue did not take is finished (`to_router`).
    tasks: TaskTracker,
    /// Fires when the process has exited.
    pub exited: CancellationToken,
    /// The profile's name.
    profile: Arc<str>,
}

impl AgentHandle {
    /// Routes in-band answers for `session_id` (acpd's id) to `events`, and the agent's
    /// messages about `agent_session_id`, including any that came before it was known.
    pub fn register(
        &self,
        session_id: &str,
        agent_session_id: Option<&str>,
        events: mpsc::Sender<AgentEvent>,
    ) {
        self.to_router(hosted::RouterCommand::Register {
            route: session_id.to_owned(),
            agent_session_id: agent_session_id.map(str::to_owned),
            events,
        });
    }

    pub fn unregister(&self, session_id: &str, events: &mpsc::Sender<AgentEvent>) {
        self.to_router(hosted::RouterCommand::Unregister {
            route: session_id.to_owned(),
            events: events.clone(),
        });
    }

    /// Never waits: the router's queue is bounded (`hosted::ROUTER_QUEUE`) and read on every
    /// pass of its loop, so it is full only while the router stops or kills the process; a
    /// registration it did not take then goes from a task, in order behind what is queued. A
    /// closed router (the agent is gone) takes nothing.
    fn to_router(&self, cmd: hosted::RouterCommand) {
        if let Err(mpsc::error::TrySendError::Full(cmd)) = self.router.try_send(cmd) {
            let router = self.router.clone();
            self.tasks.spawn(async move {
                let _ = router.send(cmd).await;
            });
        }
    }

    /// Sends a request whose answer arrives as `AgentEvent::Response { tag }` on the session's
    /// event stream, after every update the agent sent before it. Never waits:
    /// `QueueError::Full` when the agent has not taken what it was sent (its stdin and acpd's
    /// queues to it are full).
    pub fn try_request_in_band(
        &self,
        method: &str,
        params: Value,
        session_id: &str,
        tag: u64,
    ) -> Result<u64, QueueError> {
        // A hint: dropped when the router's queue is full.
        let _ = self.router.try_send(hosted::RouterCommand::Active {
            route: session_id.to_owned(),
        });
        self.peer
            .try_request_in_band(method, Some(params), session_id, tag)
    }

    /// Sends a request whose answer goes straight to `responder`'s link from the agent's peer
    /// task; a failure is worded by `word` after the login hint is added, as `request`'s
    /// caller would see it. Until then the call holds `permit` and keeps the agent running,
    /// as a caller awaiting `request` would. A full queue hands the request back, to be sent
    /// from a task.
    pub fn forward(
        &self,
        method: &str,
        params: Value,
        responder: Responder,
        permit: OwnedSemaphorePermit,
        word: fn(PeerError) -> ResponseError,
    ) -> Result<(), PendingForward> {
        let profile = self.profile.clone();
        let map_err: MapError = Arc::new(move |e| word(hinted(e, &profile)));
        let hold = (permit, self.router.clone());
        self.peer
            .try_forward(method, Some(params), Forward::new(responder, map_err, hold))
    }

    pub async fn request(&self, method: &str, params: Value) -> Result<Value, PeerError> {
        self.peer
            .request(method, Some(params))
            .await
            .map_err(|e| hinted(e, &self.profile))
    }

    /// Whether the process runs and its link is open: a closed link is an exit on its way
    /// (the process may not be reaped yet).
    pub fn is_live(&self) -> bool {
        !self.exited.is_cancelled() && !self.peer.is_closed()
    }

    /// A handle that does not keep the agent running: once every `AgentHandle` is gone, the
    /// agent stops ("no longer used").
    pub(crate) fn downgrade(&self) -> WeakAgentHandle {
        WeakAgentHandle {
            peer: self.peer.clone(),
            init: self.init.clone(),
            router: self.router.downgrade(),
            tasks: self.tasks.clone(),
            exited: self.exited.clone(),
            profile: self.profile.clone(),
        }
    }

    fn capability(&self, path: &[&str]) -> bool {
        let mut v = self.init.get("agentCapabilities");
        for p in path {
            v = v.and_then(|x| x.get(*p));
        }
        match v {
            Some(Value::Bool(b)) => *b,
            Some(Value::Null) | None => false,
            Some(_) => true,
        }
    }

    pub fn supports_load(&self) -> bool {
        self.capability(&["loadSession"])
    }
    pub fn supports_resume(&self) -> bool {
        self.capability(&["sessionCapabilities", "resume"])
    }
    pub fn supports_close(&self) -> bool {
        self.capability(&["sessionCapabilities", "close"])
    }
    pub fn supports_delete(&self) -> bool {
        self.capability(&["sessionCapabilities", "delete"])
    }
}

/// The agent's error with the login hint added (an auth error names how to log it in).
fn hinted(e: PeerError, profile: &str) -> PeerError {
    match e {
        PeerError::Remote(e) => PeerError::Remote(login::auth_hint(e, profile)),
        other => other,
    }
}

/// An `AgentHandle` that does not keep its agent running (`AgentHandle::downgrade`).
pub(crate) struct WeakAgentHandle {
    peer: PeerHandle,
    init: Arc<Value>,
    router: mpsc::WeakSender<hosted::RouterCommand>,
    tasks: TaskTracker,
    exited: CancellationToken,
    profile: Arc<str>,
}

impl WeakAgentHandle {
    /// The handle again, if some session still holds the agent.
    pub(crate) fn upgrade(&self) -> Option<AgentHandle> {
        Some(AgentHandle {
            peer: self.peer.clone(),
            init: self.init.clone(),
            router: self.router.upgrade()?,
            tasks: self.tasks.clone(),
            exited: self.exited.clone(),
            profile: self.profile.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    /// A live session holds the first block (32 slots) of its agent-event channel for its
    /// whole life: the events stay small (the rare large ones are boxed), so ten thousand idle
    /// sessions do not each hold 32 slots of the largest event.
    #[test]
    fn the_event_channel_every_live_session_holds_carries_small_events() {
        assert!(std::mem::size_of::<super::AgentEvent>() <= 48);
    }
}

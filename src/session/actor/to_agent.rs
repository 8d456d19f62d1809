//! What the actor sends its agent, never awaited: in-band requests (tagged daemon-wide) and
//! notifications go with `try_` sends, and an agent whose queue is full (it stopped reading
//! its stdin) is cut and restored as after a crash.

use serde_json::Value;

use super::{AgentState, Session, with_session_id};
use crate::error::AcpError;
use acpd_wire::QueueError;

impl Session {
    /// Sends a session-scoped request to the bound agent; its answer comes as an event.
    pub(super) async fn send_in_band(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<u64, AcpError> {
        let AgentState::Bound { agent, agent_sid } = &self.agent.state else {
            return Err(AcpError::AgentExited("no agent process".into()));
        };
        let tag = next_tag();
        let params = with_session_id(params, agent_sid);
        match agent.try_request_in_band(method, params, &self.id, tag) {
            Ok(_) => Ok(tag),
            Err(QueueError::Full) => Err(self.cut_agent()),
            Err(QueueError::Closed) => {
                self.agent.state = AgentState::Unbound;
                Err(AcpError::AgentExited("its connection closed".into()))
            }
        }
    }

    /// The agent has not taken what acpd sent it (its stdin, and acpd's queues to it, are
    /// full): the actor does not wait for it. Its link is cut; the router then stops the
    /// process and tells each of its sessions it exited, and they restore as after a crash.
    pub(super) fn cut_agent(&mut self) -> AcpError {
        let why = "it stopped reading its input";
        if let AgentState::Bound { agent, .. } | AgentState::Restoring { agent } = &self.agent.state
        {
            tracing::error!(session = %self.id, "the agent is not reading its input; cutting it (its sessions restore as after a crash)");
            agent.peer.close();
        }
        AcpError::AgentExited(why.into())
    }

    /// Sends the agent a notification without waiting (a full queue cuts it: `cut_agent`).
    pub(super) fn notify_agent(&mut self, method: &str, params: Value) {
        if let AgentState::Bound { agent, agent_sid } = &self.agent.state {
            let params = with_session_id(params, agent_sid);
            if agent.peer.try_notify(method, Some(params)) == Err(QueueError::Full) {
                self.cut_agent();
            }
        }
    }
}

/// The tag of an in-band request to an agent. One counter for the whole daemon: answers are
/// routed by session id and tag, and a session's actors come and go (close, eviction, a
/// reopen) while an agent may still answer what an earlier one sent. 0 is never handed out
/// (it tags requests whose answer nobody waits for).
pub(crate) fn next_tag() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

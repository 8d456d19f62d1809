//! The agent side of one session, without I/O: the agent's state, the commands waiting for
//! it to be bound, and the in-band requests sent to it by tag. The actor (`restore.rs`,
//! `to_agent.rs`, `events.rs`) asks it and does the sends.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{AgentState, Inflight};
use crate::agent::AgentEvent;
use crate::session::SessionCommand;

/// Most commands waiting for the agent to be bound (as many as the command queue holds);
/// past it a command is refused, so a stuck start never grows the queue without bound.
pub(super) const DEFERRED_LIMIT: usize = 256;

pub(super) struct AgentSide {
    pub(super) state: AgentState,
    /// Given to the agent router so the agent's messages reach this actor.
    pub(super) events: mpsc::Sender<AgentEvent>,
    /// Commands that wait for the agent to be bound.
    deferred: VecDeque<SessionCommand>,
    /// The newest client `initialize` params, to start the agent with.
    pub(super) last_init: Option<Arc<Value>>,
    /// In-band requests to the agent by tag (`next_tag`): unique across the daemon's life, so
    /// an answer meant for an earlier actor of the session (closed mid-turn, say) matches
    /// nothing here.
    pub(super) inflight: HashMap<u64, Inflight>,
}

impl AgentSide {
    pub(super) fn new(events: mpsc::Sender<AgentEvent>) -> AgentSide {
        AgentSide {
            state: AgentState::Unbound,
            events,
            deferred: VecDeque::new(),
            last_init: None,
            inflight: HashMap::new(),
        }
    }

    pub(super) fn bound(&self) -> bool {
        matches!(self.state, AgentState::Bound { .. })
    }

    /// Queues a command until the agent is bound; a full queue gives it back, to be refused.
    pub(super) fn defer(&mut self, cmd: SessionCommand) -> Result<(), Box<SessionCommand>> {
        if self.deferred.len() >= DEFERRED_LIMIT {
            return Err(Box::new(cmd));
        }
        self.deferred.push_back(cmd);
        Ok(())
    }

    pub(super) fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The oldest waiting command.
    pub(super) fn next_deferred(&mut self) -> Option<SessionCommand> {
        self.deferred.pop_front()
    }

    /// Records a request sent with `tag`.
    pub(super) fn sent(&mut self, tag: u64, f: Inflight) {
        self.inflight.insert(tag, f);
    }

    /// The request an answer with `tag` belongs to (`None`: not this actor's).
    pub(super) fn answered(&mut self, tag: u64) -> Option<Inflight> {
        self.inflight.remove(&tag)
    }

    /// The tags of the prompts the agent is running.
    pub(super) fn running_prompts(&self) -> Vec<u64> {
        self.inflight
            .iter()
            .filter(|(_, f)| matches!(f, Inflight::Prompt { .. }))
            .map(|(t, _)| *t)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Restore;
    use super::*;

    fn side() -> AgentSide {
        AgentSide::new(mpsc::channel(1).0)
    }

    fn cancel(n: usize) -> SessionCommand {
        SessionCommand::Cancel {
            conn: Some(Arc::from(format!("c{n}"))),
        }
    }

    fn conn(cmd: &SessionCommand) -> String {
        match cmd {
            SessionCommand::Cancel { conn: Some(c) } => c.to_string(),
            other => panic!("not a cancel: {other:?}"),
        }
    }

    #[test]
    fn commands_wait_in_order_and_a_full_queue_refuses() {
        let mut s = side();
        assert!(!s.bound());
        assert!(!s.has_deferred());
        for n in 0..DEFERRED_LIMIT {
            s.defer(cancel(n)).unwrap();
        }
        let refused = s.defer(cancel(DEFERRED_LIMIT)).unwrap_err();
        assert_eq!(conn(&refused), format!("c{DEFERRED_LIMIT}"));
        assert_eq!(conn(&s.next_deferred().unwrap()), "c0");
        assert_eq!(conn(&s.next_deferred().unwrap()), "c1");
        // Room again for one.
        s.defer(cancel(999)).unwrap();
        let mut last = String::new();
        while let Some(c) = s.next_deferred() {
            last = conn(&c);
        }
        assert_eq!(last, "c999");
        assert!(!s.has_deferred());
    }

    #[test]
    fn an_answer_matches_its_request_by_tag_once() {
        let mut s = side();
        s.sent(7, Inflight::Restore(Restore::Resume));
        s.sent(9, Inflight::Restore(Restore::New));
        assert!(s.answered(8).is_none());
        assert!(matches!(
            s.answered(9),
            Some(Inflight::Restore(Restore::New))
        ));
        assert!(s.answered(9).is_none());
        assert!(s.running_prompts().is_empty());
        assert!(matches!(
            s.answered(7),
            Some(Inflight::Restore(Restore::Resume))
        ));
        assert!(s.inflight.is_empty());
    }
}

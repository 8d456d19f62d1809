//! Calls that are not about a session (`authenticate`, `logout`, extension methods): the
//! agent's business. Each is forwarded to the connection's agent, whose peer task answers the
//! client directly, so no task of acpd waits for the answer; once the connection knows its
//! agent, no round trip to the pool comes first either.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use super::{Connection, Done, MAX_HANDLERS};
use crate::agent::{AgentHandle, WeakAgentHandle};
use crate::error::AcpError;
use acpd_wire::{PeerError, Responder, ResponseError};

/// How often a connection calling its remembered agent tells the pool: the agent's idle
/// time counts from the last call, as if each had asked the pool. Well under the shortest
/// idle stop (1 s), so steady calls never let it look idle.
const TOUCH_EVERY: Duration = Duration::from_millis(250);

/// The connection's way to its agent for calls not about a session.
pub(super) struct AgentCalls {
    /// The agent this connection last reached, held weakly: a connection keeps no agent
    /// running by itself (the pool and sessions decide that).
    known: Option<WeakAgentHandle>,
    touched: Instant,
    /// Calls forwarded and not yet answered: an agent that never answers cannot make a
    /// connection hold unbounded state.
    in_flight: Arc<Semaphore>,
}

impl AgentCalls {
    pub(super) fn new() -> Self {
        AgentCalls {
            known: None,
            touched: Instant::now(),
            in_flight: Arc::new(Semaphore::new(MAX_HANDLERS)),
        }
    }

    /// The remembered agent, while it runs and its link is open (a link that closed is an
    /// agent on its way out: the pool starts the next one).
    fn live(&mut self) -> Option<AgentHandle> {
        let agent = self
            .known
            .as_ref()
            .and_then(WeakAgentHandle::upgrade)
            .filter(AgentHandle::is_live);
        if agent.is_none() {
            self.known = None;
        }
        agent
    }

    /// A handler reached the agent through the pool: later calls go to it directly.
    pub(super) fn reached(&mut self, agent: WeakAgentHandle) {
        self.known = Some(agent);
        self.touched = Instant::now();
    }
}

/// How a failed call reads to the client: acpd's one error mapping.
fn word(e: PeerError) -> ResponseError {
    AcpError::from(e).into()
}

impl Connection {
    /// Forwards a call that is not about a session to this connection's agent; its answer
    /// reaches the client from the agent's peer task.
    pub(super) async fn call_agent(
        &mut self,
        init: Arc<Value>,
        method: String,
        params: Value,
        responder: Responder,
    ) {
        let Ok(permit) = self.calls.in_flight.clone().try_acquire_owned() else {
            return responder
                .respond(Err(AcpError::TooManyInFlight.into()))
                .await;
        };
        if let Some(agent) = self.calls.live() {
            if self.calls.touched.elapsed() >= TOUCH_EVERY {
                self.calls.touched = Instant::now();
                self.ctx.hub.pool().touch(self.agent_key());
            }
            if let Err(pending) = agent.forward(&method, params, responder, permit, word) {
                self.handlers.spawn(async move {
                    pending.send().await;
                    Done::Nothing
                });
            }
            return;
        }
        // Not known yet, or gone: the pool finds (or starts) it.
        let agent = self.agent(init);
        self.handlers.spawn(async move {
            match agent.await {
                Ok(a) => {
                    if let Err(pending) = a.forward(&method, params, responder, permit, word) {
                        pending.send().await;
                    }
                    Done::Reached(a.downgrade())
                }
                Err(e) => {
                    responder.respond(Err(e.into())).await;
                    Done::Nothing
                }
            }
        });
    }
}

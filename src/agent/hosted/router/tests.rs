//! The router's order of events: what a session sends before its request reaches the router
//! before the agent's answer to that request does.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::super::{Process, RouterCommand};
use super::Router;
use crate::agent::AgentEvent;
use acpd_wire::Incoming;

/// The agent's answer (tag 7) to session `s1`'s in-band request.
fn answer() -> Incoming {
    Incoming::Response {
        route: "s1".into(),
        tag: 7,
        result: Box::new(Ok(json!({}))),
    }
}

/// Session `s1`'s registration, its events going to `events`.
fn register(events: mpsc::Sender<AgentEvent>) -> RouterCommand {
    RouterCommand::Register {
        route: "s1".into(),
        agent_session_id: Some("a1".into()),
        events,
    }
}

/// A router on these queues, for an agent that is a task ending when told to; cancel the
/// token to shut it down.
fn start(
    incoming: mpsc::Receiver<Incoming>,
    commands: mpsc::Receiver<RouterCommand>,
) -> (CancellationToken, JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let process = Process::Task {
        join: tokio::spawn(async move { stop.cancelled().await }),
        cancel,
    };
    let shutdown = CancellationToken::new();
    let router = Router::new("scripted", TaskTracker::new()).run(
        process,
        incoming,
        commands,
        CancellationToken::new(),
        CancellationToken::new(),
        shutdown.clone(),
    );
    (shutdown, tokio::spawn(router))
}

/// What session `s1` receives within 5 s, then the router shut down.
async fn first_event(
    session: &mut mpsc::Receiver<AgentEvent>,
    (shutdown, running): (CancellationToken, JoinHandle<()>),
) -> Option<AgentEvent> {
    let got = tokio::time::timeout(Duration::from_secs(5), session.recv()).await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
    got.ok().flatten()
}

/// A session registers its route and then sends an in-band request (`restore_step`). When the
/// router has not run in between (a busy runtime), the agent's answer and the registration
/// wait side by side and the router's loop may take either first. The answer used to find no
/// route when it was taken first, and was dropped: the session waited for it for ever
/// (`session/load` after a restart hung, `new_session::a_kill_right_after_session_new_…`
/// timed out under load). Each round is a fresh router with both ready before its first pass:
/// with the two branches picked at random, 24 rounds passed by chance once in 16 million.
#[tokio::test]
async fn a_route_registered_before_its_request_gets_the_answer_however_busy_the_router_was() {
    for round in 0..24 {
        let (incoming_tx, incoming) = mpsc::channel(8);
        let (commands_tx, commands) = mpsc::channel(8);
        let (events, mut session) = mpsc::channel(8);
        commands_tx
            .try_send(register(events))
            .expect("room for the registration");
        incoming_tx.try_send(answer()).expect("room for the answer");
        let router = start(incoming, commands);
        match first_event(&mut session, router).await {
            Some(AgentEvent::Response { tag: 7, .. }) => {}
            Some(_) => panic!("round {round}: the session got something else first"),
            None => panic!(
                "round {round}: the answer to the session's request never reached it \
                 (routed before the route was registered, and dropped)"
            ),
        }
        drop((incoming_tx, commands_tx));
    }
}

/// A registration that had to wait for room in a full command queue (`AgentHandle::
/// to_router` sends it from a task then) can reach the router after the agent's answer: the
/// answer is held for the route and handed over when the route registers.
#[tokio::test]
async fn an_answer_that_comes_before_its_route_is_held_until_the_route_registers() {
    let (incoming_tx, incoming) = mpsc::channel(8);
    let (commands_tx, commands) = mpsc::channel(8);
    let (events, mut session) = mpsc::channel(8);
    let router = start(incoming, commands);
    incoming_tx.send(answer()).await.expect("the router reads");
    // The router has taken the answer (its queue is empty again) before the route exists.
    let taken = async {
        while incoming_tx.capacity() < incoming_tx.max_capacity() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), taken)
        .await
        .expect("the router takes the answer");
    tokio::time::sleep(Duration::from_millis(20)).await;
    commands_tx
        .send(register(events))
        .await
        .expect("the router reads");
    assert!(
        matches!(
            first_event(&mut session, router).await,
            Some(AgentEvent::Response { tag: 7, .. })
        ),
        "the answer that came first was not handed to the route registered after it"
    );
}

//! The router's order of events: what a session sends before its request reaches the router
//! before the agent's answer to that request does.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::super::{Process, RouterCommand};
use super::Router;
use crate::agent::AgentEvent;
use acpd_wire::Incoming;

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
            .try_send(RouterCommand::Register {
                route: "s1".into(),
                agent_session_id: Some("a1".into()),
                events,
            })
            .expect("room for the registration");
        incoming_tx
            .try_send(Incoming::Response {
                route: "s1".into(),
                tag: 7,
                result: Box::new(Ok(json!({}))),
            })
            .expect("room for the answer");
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
        let running = tokio::spawn(router);
        let got = tokio::time::timeout(Duration::from_secs(5), session.recv()).await;
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
        match got {
            Ok(Some(AgentEvent::Response { tag: 7, .. })) => {}
            Ok(Some(_)) => panic!("round {round}: the session got something else first"),
            Ok(None) | Err(_) => panic!(
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
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let process = Process::Task {
        join: tokio::spawn(async move { stop.cancelled().await }),
        cancel,
    };
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(Router::new("scripted", TaskTracker::new()).run(
        process,
        incoming,
        commands,
        CancellationToken::new(),
        CancellationToken::new(),
        shutdown.clone(),
    ));
    incoming_tx
        .send(Incoming::Response {
            route: "s1".into(),
            tag: 7,
            result: Box::new(Ok(json!({}))),
        })
        .await
        .expect("the router reads");
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
        .send(RouterCommand::Register {
            route: "s1".into(),
            agent_session_id: Some("a1".into()),
            events,
        })
        .await
        .expect("the router reads");
    let got = tokio::time::timeout(Duration::from_secs(5), session.recv()).await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), running).await;
    assert!(
        matches!(got, Ok(Some(AgentEvent::Response { tag: 7, .. }))),
        "the answer that came first was not handed to the route registered after it"
    );
}

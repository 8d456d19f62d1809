//! The router's order of events (what a session sends before its request reaches the router
//! before the agent's answer to that request does) and how far it reads ahead of its sessions.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::super::held::HELD_MAX;
use super::super::{Process, RouterCommand};
use super::{ROUTE_STALL, Router};
use crate::agent::AgentEvent;
use acpd_wire::{Incoming, RawNotification};

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

/// The agent's `n`th update about its session `asid`.
fn update(asid: &str, n: usize) -> Incoming {
    let line = json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": { "sessionId": asid, "update": { "n": n } },
    });
    Incoming::Notification(RawNotification::read(line.to_string()).expect("a notification"))
}

/// The number an update of `update()` carries.
fn number(ev: &AgentEvent) -> u64 {
    let AgentEvent::Notification(n, _) = ev else {
        panic!("not an update: {ev:?}");
    };
    n.params_value().expect("params")["update"]["n"]
        .as_u64()
        .expect("n")
}

/// Waits (bounded) until `session` holds `n` events.
async fn until_queued(session: &mpsc::Receiver<AgentEvent>, n: usize) {
    let filled = async {
        while session.len() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), filled)
        .await
        .unwrap_or_else(|_| panic!("{} of {n} events routed", session.len()));
}

/// The router reads no further ahead of its sessions than `HELD_MAX` updates: with a
/// thousand sessions streaming, the agent's output used to pile up in their queues (1 024
/// each) and an update waited seconds behind it. Once the session has taken half, reading goes
/// on, and every update arrives once and in order.
#[tokio::test]
async fn the_router_holds_no_more_than_held_max_updates_its_sessions_have_not_taken() {
    let total = HELD_MAX as usize + 1000;
    let (incoming_tx, incoming) = mpsc::channel(total);
    let (commands_tx, commands) = mpsc::channel(8);
    // Room for all of them: only the budget can stop the router.
    let (events, mut session) = mpsc::channel(2 * total);
    commands_tx.send(register(events)).await.expect("router");
    let router = start(incoming, commands);
    for n in 0..total {
        incoming_tx.send(update("a1", n)).await.expect("router");
    }
    until_queued(&session, HELD_MAX as usize).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(session.len(), HELD_MAX as usize, "routed past the budget");
    let mut next = 0;
    while next < total {
        let ev = tokio::time::timeout(Duration::from_secs(5), session.recv())
            .await
            .unwrap_or_else(|_| panic!("update {next} never came (reading did not go on)"))
            .expect("the route");
        assert_eq!(number(&ev), next as u64);
        next += 1;
    }
    router.0.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), router.1).await;
    drop((incoming_tx, commands_tx));
}

/// A session that takes nothing while it holds the whole budget is cut from the agent after
/// `ROUTE_STALL` (it hears the agent is gone for it), and the agent's other sessions go on
/// (real time: ~12 s).
#[tokio::test]
async fn a_session_that_takes_nothing_for_long_does_not_stop_its_agents_other_sessions() {
    let (incoming_tx, incoming) = mpsc::channel(2 * HELD_MAX as usize);
    let (commands_tx, commands) = mpsc::channel(8);
    let (events, mut stuck) = mpsc::channel(2 * HELD_MAX as usize);
    let (other_events, mut other) = mpsc::channel(8);
    commands_tx.send(register(events)).await.expect("router");
    commands_tx
        .send(RouterCommand::Register {
            route: "s2".into(),
            agent_session_id: Some("a2".into()),
            events: other_events,
        })
        .await
        .expect("router");
    let router = start(incoming, commands);
    for n in 0..HELD_MAX as usize {
        incoming_tx.send(update("a1", n)).await.expect("router");
    }
    incoming_tx.send(update("a2", 0)).await.expect("router");
    let got = tokio::time::timeout(ROUTE_STALL * 3, other.recv()).await;
    let ev = got.expect("the other session's update").expect("its route");
    assert_eq!(number(&ev), 0);
    // The stuck one is told, after everything routed to it.
    for n in 0..HELD_MAX as u64 {
        assert_eq!(number(&stuck.recv().await.expect("its updates")), n);
    }
    let last = tokio::time::timeout(Duration::from_secs(5), stuck.recv()).await;
    assert!(
        matches!(last, Ok(Some(AgentEvent::Exited { .. }))),
        "{last:?}"
    );
    router.0.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), router.1).await;
    drop((incoming_tx, commands_tx));
}

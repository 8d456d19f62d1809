//! Calls not about a session (`authenticate`, extension methods): forwarded to the
//! connection's agent and answered from there, across the agent's death, under the bound on
//! calls in flight, and without upsetting the agent's idle stop.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::daemon::{process_alive, wait_all_dead};
use crate::support::{Client, Daemon, DaemonOptions};

/// Calls one connection may have out at once (`MAX_HANDLERS` in `acp/connection.rs`).
const IN_FLIGHT: usize = 1024;
/// acpd's code for a request it refuses to take on now (`acp/rate.rs`).
const RATE_LIMITED: i64 = -32005;

/// The live agent processes other than `old`.
fn live_agents_except(daemon: &Daemon, old: &[i32]) -> Vec<i32> {
    daemon
        .agent_pids()
        .into_iter()
        .filter(|p| !old.contains(p) && process_alive(*p))
        .collect()
}

/// A client whose connection has reached (and so remembers) the agent, and the agent's pid.
async fn caller(daemon: &Daemon) -> (Client, i32) {
    let mut client = daemon.client().await;
    let echoed = client.request("_scripted/echo", json!({ "n": 0 })).await;
    assert_eq!(echoed.unwrap(), json!({ "n": 0 }));
    let pids = daemon.agent_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    (client, pids[0])
}

fn sigkill(pid: i32) {
    // SAFETY: plain kill(2) on a pid the test's daemon started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
}

#[tokio::test]
async fn a_call_out_when_the_agent_dies_is_answered_and_the_next_reaches_a_new_agent() {
    let daemon = Daemon::start().await;
    let (mut client, first) = caller(&daemon).await;
    let stuck = client.send_request("_scripted/hang", json!({})).await;
    // The agent reads in order: once this is answered, it holds the stuck call.
    client
        .request("_scripted/echo", json!({ "n": 2 }))
        .await
        .unwrap();
    sigkill(first);
    let err = client.wait_response(&stuck).await.unwrap_err();
    assert_eq!(err.code, -32603, "{err}");
    assert!(err.message.contains("agent"), "{err}");
    // The same connection's next call starts and reaches a new process.
    let echoed = client.request("_scripted/echo", json!({ "n": 3 })).await;
    assert_eq!(echoed.unwrap(), json!({ "n": 3 }));
    assert_eq!(live_agents_except(&daemon, &[first]).len(), 1);
}

#[tokio::test]
async fn calls_beyond_the_bound_in_flight_are_refused_and_the_connection_lives_on() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-requests-per-second", 0)).await;
    let (mut client, agent) = caller(&daemon).await;
    let mut stuck = Vec::with_capacity(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        stuck.push(client.send_request("_scripted/hang", json!({})).await);
    }
    let err = client
        .request("_scripted/echo", json!({ "n": 1 }))
        .await
        .unwrap_err();
    assert_eq!(err.code, RATE_LIMITED, "{err}");
    // Sessions are not held up by the agent's stuck calls.
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "echo still here").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    // The agent dies: every stuck call is answered, and the bound is free again.
    sigkill(agent);
    for id in &stuck {
        let err = client.wait_response(id).await.unwrap_err();
        assert_eq!(err.code, -32603, "{err}");
    }
    let echoed = client.request("_scripted/echo", json!({ "n": 2 })).await;
    assert_eq!(echoed.unwrap(), json!({ "n": 2 }));
}

#[tokio::test]
async fn steady_calls_keep_the_agent_from_idling_and_it_stops_once_they_end() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--agent-idle-stop-secs", 1)).await;
    let (mut client, agent) = caller(&daemon).await;
    let pids = [agent];
    // Three idle periods of calls, no session: the agent is in use all along.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        client
            .request("_scripted/echo", json!({ "n": 1 }))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(process_alive(pids[0]), "the agent stopped while in use");
    assert!(live_agents_except(&daemon, &pids).is_empty());
    // No calls, no sessions: it stops, although this connection remembers it.
    let alive = wait_all_dead(&pids, Duration::from_secs(15)).await;
    assert!(alive.is_empty(), "an unused agent kept running: {alive:?}");
    let echoed = client.request("_scripted/echo", json!({ "n": 2 })).await;
    assert_eq!(echoed.unwrap(), json!({ "n": 2 }));
    assert_eq!(live_agents_except(&daemon, &pids).len(), 1);
}

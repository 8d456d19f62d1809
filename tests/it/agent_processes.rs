//! Hosted agent processes: a crash fails only the running prompt, and no agent process
//! outlives acpd, whether it is SIGKILLed or shut down with SIGTERM.

use std::time::Duration;

use crate::support::daemon::wait_all_dead;
use crate::support::{Client, Daemon, agent_texts};

#[tokio::test]
async fn agent_crash_mid_turn_fails_the_prompt_and_the_session_recovers() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(5));
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo before; crash").await;
    let err = result.expect_err("a crashed agent cannot end the turn normally");
    assert_eq!(err.code, -32603, "{err}");
    assert!(
        err.message.to_lowercase().contains("exit"),
        "the message should say the agent exited: {err}"
    );
    assert_eq!(agent_texts(&updates), ["before"]);

    let (updates, result) = client.prompt(&sid, "echo after").await;
    assert_eq!(
        result.expect("the next prompt works")["stopReason"],
        "end_turn"
    );
    assert_eq!(agent_texts(&updates), ["after"]);
}

/// Sessions on both agent profiles, so that at least one agent process runs.
async fn start_agents(daemon: &Daemon) -> Vec<i32> {
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.prompt(&sid, "echo hi").await.1.unwrap();
    let mut other = Client::connect_ws(&format!("{}?agent=noload", daemon.ws_url()))
        .await
        .unwrap();
    other.initialize().await;
    let sid = other.open_session(&daemon.work_dir()).await;
    other.prompt(&sid, "echo hi").await.1.unwrap();
    let pids = daemon.agent_pids();
    assert!(
        !pids.is_empty(),
        "no agent wrote its pid into {}",
        daemon.pid_dir().display()
    );
    pids
}

#[tokio::test]
async fn no_agent_outlives_a_killed_daemon() {
    let mut daemon = Daemon::start().await;
    let pids = start_agents(&daemon).await;
    daemon.kill().await;
    let alive = wait_all_dead(&pids, Duration::from_secs(5)).await;
    assert!(
        alive.is_empty(),
        "agent processes outlived acpd (SIGKILL): {alive:?}"
    );
}

#[tokio::test]
async fn sigterm_shuts_down_cleanly() {
    let mut daemon = Daemon::start().await;
    let pids = start_agents(&daemon).await;
    let status = daemon.sigterm().await;
    assert!(status.success(), "acpd exited with {status} on SIGTERM");
    let alive = wait_all_dead(&pids, Duration::from_secs(5)).await;
    assert!(
        alive.is_empty(),
        "agent processes outlived acpd (SIGTERM): {alive:?}"
    );
}

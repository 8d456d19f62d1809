//! An agent that stops reading its stdin never holds up acpd: its sessions' actors go on
//! answering what needs no agent, and once a write to its stdin has made no progress for the
//! deadline (30 s) the agent is cut and its sessions restore as after a crash.

use std::time::Duration;

use serde_json::json;
use tokio::time::{Instant, timeout};

use crate::support::{Daemon, agent_texts};

#[tokio::test]
async fn an_agent_that_stops_reading_its_stdin_is_cut_and_its_sessions_go_on() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let cwd = daemon.work_dir();
    let sid = client.open_session(&cwd).await;
    let other = client.open_session(&cwd).await;
    let (_, result) = client.prompt(&sid, "stop_reading; echo deaf").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");

    // More than its stdin pipe holds (64 KiB), none of it read.
    let pad = "x".repeat(16 * 1024);
    let mut asked = vec![];
    for _ in 0..16 {
        let params = json!({ "sessionId": sid, "modeId": "default", "_meta": { "pad": pad } });
        asked.push(client.send_request("session/set_mode", params).await);
    }
    let stalled_at = Instant::now();

    // The session's actor is not waiting on the agent: a second client attaches at once.
    let mut second = daemon.client().await;
    let attach = second.request(
        "_acpd/session/attach",
        json!({ "sessionId": sid, "afterSeq": 0 }),
    );
    timeout(Duration::from_secs(2), attach)
        .await
        .expect("the session answers while its agent reads nothing")
        .expect("attach");

    // The agent is cut after the deadline: what it never read is answered with an error.
    for id in &asked {
        let answer = client.wait_response(id).await;
        assert!(answer.is_err(), "{answer:?}");
    }
    let waited = stalled_at.elapsed();
    assert!(waited < Duration::from_secs(45), "cut after {waited:?}");

    // Restored as after a crash: both sessions of the agent take prompts again.
    for s in [&sid, &other] {
        let (updates, result) = client.prompt(s, "echo back").await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
        assert_eq!(agent_texts(&updates), ["back"]);
    }
}

//! One hosted agent under a burst: more requests at once than acpd's queues to it and its
//! stdin pipe hold (the benchmark's `fanout` row sends 1 000 prompts at once) are queued, not
//! taken for an agent that stopped reading; only the stdin write deadline (30 s without
//! progress) cuts an agent (`agent_stdin`). And hundreds of sessions streaming at once over a
//! few connections all end `end_turn` with every chunk once and in order, on the process that
//! started, while the router stops and goes on reading the agent (`hosted/held.rs`).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::support::{Daemon, DaemonOptions, agent_texts};

/// The agent's log line when a session cuts it.
const CUT: &str = "cutting it";

#[tokio::test]
async fn a_burst_of_requests_while_the_agent_reads_nothing_for_a_while_is_queued_not_cut() {
    // No request rate limit: the burst is the point (the benchmark runs without one too).
    let opts = DaemonOptions::default().arg("--max-requests-per-second", 0);
    let daemon = Daemon::start_with(opts).await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let cwd = daemon.work_dir();
    let sid = client.open_session(&cwd).await;
    // Busy for 5 s (well within the 30 s deadline): its stdin unread meanwhile.
    let (_, result) = client.prompt(&sid, "stop_reading 5000; echo busy").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");

    // 2 000 requests of ~300 B: far more than the pipe (64 KiB) and acpd's queues to the agent
    // held before (3 × 256 messages).
    let pad = "x".repeat(256);
    let mut asked = Vec::new();
    for _ in 0..2000 {
        let params = json!({ "sessionId": sid, "modeId": "default", "_meta": { "pad": pad } });
        asked.push(client.send_request("session/set_mode", params).await);
    }
    for id in &asked {
        client
            .wait_response(id)
            .await
            .expect("the agent answers every request once it reads again");
    }
    let (updates, result) = client.prompt(&sid, "echo back").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["back"]);
    let log = std::fs::read_to_string(daemon.log_path()).unwrap_or_default();
    assert!(!log.contains(CUT), "the agent was cut");
    assert_eq!(log.matches("agent process started").count(), 1);
}

/// Connections, sessions on each, chunks per session.
const CONNS: usize = 4;
const PER_CONN: usize = 50;
const TICKS: usize = 100;

#[tokio::test]
async fn an_agent_streaming_to_two_hundred_sessions_at_once_is_never_cut_and_loses_nothing() {
    let daemon = Daemon::start_with(DaemonOptions::default().sqlite()).await;
    let cwd = daemon.work_dir();
    let mut clients = Vec::new();
    for _ in 0..CONNS {
        let mut c = daemon.client().await.with_timeout(Duration::from_secs(120));
        let mut sids = Vec::new();
        for _ in 0..PER_CONN {
            sids.push(c.open_session(&cwd).await);
        }
        clients.push((c, sids));
    }
    let script = format!("tick {TICKS} 0");
    let turns = clients.iter_mut().map(|(c, sids)| {
        let script = script.clone();
        async move {
            let mut asked = Vec::new();
            for sid in sids.iter() {
                asked.push(c.send_prompt(sid, &script).await);
            }
            let mut ends = Vec::new();
            for id in &asked {
                ends.push(c.wait_response(id).await);
            }
            let updates = c.take_buffered_updates();
            (ends, updates)
        }
    });
    let results = futures_util::future::join_all(turns).await;
    for (ends, updates) in results {
        for end in ends {
            let end = end.expect("every turn ends without an error");
            assert_eq!(end["stopReason"], "end_turn");
        }
        // Every chunk once and in order, per session: the router stops and goes on reading
        // the agent many times here (it holds at most `HELD_MAX` of them for all sessions).
        let mut seen: HashMap<&str, u64> = HashMap::new();
        for u in updates
            .iter()
            .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        {
            let sid = u["sessionId"].as_str().expect("sessionId");
            let n = u["update"]["_meta"]["scripted"]["n"].as_u64();
            let last = seen.entry(sid).or_default();
            assert_eq!(
                n,
                Some(*last + 1),
                "session {sid}: lost, repeated or reordered"
            );
            *last += 1;
        }
        assert_eq!(seen.len(), PER_CONN, "every session streamed");
        assert!(seen.values().all(|&n| n == TICKS as u64), "{seen:?}");
    }
    let log = std::fs::read_to_string(daemon.log_path()).unwrap_or_default();
    assert!(!log.contains(CUT), "the agent was cut");
    assert_eq!(
        log.matches("agent process started").count(),
        1,
        "the agent was replaced under load"
    );
}

//! Nothing is lost when the network or the daemon is: a turn outlives its socket, requests
//! wait for the next client, and sessions survive a SIGKILL of acpd.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{
    Daemon, DaemonOptions, agent_texts, assert_consecutive, chunk_text, kind, seq,
};

/// The `stream` chunks of `updates`, checked to be exactly `0..n` in order.
fn assert_full_stream(updates: &[Value], n: usize) {
    let texts: Vec<&str> = updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .filter_map(chunk_text)
        .collect();
    assert_eq!(texts.len(), n, "every streamed chunk exactly once");
    for (i, text) in texts.iter().enumerate() {
        assert!(text.starts_with(&format!("{i}:")), "chunk {i} is {text}");
    }
}

#[tokio::test]
async fn socket_closed_mid_turn_loses_nothing() {
    const N: usize = 3000;
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await.with_timeout(Duration::from_secs(30));
    let sid = first.open_session(&daemon.work_dir()).await;
    first.send_prompt(&sid, &format!("stream {N} 32")).await;
    // Leave abruptly (no close frame) once the turn is well under way.
    first
        .collect_updates_until("chunk 100", |us| {
            us.iter()
                .any(|u| chunk_text(u).is_some_and(|t| t.starts_with("100:")))
        })
        .await;
    drop(first);

    let mut second = daemon.client().await.with_timeout(Duration::from_secs(30));
    // Every seq, one by one (a load would merge the turn's chunks into one message).
    let (mut updates, result) = second.attach_after(&sid, 0).await;
    result.expect("attach from the start while the turn runs");
    // The turn may still be running: the rest arrives live after the load response.
    let last = format!("{}:", N - 1);
    if !updates
        .iter()
        .any(|u| chunk_text(u).is_some_and(|t| t.starts_with(&last)))
    {
        let live = second
            .collect_updates_until("the last streamed chunk", |us| {
                us.iter()
                    .any(|u| chunk_text(u).is_some_and(|t| t.starts_with(&last)))
            })
            .await;
        updates.extend(live);
    }
    let seqs: Vec<i64> = updates.iter().map(seq).collect();
    assert_eq!(
        seqs.iter().collect::<HashSet<_>>().len(),
        seqs.len(),
        "a seq was delivered twice"
    );
    let turn: Vec<Value> = updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .cloned()
        .collect();
    assert_consecutive(&turn);
    assert_full_stream(&turn, N);

    // Once the turn is over, a fresh attach from the start shows the very same journal.
    let mut third = daemon.client().await.with_timeout(Duration::from_secs(30));
    let (again, result) = third.attach_after(&sid, 0).await;
    result.unwrap();
    assert_eq!(again.iter().map(seq).collect::<Vec<_>>(), seqs);
}

/// The permission request reached a client that left without answering: acpd gives it to
/// the next client that attaches to the session.
#[tokio::test]
async fn unanswered_request_is_reissued_to_the_next_client() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--pending-request-timeout-ms", 20_000))
            .await;
    let mut first = daemon.client().await;
    let sid = first.open_session(&daemon.work_dir()).await;
    first.editor.hold("session/request_permission");
    first
        .send_prompt(&sid, "permission; echo after permission")
        .await;
    first.wait_held_request("session/request_permission").await;
    drop(first);

    let mut second = daemon.client().await;
    second.editor.permission = crate::support::PermissionChoice::Select("allow-always".into());
    let (mut updates, result) = second.load(&sid, &daemon.work_dir()).await;
    result.expect("session/load");
    // The answer races the replay: what the agent said after it may come within the replay
    // (journaled by the time the replay's page is read, merged into one message with what
    // the agent said before it) or live after the load's answer.
    let words = |us: &[Value]| agent_texts(us).concat();
    if !words(&updates).contains("after permission") {
        updates.extend(second.updates_until_text("after permission").await);
    }
    assert!(
        words(&updates).contains("permission: selected allow-always"),
        "{updates:?}"
    );
    let asked: Vec<&Value> = second
        .received_requests
        .iter()
        .filter(|r| r["method"] == "session/request_permission")
        .collect();
    assert_eq!(asked.len(), 1, "re-issued exactly once");
    assert_eq!(asked[0]["params"]["sessionId"], sid.as_str());
}

/// The agent asks while no client is attached at all: the request waits for the next client.
#[tokio::test]
async fn request_while_detached_waits_for_the_next_client() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--pending-request-timeout-ms", 20_000))
            .await;
    let file = daemon.work_dir().join("later.txt");
    std::fs::write(&file, "read while away").unwrap();
    let mut first = daemon.client().await;
    let sid = first.open_session(&daemon.work_dir()).await;
    // The agent asks a second after the turn starts; the client is long gone by then.
    let script = format!("sleep 1000; read {}; echo done", file.display());
    first.send_prompt(&sid, &script).await;
    drop(first);
    // The daemon says when the request is waiting with nobody attached.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(daemon.log_path())
        .unwrap()
        .contains("agent request waits for a client to attach")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent's request never waited for a client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut second = daemon.client().await;
    let id = second
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": 0 }),
        )
        .await;
    second.wait_response(&id).await.expect("attach");
    let updates = second.updates_until_text("done").await;
    assert!(
        agent_texts(&updates).contains(&"read: read while away".to_string()),
        "{updates:?}"
    );
    assert!(
        second
            .received_requests
            .iter()
            .any(|r| r["method"] == "fs/read_text_file")
    );
}

#[tokio::test]
async fn sessions_survive_a_daemon_kill() {
    let mut daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.new_session(&daemon.work_dir()).await;
    let mut seen = vec![client.next_update().await];
    let (turn, result) = client
        .prompt(&sid, "title Survivor; echo before the crash")
        .await;
    result.unwrap();
    seen.extend(turn);
    drop(client);

    daemon.restart().await;

    let mut client = daemon.client().await;
    let listed = client
        .list(Some(&daemon.work_dir()), None)
        .await
        .expect("session/list after restart");
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{listed}");
    assert_eq!(sessions[0]["sessionId"], sid.as_str());
    assert_eq!(sessions[0]["title"], "Survivor");

    let (replayed, result) = client.load(&sid, &daemon.work_dir()).await;
    result.expect("session/load after restart");
    let agent_side: Vec<&Value> = replayed
        .iter()
        .filter(|u| kind(u) != "user_message_chunk")
        .collect();
    // The history, then the session's state (its commands), as the agent's own load.
    let seen = crate::support::as_replayed(&seen);
    assert_eq!(agent_side.len(), seen.len(), "{replayed:?}");
    for (r, s) in agent_side.iter().zip(&seen) {
        assert_eq!((seq(r), &r["update"]), (seq(s), &s["update"]));
    }
    assert!(replayed.iter().any(|u| kind(u) == "user_message_chunk"));

    // The agent process is new; acpd re-creates the agent side of the session.
    let (turn, result) = client.prompt(&sid, "echo after the crash").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&turn), ["after the crash"]);
    assert!(turn.iter().all(|u| seq(u) > seq(seen.last().unwrap())));
}

/// SQLite's WAL is checkpointed by a task of the store's own (the pool's connections never
/// checkpoint inside a commit): while the daemon runs, what it journals reaches the database
/// file.
#[tokio::test]
async fn the_journal_reaches_the_sqlite_file_while_the_daemon_runs() {
    let daemon = Daemon::start_with(DaemonOptions::default().sqlite()).await;
    let db = daemon.dir().join("acpd.db");
    let before = std::fs::metadata(&db).expect("the SQLite file").len();
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let sid = client.open_session(&daemon.work_dir()).await;
    // About 8 MiB of journal, far past SQLite's 1000-page (4 MiB) WAL threshold.
    let (_, result) = client.prompt(&sid, "stream 30000 256").await;
    assert_eq!(result.expect("stream")["stopReason"], "end_turn");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = std::fs::metadata(&db).expect("the SQLite file").len();
        if now >= before + 4 * 1024 * 1024 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the database file stayed at {now} bytes (from {before}): nothing checkpointed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The WAL starts over once it holds 16 MiB (`checkpoint.rs`): a daemon that journals far
/// more than that keeps a WAL of about that size, not one as big as all it ever wrote (a
/// PASSIVE checkpoint alone never lets a WAL under steady writes start over).
#[tokio::test]
async fn the_sqlite_wal_stays_bounded_while_the_daemon_journals() {
    const N: usize = 48_000;
    const BOUND: u64 = 40 << 20;
    let daemon = Daemon::start_with(DaemonOptions::default().sqlite()).await;
    let wal = daemon.dir().join("acpd.db-wal");
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(180));
    let sid = client.open_session(&daemon.work_dir()).await;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(async move {
        let mut largest = 0;
        loop {
            let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
            largest = largest.max(size);
            tokio::select! {
                _ = &mut stopped => return largest,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    });
    // About 60 MiB of journal: every chunk is 1 KiB of text in its envelope.
    let (turn, result) = client.prompt(&sid, &format!("stream {N} 1024")).await;
    assert_eq!(result.expect("stream")["stopReason"], "end_turn");
    assert_full_stream(&turn, N);
    let _ = stop.send(());
    let largest = watcher.await.expect("the watcher");
    assert!(
        largest <= BOUND,
        "the WAL grew to {largest} bytes while the daemon journaled"
    );
    assert!(largest > 0, "the daemon journaled into a WAL");
}

//! Journal retention: over the per-session cap, message chunks are merged (load still shows
//! the whole message); when merging is not enough the oldest entries go.

use std::time::Duration;

use serde_json::Value;

use crate::support::{Daemon, DaemonOptions};

fn chunk_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// Loads the session (on a fresh connection) until `done` holds for the replay.
async fn load_until(daemon: &Daemon, sid: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = daemon.client().await;
        let (updates, result) = client.load(sid, &daemon.work_dir()).await;
        result.expect("load");
        if done(&updates) {
            return updates;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never happened: {} entries",
            updates.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn over_the_cap_chunks_are_merged_and_load_still_shows_the_message() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--journal-max-entries", 50)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (live, result) = client.prompt(&sid, "stream 200 8").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let live_text: String = chunk_texts(&live).concat();

    let replay = load_until(&daemon, &sid, |u| u.len() <= 50).await;
    let texts = chunk_texts(&replay);
    assert_eq!(texts.len(), 1, "the 200 chunks are one entry now");
    assert_eq!(
        texts[0], live_text,
        "the merged message is the whole message"
    );
    let seqs: Vec<i64> = replay
        .iter()
        .map(|u| u["_meta"]["acpd"]["seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs still ascend: {seqs:?}"
    );
    assert_eq!(
        *seqs.last().unwrap(),
        live.last().unwrap()["_meta"]["acpd"]["seq"]
            .as_i64()
            .unwrap()
    );

    // The session goes on: new updates continue the seq.
    let (more, result) = client.prompt(&sid, "echo after").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert!(more[0]["_meta"]["acpd"]["seq"].as_i64().unwrap() > *seqs.last().unwrap());
}

#[tokio::test]
async fn when_merging_is_not_enough_the_oldest_entries_go() {
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--journal-max-entries", 6)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    for i in 0..5 {
        let (_, result) = client.prompt(&sid, &format!("echo turn {i}")).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
    }
    let replay = load_until(&daemon, &sid, |u| u.len() <= 6).await;
    assert_eq!(replay.len(), 6);
    assert_eq!(
        chunk_texts(&replay).last().map(String::as_str),
        Some("turn 4"),
        "the newest are kept"
    );
}

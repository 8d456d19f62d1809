//! A prompt turn through acpd: updates relayed with journal seqs, in order, before the
//! response; unknown update kinds and `_meta` untouched; the user's prompt not echoed.

use std::time::Duration;

use serde_json::json;

use crate::support::{
    Daemon, DaemonOptions, agent_texts, assert_consecutive, assert_increasing, chunk_text, kind,
    seq, seqs,
};

#[tokio::test]
async fn turn_updates_carry_consecutive_seqs_and_acpds_session_id() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.new_session(&daemon.work_dir()).await;
    let bootstrap = client.next_update().await;

    let (first, result) = client.prompt(&sid, "echo a; thought b; tool; echo c").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    let kinds: Vec<&str> = first.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "agent_message_chunk",
            "agent_thought_chunk",
            "tool_call",
            "tool_call_update",
            "agent_message_chunk"
        ],
        "the user's prompt is journaled but not echoed to its sender"
    );
    assert!(
        first.iter().all(|u| u["sessionId"] == sid.as_str()),
        "{first:?}"
    );
    assert_consecutive(&first);
    assert!(seq(&first[0]) > seq(&bootstrap));
    // The agent's own `_meta` inside the update is kept.
    assert_eq!(first[0]["update"]["_meta"]["scripted"]["n"], 1);

    let (second, _) = client.prompt(&sid, "echo d; echo e").await;
    assert_eq!(agent_texts(&second), ["d", "e"]);
    assert_consecutive(&second);
    assert!(
        seq(&second[0]) > seq(first.last().unwrap()),
        "seqs increase across turns"
    );
}

#[tokio::test]
async fn unknown_update_kinds_are_relayed_verbatim() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "unknown_update").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(
        updates[0]["update"],
        json!({ "sessionUpdate": "acpd_test_unknown_kind", "payload": { "x": 1 }, "_meta": { "scripted": { "kept": true } } })
    );
    seq(&updates[0]);
}

#[tokio::test]
async fn stop_reasons_and_prompt_errors_are_relayed() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo partial; stop max_tokens").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "max_tokens" }));
    assert_eq!(agent_texts(&updates), ["partial"]);
    let (_, result) = client.prompt(&sid, "error -32042 scripted failure").await;
    let err = result.unwrap_err();
    assert_eq!(err.code, -32042, "{err}");
    // The session still works after an agent-side error.
    let (updates, _) = client.prompt(&sid, "echo fine").await;
    assert_eq!(agent_texts(&updates), ["fine"]);
}

#[tokio::test]
async fn ten_thousand_updates_arrive_complete_and_in_order() {
    const N: usize = 10_000;
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(90));
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, &format!("stream {N} 64")).await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    assert_eq!(
        updates.len(),
        N,
        "every update arrives before the prompt response"
    );
    for (i, update) in updates.iter().enumerate() {
        let text = chunk_text(update)
            .unwrap_or_else(|| panic!("update {i} is not a text chunk: {update}"));
        assert!(
            text.starts_with(&format!("{i}:")),
            "update {i} out of order: {text}"
        );
        assert_eq!(text.len(), 64);
    }
    assert_consecutive(&updates);
    let s = seqs(&updates);
    assert_eq!(s[N - 1] - s[0], N as i64 - 1);
}

#[tokio::test]
async fn a_prompt_ends_the_bootstrap_hold_of_its_own_session() {
    // Updates of a new session are held after its answer, for editors that register a session
    // late (zed-industries/zed#60199). A client that prompts the session has registered it:
    // its turn must not wait out the hold (a minute here; the client gives up after seconds).
    let opts = DaemonOptions::default().arg("--bootstrap-delay-ms", 60_000);
    let daemon = Daemon::start_with(opts).await;
    let mut client = daemon.client().await;
    let sid = client.new_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo at once").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    assert!(
        agent_texts(&updates).contains(&"at once".to_owned()),
        "{updates:?}"
    );
    // What was held went first, in journal order (the prompt's own block is not echoed).
    assert_eq!(
        kind(&updates[0]),
        "available_commands_update",
        "{updates:?}"
    );
    assert_increasing(&updates);
}

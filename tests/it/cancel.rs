//! `session/cancel` through acpd: the prompt answers `cancelled` (never an error), a pending
//! permission request is withdrawn from the client and the agent is told `cancelled`. Whatever
//! the agent does: one answering `end_turn`, one ignoring the cancel (acpd answers after the
//! grace and keeps the turn's late output out of the next one).

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::{
    Client, Daemon, DaemonOptions, PermissionChoice, RpcError, agent_texts, kind,
};

#[tokio::test]
async fn cancel_mid_turn_answers_cancelled() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let prompt = client
        .send_prompt(&sid, "echo started; wait_for_cancel; echo never")
        .await;
    client.updates_until_text("started").await;
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let (updates, result) = client.collect_updates_until_response(&prompt).await;
    assert_eq!(
        result.expect("cancel is not an error"),
        json!({ "stopReason": "cancelled" })
    );
    assert!(
        !agent_texts(&updates).contains(&"never".to_string()),
        "{updates:?}"
    );

    let (updates, result) = client.prompt(&sid, "echo next turn").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["next turn"]);
}

#[tokio::test]
async fn cancel_withdraws_a_pending_permission_request() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.editor.hold("session/request_permission");
    let prompt = client.send_prompt(&sid, "permission; echo never").await;
    let held = client.wait_held_request("session/request_permission").await;
    assert_eq!(held["params"]["sessionId"], sid.as_str());
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;

    let withdrawn = client
        .next_notification_where("$/cancel_request", |m| m["method"] == "$/cancel_request")
        .await;
    assert_eq!(
        withdrawn["params"]["requestId"], held["id"],
        "the held request is the one withdrawn"
    );
    let (updates, result) = client.collect_updates_until_response(&prompt).await;
    assert_eq!(
        result.expect("cancel is not an error"),
        json!({ "stopReason": "cancelled" })
    );
    assert_eq!(
        agent_texts(&updates),
        ["permission: cancelled"],
        "the agent was told cancelled"
    );

    // Answering the withdrawn request late must not disturb anything.
    let late = json!({ "outcome": { "outcome": "selected", "optionId": "allow-once" } });
    client.respond(&held["id"], Ok(late)).await;
    client.editor.hold.clear();
    let (updates, _) = client.prompt(&sid, "permission").await;
    assert_eq!(agent_texts(&updates), ["permission: selected allow-once"]);
}

#[tokio::test]
async fn permission_answered_cancelled_ends_the_turn_cancelled() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.editor.permission = PermissionChoice::Cancelled;
    let (updates, result) = client.prompt(&sid, "permission; echo never").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
    assert_eq!(agent_texts(&updates), ["permission: cancelled"]);
}

/// The grace the tests below give the agent: short, so acpd answering itself is quick.
const GRACE_MS: u64 = 400;

async fn daemon_with_grace() -> Daemon {
    Daemon::start_with(DaemonOptions::default().arg("--cancel-grace-ms", GRACE_MS)).await
}

/// Sends `script`, waits for "started", cancels; returns the turn's updates, its answer and
/// how long the answer took after the cancel.
async fn cancel_turn(
    client: &mut Client,
    sid: &str,
    script: &str,
) -> (Vec<Value>, Result<Value, RpcError>, Duration) {
    let prompt = client.send_prompt(sid, script).await;
    let mut updates = client.updates_until_text("started").await;
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let at = Instant::now();
    let (more, result) = client.collect_updates_until_response(&prompt).await;
    updates.extend(more);
    (updates, result, at.elapsed())
}

/// The `_meta.acpd.cancel` notes acpd journaled for a session (read back by a load).
async fn cancel_notes(daemon: &Daemon, sid: &str) -> Vec<Value> {
    let mut other = daemon.client().await;
    let (replayed, result) = other.load(sid, &daemon.work_dir()).await;
    result.expect("session/load");
    replayed
        .iter()
        .filter_map(|u| u.pointer("/update/_meta/acpd/cancel").cloned())
        .collect()
}

#[tokio::test]
async fn an_agent_answering_end_turn_after_cancel_is_reported_cancelled() {
    let daemon = daemon_with_grace().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result, took) = cancel_turn(
        &mut client,
        &sid,
        "echo started; cancel_answer end_turn; wait_for_cancel",
    )
    .await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
    assert!(took < Duration::from_millis(GRACE_MS + 1500), "{took:?}");
    let (updates, result) = client.prompt(&sid, "echo next turn").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["next turn"]);
    let notes = cancel_notes(&daemon, &sid).await;
    assert_eq!(
        notes,
        [json!({ "outcome": "rewritten", "agentStopReason": "end_turn" })]
    );
}

#[tokio::test]
async fn an_agent_ignoring_cancel_is_answered_by_acpd_and_its_late_output_dropped() {
    let daemon = daemon_with_grace().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result, took) = cancel_turn(
        &mut client,
        &sid,
        "echo started; ignore_cancel; sleep 2500; echo late; tool; stop end_turn",
    )
    .await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
    assert!(
        took < Duration::from_millis(2000),
        "answered within the grace, not when the agent ended: {took:?}"
    );
    assert_eq!(agent_texts(&updates), ["started"]);

    // Sent while the agent is still in the cancelled turn: it waits for it, and carries
    // none of its output.
    let (updates, result) = client.prompt(&sid, "echo next turn").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["next turn"], "{updates:?}");
    assert!(
        updates.iter().all(|u| kind(u) != "tool_call"),
        "{updates:?}"
    );

    let notes = cancel_notes(&daemon, &sid).await;
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert_eq!(notes[0], json!({ "outcome": "graceExpired" }));
    assert_eq!(notes[1]["outcome"], "lateAnswerDropped");
    assert_eq!(notes[1]["agentStopReason"], "end_turn");
    // "late", the tool call and its update.
    assert_eq!(notes[1]["droppedUpdates"], 3);
}

#[tokio::test]
async fn an_agent_answering_cancelled_is_passed_on_within_the_grace() {
    let daemon = daemon_with_grace().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result, took) = cancel_turn(
        &mut client,
        &sid,
        "echo started; wait_for_cancel; echo never",
    )
    .await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
    assert!(took < Duration::from_millis(GRACE_MS + 1500), "{took:?}");
    assert!(cancel_notes(&daemon, &sid).await.is_empty());
}

#[tokio::test]
async fn cancel_of_a_prompt_held_behind_an_abandoned_turn_answers_it_cancelled() {
    let daemon = daemon_with_grace().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result, _) = cancel_turn(
        &mut client,
        &sid,
        "echo started; ignore_cancel; sleep 2500; echo late",
    )
    .await;
    assert_eq!(result.unwrap()["stopReason"], "cancelled");
    let held = client.send_prompt(&sid, "echo held").await;
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let (updates, result) = client.collect_updates_until_response(&held).await;
    assert_eq!(result.unwrap()["stopReason"], "cancelled");
    assert!(agent_texts(&updates).is_empty(), "{updates:?}");
    let (updates, _) = client.prompt(&sid, "echo after").await;
    assert_eq!(agent_texts(&updates), ["after"]);
}

#[tokio::test]
async fn a_late_permission_request_of_an_abandoned_turn_never_reaches_the_client() {
    let daemon = daemon_with_grace().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    // Held, it would never be answered (and the next turn would wait for the agent forever).
    client.editor.hold("session/request_permission");
    let (_, result, _) = cancel_turn(
        &mut client,
        &sid,
        "echo started; ignore_cancel; sleep 1500; permission; echo after",
    )
    .await;
    assert_eq!(result.unwrap()["stopReason"], "cancelled");
    let (updates, result) = client.prompt(&sid, "echo next turn").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["next turn"], "{updates:?}");
}

/// A request acpd sent its agent is known by a tag no later actor of the session reuses: a
/// turn cut off by `session/close` that answers late never answers the prompt of the session
/// reopened after it.
#[tokio::test]
async fn a_closed_turns_late_answer_never_ends_a_reopened_sessions_prompt() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let cwd = daemon.work_dir();
    let sid = client.open_session(&cwd).await;
    // Another session keeps the agent process (and the old turn) alive after `sid` closes.
    let _keep = client.open_session(&cwd).await;
    let (_, result) = client.prompt(&sid, "echo first").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let old = client
        .send_prompt(
            &sid,
            "echo held; ignore_cancel; sleep 1500; stop max_tokens",
        )
        .await;
    client.updates_until_text("held").await;
    client
        .request("session/close", json!({ "sessionId": sid }))
        .await
        .expect("session/close");
    assert_eq!(
        client.wait_response(&old).await.unwrap(),
        json!({ "stopReason": "cancelled" })
    );

    let params = json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] });
    // Resumed at once: a resume racing the closed actor's end is handed back to the hub
    // (`load_resume::a_resume_racing_a_close_opens_the_session_again`).
    client
        .request("session/resume", params)
        .await
        .expect("session/resume");
    // The agent runs this turn after the old one (one turn at a time per session): the old
    // turn's `max_tokens` arrives first, while this prompt is waiting.
    let (updates, result) = client.prompt(&sid, "echo new turn").await;
    assert_eq!(
        result.unwrap()["stopReason"],
        "end_turn",
        "the new prompt was answered by the old turn: {updates:?}"
    );
    assert!(
        agent_texts(&updates).contains(&"new turn".to_string()),
        "{updates:?}"
    );
}

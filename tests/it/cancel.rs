//! `session/cancel` through acpd: the prompt answers `cancelled` (never an error), a pending
//! permission request is withdrawn from the client and the agent is told `cancelled`.

use serde_json::json;

use crate::support::{Daemon, PermissionChoice, agent_texts};

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

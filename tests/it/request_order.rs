//! One order per session: an agent's request to a client (here `session/request_permission`)
//! never reaches the client before the `tool_call` update the agent sent before it — live, for
//! a client fed from the journal because it lagged, and for a client that attaches mid-turn
//! and is replayed the history.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Client, Daemon, kind};

const PERMISSION: &str = "session/request_permission";

/// Reads raw messages until the agent request `method` arrives: the `session/update` params
/// seen before it, and the request.
async fn until_request(client: &mut Client, method: &str) -> (Vec<Value>, Value) {
    let mut updates = vec![];
    loop {
        let msg = client.recv_json().await;
        if msg["method"] == "session/update" {
            updates.push(msg["params"].clone());
        } else if msg["method"] == method && msg.get("id").is_some() {
            return (updates, msg);
        }
    }
}

/// Whether `updates` hold the `tool_call` the request `req` asks about.
fn announced(updates: &[Value], req: &Value) -> bool {
    let id = &req["params"]["toolCall"]["toolCallId"];
    assert!(id.is_string(), "{req}");
    updates
        .iter()
        .any(|u| kind(u) == "tool_call" && &u["update"]["toolCallId"] == id)
}

async fn allow(client: &mut Client, req: &Value) {
    let allow = json!({ "outcome": { "outcome": "selected", "optionId": "allow-once" } });
    client.respond(&req["id"], Ok(allow)).await;
}

#[tokio::test]
async fn a_permission_request_never_overtakes_its_tool_call_live() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    for _ in 0..5 {
        let prompt = client.send_prompt(&sid, "stream 200 16; ask_tool").await;
        let (updates, req) = until_request(&mut client, PERMISSION).await;
        assert!(announced(&updates, &req), "request before its tool_call");
        allow(&mut client, &req).await;
        let (_, result) = client.collect_updates_until_response(&prompt).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
    }
}

#[tokio::test]
async fn a_permission_request_never_overtakes_its_tool_call_for_a_lagging_client() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let sid = client.open_session(&daemon.work_dir()).await;
    // More updates than a connection's queue holds: the client, reading nothing meanwhile,
    // lags and is fed the rest (the tool_call among it) from the journal.
    let prompt = client.send_prompt(&sid, "stream 60000 16; ask_tool").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (updates, req) = until_request(&mut client, PERMISSION).await;
    assert!(
        announced(&updates, &req),
        "request before its tool_call (after {} updates)",
        updates.len()
    );
    allow(&mut client, &req).await;
    let (_, result) = client.collect_updates_until_response(&prompt).await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

#[tokio::test]
async fn a_permission_request_never_overtakes_its_tool_call_on_re_attach() {
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await;
    let sid = first.open_session(&daemon.work_dir()).await;
    first.editor.hold(PERMISSION);
    let prompt = first.send_prompt(&sid, "stream 3000 16; ask_tool").await;
    first.wait_held_request(PERMISSION).await;

    // A second client (a shim re-attaching mid-turn) is replayed the history from the
    // journal and asked the open permission: after the tool_call it is about.
    let mut second = daemon.client().await;
    let params = json!({ "sessionId": sid, "afterSeq": 0 });
    second.send_request("_acpd/session/attach", params).await;
    let (updates, req) = until_request(&mut second, PERMISSION).await;
    assert!(
        announced(&updates, &req),
        "request before its tool_call (after {} updates)",
        updates.len()
    );
    allow(&mut second, &req).await;
    let (_, result) = first.collect_updates_until_response(&prompt).await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

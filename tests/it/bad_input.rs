//! Bad input gets a JSON-RPC error (or, for binary frames, nothing) and the same connection
//! keeps working afterwards.

use serde_json::{Value, json};

use crate::support::{Client, Daemon, DaemonOptions, agent_texts};

/// Proves the connection still serves requests, including a whole prompt turn.
async fn still_works(client: &mut Client, daemon: &Daemon) {
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo still alive").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["still alive"]);
}

fn assert_error(msg: &Value, code: i64) {
    assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
    assert!(msg["id"].is_null(), "id must be null: {msg}");
    assert_eq!(msg["error"]["code"], code, "{msg}");
}

#[tokio::test]
async fn malformed_json_is_a_parse_error() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    client
        .send_text(r#"{"jsonrpc":"2.0","id":1,"method":"#)
        .await;
    assert_error(&client.recv_json().await, -32700);
    client.send_text("not json at all").await;
    assert_error(&client.recv_json().await, -32700);
    still_works(&mut client, &daemon).await;
}

#[tokio::test]
async fn batch_is_rejected_with_one_error() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let batch = json!([
        { "jsonrpc": "2.0", "id": 101, "method": "session/list", "params": {} },
        { "jsonrpc": "2.0", "id": 102, "method": "session/list", "params": {} },
    ]);
    client.send_json(&batch).await;
    assert_error(&client.recv_json().await, -32600);
    // Exactly one error: the next message is the answer to a fresh request.
    let id = client.send_request("session/list", json!({})).await;
    let next = client.recv_json().await;
    assert_eq!(
        next["id"], id,
        "expected the list response next, got {next}"
    );
    still_works(&mut client, &daemon).await;
}

#[tokio::test]
async fn unknown_method_is_method_not_found() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let err = client
        .request("no/such/method", json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code, -32601, "{err}");
    let err = client
        .request("_nobody/extension", json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code, -32601, "{err}");
    // Unknown notifications get no answer at all; the next answer is for the next request.
    client.notify("_nobody/notification", json!({})).await;
    let id = client.send_request("session/list", json!({})).await;
    assert_eq!(client.recv_json().await["id"], id);
    still_works(&mut client, &daemon).await;
}

#[tokio::test]
async fn unknown_session_id_is_not_found_and_harmless() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let params = json!({ "sessionId": "bogus", "prompt": [{ "type": "text", "text": "echo x" }] });
    let err = client.request("session/prompt", params).await.unwrap_err();
    assert_eq!(err.code, -32002, "{err}");
    // A cancel for an unknown session is a notification: no answer, no harm.
    client
        .notify("session/cancel", json!({ "sessionId": "bogus" }))
        .await;
    still_works(&mut client, &daemon).await;
}

#[tokio::test]
async fn oversize_frame_is_rejected() {
    const LIMIT: usize = 65_536;
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-message-bytes", LIMIT)).await;
    let mut client = daemon.client().await;
    let big = "x".repeat(LIMIT * 2);
    let msg =
        json!({ "jsonrpc": "2.0", "id": 7, "method": "_acpd/nothing", "params": { "blob": big } });
    client.send_json(&msg).await;
    let reply = client.recv_json().await;
    assert_error(&reply, -32600);
    let message = reply["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        message.contains(&LIMIT.to_string())
            || message.contains("size")
            || message.contains("large"),
        "the error should mention the size: {reply}"
    );
    // A message under the limit is fine.
    let id = client
        .send_request("session/list", json!({ "cwd": daemon.work_dir() }))
        .await;
    assert_eq!(client.recv_json().await["id"], id);
    still_works(&mut client, &daemon).await;
}

#[tokio::test]
async fn binary_frames_are_ignored() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    client
        .send_binary(br#"{"jsonrpc":"2.0","id":55,"method":"session/list","params":{}}"#.to_vec())
        .await;
    client.send_binary(vec![0xff, 0x00, 0x17]).await;
    // No reply to either: the next message is the answer to this request.
    let id = client.send_request("session/list", json!({})).await;
    let next = client.recv_json().await;
    assert_eq!(
        next["id"], id,
        "binary frames must get no reply, got {next}"
    );
    still_works(&mut client, &daemon).await;
}

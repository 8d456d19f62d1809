//! The other two transports, raw TCP and `acpd stdio`, run the same connection code as the
//! WebSocket: a session works end to end, and bad input is answered the same way.

use serde_json::json;

use crate::support::{Client, Daemon, DaemonOptions, agent_texts, seq};

async fn initialize_new_prompt(client: &mut Client, cwd: &std::path::Path) {
    let init = client.initialize().await;
    assert_eq!(init["protocolVersion"], 1);
    let sid = client.open_session(cwd).await;
    let (updates, result) = client.prompt(&sid, "echo over the line; tool").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    assert_eq!(agent_texts(&updates), ["over the line"]);
    assert_eq!(updates.len(), 3, "{updates:?}");
    updates.iter().for_each(|u| {
        seq(u);
    });
}

#[tokio::test]
async fn tcp_transport_runs_a_session() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp()).await;
    let mut client = daemon.connect_tcp().await;
    // A JSON-RPC first line opens the connection (anything else is refused: tcp_gate.rs);
    // after it, bad input is answered and the same connection goes on.
    client
        .send_text(r#"{"jsonrpc":"2.0","method":"$/ping"}"#)
        .await;
    client.send_text("{ not json").await;
    let reply = client.recv_json().await;
    assert_eq!(
        (reply["id"].clone(), reply["error"]["code"].clone()),
        (json!(null), json!(-32700)),
        "{reply}"
    );
    client
        .send_text(r#"[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}]"#)
        .await;
    let reply = client.recv_json().await;
    assert_eq!(
        (reply["id"].clone(), reply["error"]["code"].clone()),
        (json!(null), json!(-32600)),
        "{reply}"
    );
    initialize_new_prompt(&mut client, &daemon.work_dir()).await;
}

#[tokio::test]
async fn stdio_transport_runs_a_session() {
    let (daemon, mut client) = Daemon::stdio(DaemonOptions::default()).await;
    initialize_new_prompt(&mut client, &daemon.work_dir()).await;
}

//! The WebSocket transport RFD handshake and `initialize`: what any ACP client sees first.

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite;

use crate::support::{Client, Daemon, agent_texts};

fn connection_id(client: &Client) -> String {
    let response = client
        .handshake
        .as_ref()
        .expect("websocket handshake response");
    assert_eq!(response.status(), 101);
    response
        .headers()
        .get("acp-connection-id")
        .expect("101 response carries Acp-Connection-Id")
        .to_str()
        .expect("header is ASCII")
        .to_string()
}

#[tokio::test]
async fn upgrade_answers_101_with_a_connection_id() {
    let daemon = Daemon::start().await;
    let a = daemon.connect().await;
    let b = daemon.connect().await;
    let (id_a, id_b) = (connection_id(&a), connection_id(&b));
    assert!(!id_a.is_empty());
    assert_ne!(id_a, id_b, "each connection gets its own id");
}

#[tokio::test]
async fn unknown_agent_profile_is_404_before_upgrade() {
    let daemon = Daemon::start().await;
    let url = format!("{}?agent=unknown", daemon.ws_url());
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 404),
        Err(e) => panic!("expected HTTP 404, got error {e}"),
        Ok(_) => panic!("expected HTTP 404, got an upgraded connection"),
    }
    // A known profile upgrades.
    let url = format!("{}?agent=scripted", daemon.ws_url());
    let client = Client::connect_ws(&url)
        .await
        .expect("known profile upgrades");
    connection_id(&client);
}

/// A client that knows nothing of acpd: minimal capabilities, standard fields only.
#[tokio::test]
async fn plain_rfd_client_works_without_extensions() {
    let daemon = Daemon::start().await;
    let mut client = daemon.connect().await;
    let init = client
        .request(
            "initialize",
            json!({ "protocolVersion": 1, "clientCapabilities": {} }),
        )
        .await
        .expect("initialize");
    assert_eq!(init["protocolVersion"], 1);
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo plain hello").await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    assert_eq!(agent_texts(&updates), ["plain hello"]);
}

#[tokio::test]
async fn initialize_advertises_what_acpd_serves() {
    let daemon = Daemon::start().await;
    let mut client = daemon.connect().await;
    let init = client.initialize().await;
    assert_eq!(init["protocolVersion"], 1);
    let caps = &init["agentCapabilities"];
    assert_eq!(caps["loadSession"], true);
    for cap in ["list", "resume", "close", "delete"] {
        assert_eq!(
            caps["sessionCapabilities"][cap],
            json!({}),
            "sessionCapabilities.{cap} in {init}"
        );
    }
    let methods: Vec<&str> = init["authMethods"]
        .as_array()
        .expect("authMethods")
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["token"],
        "only the agent's non-terminal auth methods"
    );
    assert!(
        init["_meta"]["acpd"]["version"].is_string(),
        "_meta.acpd.version in {init}"
    );
}

/// acpd runs an agent's terminal login on the agent's host, so it tells the agent it can run
/// terminal logins whatever the editor said: an agent that lists its terminal methods only to
/// such a client (claude-agent-acp 0.49, and the scripted agent) then offers them to acpd.
#[tokio::test]
async fn agent_sees_fs_terminal_and_that_acpd_runs_terminal_logins() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, _) = client.prompt(&sid, "caps").await;
    let text = agent_texts(&updates).pop().expect("caps chunk");
    let caps: Value =
        serde_json::from_str(text.strip_prefix("caps: ").expect("caps: prefix")).unwrap();
    assert_eq!(caps["fs"]["readTextFile"], true, "{caps}");
    assert_eq!(caps["fs"]["writeTextFile"], true, "{caps}");
    assert_eq!(caps["terminal"], true, "{caps}");
    assert_eq!(caps["auth"]["terminal"], true, "{caps}");
    assert_eq!(caps["_meta"]["terminal-auth"], true, "{caps}");
}

#[tokio::test]
async fn authenticate_is_relayed() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let result = client
        .request("authenticate", json!({ "methodId": "token" }))
        .await;
    assert_eq!(result.unwrap(), json!({}));
}

#[tokio::test]
async fn session_methods_before_initialize_are_invalid() {
    let daemon = Daemon::start().await;
    let mut client = daemon.connect().await;
    let cwd = daemon.work_dir();
    let err = client
        .request("session/new", json!({ "cwd": cwd, "mcpServers": [] }))
        .await
        .unwrap_err();
    assert_eq!(err.code, -32600, "{err}");
    let err = client.request("session/list", json!({})).await.unwrap_err();
    assert_eq!(err.code, -32600, "{err}");
    // The connection is not spoiled: initializing now works.
    client.initialize().await;
    client.new_session(&cwd).await;
}

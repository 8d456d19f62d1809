//! Agent→client requests through acpd: permission, fs, terminal and extension requests reach
//! the editor over the same socket, with acpd's session id, and the answers reach the agent.

use serde_json::{Value, json};

use crate::support::{Daemon, PermissionChoice, agent_texts};

fn requests_of<'a>(requests: &'a [Value], method: &str) -> Vec<&'a Value> {
    requests.iter().filter(|r| r["method"] == method).collect()
}

#[tokio::test]
async fn permission_round_trip() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    for choice in ["allow-once", "allow-always", "reject-once", "reject-always"] {
        client.editor.permission = PermissionChoice::Select(choice.into());
        let (updates, result) = client.prompt(&sid, "permission; echo next").await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
        assert_eq!(
            agent_texts(&updates),
            [format!("permission: selected {choice}"), "next".into()]
        );
    }
    let asked = requests_of(&client.received_requests, "session/request_permission");
    assert_eq!(asked.len(), 4);
    let params = &asked[0]["params"];
    assert_eq!(
        params["sessionId"],
        sid.as_str(),
        "acpd's session id, not the agent's"
    );
    assert!(params["toolCall"]["toolCallId"].is_string(), "{params}");
    let kinds: Vec<&str> = params["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["allow_once", "allow_always", "reject_once", "reject_always"]
    );
}

#[tokio::test]
async fn fs_round_trip() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let input = daemon.work_dir().join("notes.txt");
    std::fs::write(&input, "remember the milk").unwrap();
    let output = daemon.work_dir().join("sub/out.txt");
    let missing = daemon.work_dir().join("missing.txt");
    let script = format!(
        "read {}\nwrite {} written by the agent\nread {}",
        input.display(),
        output.display(),
        missing.display()
    );
    let (updates, result) = client.prompt(&sid, &script).await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        [
            "read: remember the milk".to_string(),
            format!("wrote: {}", output.display()),
            "error: -32002 Resource not found".to_string(),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        "written by the agent"
    );
    let reads = requests_of(&client.received_requests, "fs/read_text_file");
    assert_eq!(
        reads[0]["params"],
        json!({ "sessionId": sid, "path": input })
    );
    let writes = requests_of(&client.received_requests, "fs/write_text_file");
    assert_eq!(writes[0]["params"]["sessionId"], sid.as_str());
}

#[tokio::test]
async fn terminal_round_trip() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "terminal echo from the editor").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        ["terminal: exit 0 output from the editor\n"]
    );
    let (updates, _) = client.prompt(&sid, "terminal false").await;
    assert_eq!(agent_texts(&updates), ["terminal: exit 1 output "]);
    let methods: Vec<&str> = client
        .received_requests
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        &methods[..4],
        [
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    assert!(
        client
            .received_requests
            .iter()
            .all(|r| r["params"]["sessionId"] == sid.as_str())
    );
}

#[tokio::test]
async fn extension_request_round_trip() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.editor.ping_result = json!({ "pong": true, "from": "test editor" });
    let (updates, result) = client.prompt(&sid, "ext").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        [r#"ext: {"pong":true,"from":"test editor"}"#]
    );
    let ping = requests_of(&client.received_requests, "_scripted/ping");
    assert_eq!(ping[0]["params"]["n"], 1);
}

#[tokio::test]
async fn client_error_answers_reach_the_agent() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.editor.hold("fs/read_text_file");
    let prompt = client
        .send_prompt(&sid, "read /nowhere; echo went on")
        .await;
    let held = client.wait_held_request("fs/read_text_file").await;
    let refusal = crate::support::RpcError {
        code: -32042,
        message: "refused by test".into(),
        data: None,
    };
    client.respond(&held["id"], Err(refusal)).await;
    let (updates, result) = client.collect_updates_until_response(&prompt).await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        ["error: -32042 refused by test", "went on"]
    );
}

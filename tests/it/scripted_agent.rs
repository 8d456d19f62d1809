//! The scripted agent on its own, over its stdio: the stand-in must itself be right before
//! it can prove anything about acpd.

use serde_json::{Value, json};

use crate::support::agent::ScriptedAgent;
use crate::support::{Client, PermissionChoice, agent_texts, kind};

async fn started(args: &[&str]) -> (ScriptedAgent, Client) {
    let (agent, mut client) = ScriptedAgent::spawn(args);
    client.initialize().await;
    (agent, client)
}

fn cwd() -> std::path::PathBuf {
    std::env::temp_dir()
}

#[tokio::test]
async fn initialize_advertises_capabilities_and_auth_methods() {
    let (_agent, mut client) = ScriptedAgent::spawn(&[]);
    let result = client.initialize().await;
    assert_eq!(
        result,
        json!({
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": true,
                "promptCapabilities": { "image": false, "audio": false, "embeddedContext": true },
                "mcpCapabilities": { "http": false, "sse": false },
                "sessionCapabilities": { "resume": {} },
            },
            "authMethods": [
                { "id": "token", "name": "Token" },
                { "id": "term", "name": "Terminal login", "type": "terminal", "args": ["--login"], "env": {} },
            ],
            "agentInfo": { "name": "scripted-agent", "version": "0.1.0" },
        })
    );
    assert_eq!(
        client
            .request("authenticate", json!({ "methodId": "token" }))
            .await
            .unwrap(),
        json!({})
    );
    assert_eq!(
        client.request("logout", json!({})).await.unwrap(),
        json!({})
    );
}

#[tokio::test]
async fn no_load_and_no_resume_flags_remove_those_capabilities() {
    let (_agent, mut client) = ScriptedAgent::spawn(&["--no-load", "--no-resume"]);
    let result = client.initialize().await;
    assert_eq!(result["agentCapabilities"]["loadSession"], false);
    assert_eq!(
        result["agentCapabilities"]["sessionCapabilities"],
        json!({})
    );
    let sid = client.new_session(&cwd()).await;
    let params = json!({ "sessionId": sid, "cwd": cwd(), "mcpServers": [] });
    assert_eq!(
        client
            .request("session/load", params.clone())
            .await
            .unwrap_err()
            .code,
        -32601
    );
    assert_eq!(
        client
            .request("session/resume", params)
            .await
            .unwrap_err()
            .code,
        -32601
    );
}

#[tokio::test]
async fn pid_dir_gets_a_file_named_after_the_pid() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let (agent, mut client) = ScriptedAgent::spawn(&["--pid-dir", pids.to_str().unwrap()]);
    client.initialize().await;
    assert!(
        pids.join(agent.pid().to_string()).exists(),
        "no pid file in {}",
        pids.display()
    );
}

#[tokio::test]
async fn new_session_sends_available_commands_before_its_response() {
    let (_agent, mut client) = started(&[]).await;
    let id = client
        .send_request("session/new", json!({ "cwd": cwd(), "mcpServers": [] }))
        .await;
    let update = client.recv_json().await;
    let response = client.recv_json().await;
    assert_eq!(
        response["id"], id,
        "expected the response second, got {response}"
    );
    let sid = response["result"]["sessionId"].as_str().unwrap();
    assert!(sid.starts_with("sa-1-"), "agent session id {sid}");
    assert_eq!(
        update,
        json!({ "jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": sid,
            "update": {
                "sessionUpdate": "available_commands_update",
                "availableCommands": [{ "name": "echo", "description": "Echo text" }],
            },
        }})
    );
    assert_eq!(
        response["result"]["modes"],
        json!({
            "currentModeId": "default",
            "availableModes": [{ "id": "default", "name": "Default" }, { "id": "plan", "name": "Plan" }],
        })
    );
    assert_eq!(
        response["result"]["configOptions"],
        json!([{
            "id": "verbosity", "name": "Verbosity", "type": "select", "currentValue": "low",
            "options": [{ "value": "low", "name": "Low" }, { "value": "high", "name": "High" }],
        }])
    );
}

#[tokio::test]
async fn prompt_script_emits_updates_in_order() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    let script = "echo hello world\nstream 3 8; thought hmm\ntool\ntitle My title\nunknown_update\nfree text here";
    let (updates, result) = client.prompt(&sid, script).await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "end_turn" }));
    assert!(updates.iter().all(|u| u["sessionId"] == sid));
    assert!(
        updates.iter().all(|u| u.get("_meta").is_none()),
        "nothing at params._meta"
    );
    let kinds: Vec<&str> = updates.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "agent_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
            "agent_message_chunk",
            "agent_thought_chunk",
            "tool_call",
            "tool_call_update",
            "session_info_update",
            "acpd_test_unknown_kind",
            "agent_message_chunk",
        ]
    );
    assert_eq!(
        agent_texts(&updates),
        [
            "hello world",
            "0:xxxxxx",
            "1:xxxxxx",
            "2:xxxxxx",
            "free text here"
        ]
    );
    let ns: Vec<&Value> = updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .map(|u| &u["update"]["_meta"]["scripted"]["n"])
        .collect();
    assert_eq!(ns, [&json!(1), &json!(2), &json!(3), &json!(4), &json!(5)]);
    assert_eq!(
        updates[4]["update"]["content"],
        json!({ "type": "text", "text": "hmm" })
    );
    assert_eq!(updates[5]["update"]["kind"], "read");
    assert_eq!(updates[5]["update"]["status"], "pending");
    assert_eq!(updates[6]["update"]["status"], "completed");
    assert_eq!(
        updates[5]["update"]["toolCallId"],
        updates[6]["update"]["toolCallId"]
    );
    assert_eq!(
        updates[7]["update"],
        json!({ "sessionUpdate": "session_info_update", "title": "My title" })
    );
    assert_eq!(
        updates[8]["update"],
        json!({ "sessionUpdate": "acpd_test_unknown_kind", "payload": { "x": 1 }, "_meta": { "scripted": { "kept": true } } })
    );
}

#[tokio::test]
async fn stop_and_error_end_the_turn_early() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let (updates, result) = client
        .prompt(&sid, "echo a; stop max_tokens; echo never")
        .await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "max_tokens" }));
    assert_eq!(agent_texts(&updates), ["a"]);
    let (updates, result) = client
        .prompt(&sid, "echo b\nerror -32042 it went wrong\necho never")
        .await;
    let err = result.unwrap_err();
    assert_eq!((err.code, err.message.as_str()), (-32042, "it went wrong"));
    assert_eq!(agent_texts(&updates), ["b"]);
    let err = client.prompt(&sid, "stream many 3").await.1.unwrap_err();
    assert_eq!(err.code, -32602, "a bad script is invalid params: {err}");
    let err = client.prompt("sa-404", "echo x").await.1.unwrap_err();
    assert_eq!(err.code, -32002);
}

#[tokio::test]
async fn tick_sends_numbered_chunks_stamped_with_the_wall_clock_at_the_pace_asked() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    let clock = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    let before = clock();
    let (updates, result) = client.prompt(&sid, "tick 3 5").await;
    let after = clock();
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let stamps: Vec<u128> = agent_texts(&updates)
        .iter()
        .map(|t| t.strip_prefix("tick ").unwrap().parse().unwrap())
        .collect();
    assert_eq!(stamps.len(), 3, "{updates:?}");
    assert!(before <= stamps[0] && stamps[2] <= after, "{stamps:?}");
    // Ticks keep a schedule that starts after `before`: the third is due two intervals in.
    // (Not measured from the first stamp, which may itself be late: 9.5 ms was seen.)
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    assert!(stamps[2] - before >= 10_000_000, "{stamps:?}");
    let numbers: Vec<u64> = updates
        .iter()
        .map(|u| u["update"]["_meta"]["scripted"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2, 3], "numbered like every chunk");
}

#[tokio::test]
async fn permission_outcomes_are_reported() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    client.editor.permission = PermissionChoice::Select("reject-always".into());
    let (updates, result) = client.prompt(&sid, "permission; echo after").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        ["permission: selected reject-always", "after"]
    );
    let request = client.received_requests.last().unwrap().clone();
    assert_eq!(request["method"], "session/request_permission");
    assert!(request["id"].is_i64(), "agent request ids are numbers");
    assert_eq!(request["params"]["sessionId"], sid);
    assert!(request["params"]["toolCall"]["toolCallId"].is_string());
    let option_ids: Vec<&str> = request["params"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["optionId"].as_str().unwrap())
        .collect();
    assert_eq!(
        option_ids,
        ["allow-once", "allow-always", "reject-once", "reject-always"]
    );

    client.editor.permission = PermissionChoice::Cancelled;
    let (updates, result) = client.prompt(&sid, "permission; echo never").await;
    assert_eq!(result.unwrap()["stopReason"], "cancelled");
    assert_eq!(agent_texts(&updates), ["permission: cancelled"]);
}

#[tokio::test]
async fn fs_requests_go_to_the_client() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    std::fs::write(&input, "file content").unwrap();
    let output = dir.path().join("out.txt");
    let missing = dir.path().join("missing.txt");
    let script = format!(
        "read {}\nwrite {} some new text\nread {}",
        input.display(),
        output.display(),
        missing.display()
    );
    let (updates, result) = client.prompt(&sid, &script).await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&updates),
        [
            "read: file content".to_string(),
            format!("wrote: {}", output.display()),
            "error: -32002 Resource not found".to_string(),
        ]
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "some new text");
    let write = &client.received_requests[1];
    assert_eq!(
        write["params"],
        json!({ "sessionId": sid, "path": output, "content": "some new text" })
    );
}

#[tokio::test]
async fn terminal_runs_at_the_client() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let (updates, result) = client.prompt(&sid, "terminal sh -c exit_7").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    // `exit_7` is not a command: sh reports it and exits 127.
    let text = &agent_texts(&updates)[0];
    assert!(text.starts_with("terminal: exit 127 output "), "{text}");
    let (updates, _) = client.prompt(&sid, "terminal echo hello there").await;
    assert_eq!(
        agent_texts(&updates),
        ["terminal: exit 0 output hello there\n"]
    );
    let methods: Vec<&str> = client.received_requests[4..]
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        [
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    assert_eq!(client.received_requests[4]["params"]["command"], "echo");
    assert_eq!(
        client.received_requests[4]["params"]["args"],
        json!(["hello", "there"])
    );
}

#[tokio::test]
async fn extension_requests_both_ways() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let (updates, _) = client.prompt(&sid, "ext").await;
    assert_eq!(agent_texts(&updates), [r#"ext: {"pong":true}"#]);
    assert_eq!(client.received_requests[0]["method"], "_scripted/ping");
    assert_eq!(client.received_requests[0]["params"], json!({ "n": 1 }));
    let echoed = client
        .request("_scripted/echo", json!({ "a": [1, 2] }))
        .await
        .unwrap();
    assert_eq!(echoed, json!({ "a": [1, 2] }));
    assert_eq!(
        client
            .request("_scripted/nope", json!({}))
            .await
            .unwrap_err()
            .code,
        -32601
    );
    assert_eq!(
        client
            .request("session/fork", json!({}))
            .await
            .unwrap_err()
            .code,
        -32601
    );
    // Unknown notifications are ignored; the agent answers the next request.
    client.notify("_scripted/whatever", json!({})).await;
    assert_eq!(
        client.request("_scripted/echo", json!(1)).await.unwrap(),
        json!(1)
    );
}

#[tokio::test]
async fn caps_reports_client_capabilities_as_received() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let (updates, _) = client.prompt(&sid, "caps").await;
    let text = &agent_texts(&updates)[0];
    let caps: Value = serde_json::from_str(text.strip_prefix("caps: ").unwrap()).unwrap();
    assert_eq!(caps, crate::support::client::editor_capabilities());
}

#[tokio::test]
async fn cancel_stops_waiting_and_skips_the_rest() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    for script in [
        "echo started; wait_for_cancel; echo never",
        "echo started; sleep 60000; echo never",
    ] {
        let id = client.send_prompt(&sid, script).await;
        let first = client.next_update().await;
        assert_eq!(agent_texts(&[first]), ["started"]);
        client
            .notify("session/cancel", json!({ "sessionId": sid }))
            .await;
        let (updates, result) = client.collect_updates_until_response(&id).await;
        assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
        assert!(agent_texts(&updates).is_empty(), "{updates:?}");
    }
    // Cancelling with no turn running is harmless.
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let (_, result) = client.prompt(&sid, "echo ok").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

#[tokio::test]
async fn cancel_withdraws_a_pending_client_request() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    client.editor.hold("session/request_permission");
    let id = client.send_prompt(&sid, "permission; echo never").await;
    let held = client.wait_held_request("session/request_permission").await;
    client
        .notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    // Withdrawn before anything else is said.
    let withdrawn = client.next_notification().await;
    assert_eq!(withdrawn["method"], "$/cancel_request");
    assert_eq!(withdrawn["params"]["requestId"], held["id"]);
    let (updates, result) = client.collect_updates_until_response(&id).await;
    assert_eq!(result.unwrap(), json!({ "stopReason": "cancelled" }));
    assert_eq!(agent_texts(&updates), ["permission: cancelled"]);
    // A late answer to the withdrawn request is dropped; the session goes on.
    let late = json!({ "outcome": { "outcome": "selected", "optionId": "allow-once" } });
    client.respond(&held["id"], Ok(late)).await;
    let (updates, _) = client.prompt(&sid, "echo next").await;
    assert_eq!(agent_texts(&updates), ["next"]);
}

#[tokio::test]
async fn turns_run_while_stdin_is_read() {
    let (_agent, mut client) = started(&[]).await;
    let a = client.new_session(&cwd()).await;
    let b = client.new_session(&cwd()).await;
    let waiting = client.send_prompt(&a, "wait_for_cancel").await;
    let (updates, result) = client.prompt(&b, "echo meanwhile").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["meanwhile"]);
    client
        .notify("session/cancel", json!({ "sessionId": a }))
        .await;
    assert_eq!(
        client.wait_response(&waiting).await.unwrap()["stopReason"],
        "cancelled"
    );
}

#[tokio::test]
async fn load_replays_history_and_resume_does_not() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    client.prompt(&sid, "echo one; title T").await.1.unwrap();
    let (replayed, result) = client.load(&sid, &cwd()).await;
    assert_eq!(result.unwrap()["modes"]["currentModeId"], "default");
    let kinds: Vec<&str> = replayed.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "available_commands_update",
            "user_message_chunk",
            "agent_message_chunk",
            "session_info_update"
        ]
    );
    assert_eq!(
        replayed[1]["update"]["content"],
        json!({ "type": "text", "text": "echo one; title T" })
    );
    assert_eq!(
        replayed[2]["update"]["_meta"],
        json!({ "scripted": { "n": 1 } })
    );

    let err = client.load("sa-nope", &cwd()).await.1.unwrap_err();
    assert_eq!(
        (err.code, err.message.as_str()),
        (-32002, "Resource not found")
    );
    assert_eq!(err.data.unwrap()["sessionId"], "sa-nope");

    // Resume: any id, no replay, and the session then takes prompts.
    let id = client
        .send_request(
            "session/resume",
            json!({ "sessionId": "elsewhere-1", "cwd": cwd(), "mcpServers": [] }),
        )
        .await;
    let (replayed, result) = client.collect_updates_until_response(&id).await;
    assert!(replayed.is_empty());
    assert_eq!(result.unwrap()["configOptions"][0]["currentValue"], "low");
    let (updates, _) = client.prompt("elsewhere-1", "echo resumed").await;
    assert_eq!(agent_texts(&updates), ["resumed"]);
}

#[tokio::test]
async fn mode_and_config_changes_emit_updates() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    let id = client
        .send_request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "plan" }),
        )
        .await;
    let (updates, result) = client.collect_updates_until_response(&id).await;
    assert_eq!(result.unwrap(), json!({}));
    assert_eq!(
        updates[0]["update"],
        json!({ "sessionUpdate": "current_mode_update", "currentModeId": "plan" })
    );

    let params = json!({ "sessionId": sid, "configId": "verbosity", "value": "high" });
    let id = client
        .send_request("session/set_config_option", params)
        .await;
    let (updates, result) = client.collect_updates_until_response(&id).await;
    let options = result.unwrap()["configOptions"].clone();
    assert_eq!(options[0]["currentValue"], "high");
    assert_eq!(
        updates[0]["update"],
        json!({ "sessionUpdate": "config_option_update", "configOptions": options })
    );

    let bad = json!({ "sessionId": sid, "modeId": "nope" });
    assert_eq!(
        client
            .request("session/set_mode", bad)
            .await
            .unwrap_err()
            .code,
        -32602
    );
    let unknown = json!({ "sessionId": "sa-x", "modeId": "plan" });
    assert_eq!(
        client
            .request("session/set_mode", unknown)
            .await
            .unwrap_err()
            .code,
        -32002
    );
}

#[tokio::test]
async fn crash_exits_with_status_3_after_flushing() {
    let (mut agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    client
        .send_prompt(&sid, "echo last words; crash; echo never")
        .await;
    let update = client.next_update().await;
    assert_eq!(agent_texts(&[update]), ["last words"]);
    assert_eq!(agent.wait_exit().await, Some(3));
}

#[tokio::test]
async fn stdin_eof_ends_the_agent() {
    let (mut agent, mut client) = started(&[]).await;
    client.close().await;
    assert_eq!(agent.wait_exit().await, Some(0));
}

#[tokio::test]
async fn long_stream_is_complete_and_ordered() {
    let (_agent, mut client) = started(&[]).await;
    let sid = client.new_session(&cwd()).await;
    let _bootstrap = client.next_update().await;
    let (updates, result) = client.prompt(&sid, "stream 10000 64").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let texts = agent_texts(&updates);
    assert_eq!(texts.len(), 10_000);
    for (i, text) in texts.iter().enumerate() {
        assert!(
            text.starts_with(&format!("{i}:")) && text.len() == 64,
            "chunk {i}: {text}"
        );
    }
}

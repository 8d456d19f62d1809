//! The built-in agent end to end: the real `acpd` over WebSocket, the agent's model calls
//! going to a scripted model server (Anthropic and OpenAI formats over real HTTP + SSE).

use std::time::Duration;

use serde_json::{Value, json};

use crate::builtin_support::model::{Ev, Reply, text, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, full_caps, no_caps};

fn is(kind: &'static str) -> impl Fn(&Value) -> bool {
    move |u| u["sessionUpdate"] == kind
}

/// A tool_call_update for a call whose title contains `what`, in a final state.
fn finished_updates(seen: &[Value]) -> Vec<Value> {
    seen.iter()
        .map(|u| u["update"].clone())
        .filter(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && (u["status"] == "completed" || u["status"] == "failed")
        })
        .collect()
}

#[tokio::test]
async fn builtin_reads_edits_and_runs_through_the_client() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    std::fs::write(acpd.work().join("hello.txt"), "hello world\n").unwrap();
    model.push(Reply::Status(429, "slow down")); // retried
    model.push_stream(vec![
        Ev::Thinking("let me look".into()),
        text("Reading."),
        tool("read_file", json!({ "path": "hello.txt" })),
    ]);
    model.push_stream(vec![tool(
        "edit",
        json!({ "path": "hello.txt", "old_string": "world", "new_string": "acpd" }),
    )]);
    model.push_stream(vec![tool(
        "shell",
        json!({ "command": "cat hello.txt; echo done-marker" }),
    )]);
    model.push_stream(vec![text("All "), Ev::Pause(20), text("done.")]);

    let (mut ed, init) = crate::builtin_support::Editor::connect(acpd.addr, full_caps()).await;
    let init = init;
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    assert_eq!(init["agentInfo"]["name"], "acpd-builtin");
    let (sid, new) = ed.new_session(&acpd.work(), json!({})).await;
    assert_eq!(new["modes"]["currentModeId"], "build");
    let ids: Vec<&str> = new["configOptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["id"].as_str())
        .collect();
    assert!(ids.contains(&"mode") && ids.contains(&"model"), "{ids:?}");
    // Slash commands come shortly after the response.
    let cmds = ed
        .wait_update("available_commands_update", is("available_commands_update"))
        .await;
    let names: Vec<&str> = cmds["availableCommands"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["compact", "mode", "model"]);

    let r = ed
        .prompt(&sid, "Change world to acpd in hello.txt and show it")
        .await
        .expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    assert_eq!(
        std::fs::read_to_string(acpd.work().join("hello.txt")).unwrap(),
        "hello acpd\n"
    );

    let methods = ed.request_methods();
    for m in [
        "fs/read_text_file",
        "fs/write_text_file",
        "session/request_permission",
        "terminal/create",
        "terminal/wait_for_exit",
        "terminal/output",
        "terminal/release",
    ] {
        assert!(
            methods.iter().any(|x| x == m),
            "{m} missing from {methods:?}"
        );
    }
    // Two permission requests: edit and shell (read_file needs none).
    assert_eq!(
        methods
            .iter()
            .filter(|m| *m == "session/request_permission")
            .count(),
        2
    );

    assert!(!ed.updates_of("agent_thought_chunk").is_empty());
    let done = finished_updates(&ed.seen);
    assert_eq!(done.len(), 3, "{done:#?}");
    assert!(done.iter().all(|u| u["status"] == "completed"), "{done:#?}");
    let diff = done
        .iter()
        .find_map(|u| {
            u["content"]
                .as_array()
                .and_then(|c| c.iter().find(|x| x["type"] == "diff"))
                .cloned()
        })
        .expect("diff content");
    assert_eq!(diff["oldText"], "hello world\n");
    assert_eq!(diff["newText"], "hello acpd\n");
    assert!(
        done.iter().any(|u| u["content"][0]["type"] == "terminal"),
        "{done:#?}"
    );
    let edit_call = ed
        .updates_of("tool_call_update")
        .into_iter()
        .find(|u| u["kind"] == "edit")
        .expect("edit presented");
    assert!(
        edit_call["locations"][0]["path"]
            .as_str()
            .unwrap()
            .ends_with("hello.txt")
    );
    assert!(
        ed.updates_of("usage_update")
            .iter()
            .all(|u| u["size"] == 200000)
    );
    ed.wait_update("session_info_update", is("session_info_update"))
        .await;

    let reqs = model.wait_requests(5).await;
    assert_eq!(reqs[1].auth.as_deref(), Some("anthropic-test-key"));
    assert!(
        reqs[2].text().contains("hello world"),
        "the read result reaches the model"
    );
    assert!(
        reqs[4].text().contains("done-marker"),
        "the shell output reaches the model"
    );
    assert!(
        reqs[4].text().contains("sig-1"),
        "signed thinking is sent back"
    );
}

#[tokio::test]
async fn builtin_host_tools_are_confined() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let work = acpd.work();
    std::fs::write(work.join("a.txt"), "alpha\n").unwrap();
    std::os::unix::fs::symlink(acpd.dir(), work.join("up")).unwrap();
    model.push_stream(vec![tool("read_file", json!({ "path": "a.txt" }))]);
    model.push_stream(vec![tool(
        "write_file",
        json!({ "path": "../escape.txt", "content": "x" }),
    )]);
    model.push_stream(vec![tool("read_file", json!({ "path": "up/acpd.toml" }))]);
    model.push_stream(vec![tool(
        "edit",
        json!({ "path": "a.txt", "old_string": "alpha", "new_string": "beta" }),
    )]);
    model.push_stream(vec![tool(
        "shell",
        json!({ "command": "echo made > made.txt; pwd" }),
    )]);
    model.push_stream(vec![
        tool("grep", json!({ "pattern": "bet" })),
        tool("glob", json!({ "pattern": "*.txt" })),
    ]);
    model.push_stream(vec![text("ok")]);

    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&work, json!({})).await;
    let r = ed.prompt(&sid, "go").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let methods = ed.request_methods();
    assert!(
        methods.iter().all(|m| m == "session/request_permission"),
        "no fs/terminal without caps: {methods:?}"
    );
    assert!(!acpd.dir().join("escape.txt").exists());
    assert_eq!(
        std::fs::read_to_string(work.join("a.txt")).unwrap(),
        "beta\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    let reqs = model.wait_requests(7).await;
    assert!(reqs[1].text().contains("alpha"));
    assert!(
        reqs[2].text().contains("outside the session"),
        "{}",
        reqs[2].text()
    );
    assert!(
        reqs[3].text().contains("outside the session"),
        "symlink escape refused"
    );
    assert!(
        !reqs[3].text().contains("anthropic-test-key"),
        "the config was not read"
    );
    assert!(reqs[6].text().contains("a.txt:1: beta"), "grep ran");
    let failed: Vec<Value> = finished_updates(&ed.seen)
        .into_iter()
        .filter(|u| u["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 2, "{failed:#?}");
}

#[tokio::test]
async fn builtin_permission_rejected_then_always_allowed() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    model.push_stream(vec![tool("shell", json!({ "command": "echo one" }))]);
    model.push_stream(vec![tool("shell", json!({ "command": "echo two" }))]);
    model.push_stream(vec![tool("shell", json!({ "command": "echo three" }))]);
    model.push_stream(vec![text("done")]);
    let mut ed = acpd.editor(no_caps()).await;
    ed.answer_permissions(&["reject_once", "allow_always"]);
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    assert_eq!(
        ed.prompt(&sid, "run things").await.unwrap()["stopReason"],
        "end_turn"
    );
    let perms: Vec<Value> = ed
        .requests()
        .into_iter()
        .filter(|(m, _)| m == "session/request_permission")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        perms.len(),
        2,
        "the third call is allowed by the remembered answer"
    );
    let kinds: Vec<&str> = perms[0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["allow_once", "allow_always", "reject_once", "reject_always"]
    );
    let reqs = model.wait_requests(4).await;
    assert!(
        reqs[1].text().contains("rejected"),
        "the model learns of the rejection"
    );
    assert!(reqs[3].text().contains("three"), "the third command ran");
}

#[tokio::test]
async fn builtin_cancel_during_streaming_and_during_a_tool() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;

    // Mid-stream.
    model.push_stream(vec![text("partial answer"), Ev::Hang]);
    let rx = ed.start_prompt(&sid, "talk");
    ed.wait_update("the partial text", |u| {
        u["sessionUpdate"] == "agent_message_chunk"
    })
    .await;
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");

    // Mid-tool (a host command that would run for a minute).
    ed.answer_permissions(&["allow_always"]);
    model.push_stream(vec![tool("shell", json!({ "command": "sleep 60" }))]);
    let started = tokio::time::Instant::now();
    let rx = ed.start_prompt(&sid, "sleep");
    ed.wait_update("the shell running", |u| u["status"] == "in_progress")
        .await;
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");
    assert!(started.elapsed() < Duration::from_secs(20));

    // While a permission request is pending: acpd answers it `cancelled`.
    ed.hold_permissions(true);
    model.push_stream(vec![tool(
        "write_file",
        json!({ "path": "x.txt", "content": "x" }),
    )]);
    let rx = ed.start_prompt(&sid, "write");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ed
        .request_methods()
        .iter()
        .any(|m| m == "session/request_permission")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no permission request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");
    assert!(!acpd.work().join("x.txt").exists());

    // The session goes on, with what was said before the cancels.
    ed.hold_permissions(false);
    model.push_stream(vec![text("fine")]);
    assert_eq!(
        ed.prompt(&sid, "again").await.unwrap()["stopReason"],
        "end_turn"
    );
    let reqs = model.wait_requests(4).await;
    let last = reqs[3].text();
    assert!(
        last.contains("partial answer"),
        "streamed text is kept: {last}"
    );
    assert!(
        last.contains("cancelled by the user"),
        "the cancelled tool has a result"
    );
}

#[tokio::test]
async fn builtin_plan_mode_hides_write_tools() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(full_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    ed.request(
        "session/set_mode",
        json!({ "sessionId": sid, "modeId": "plan" }),
    )
    .await
    .expect("set_mode");
    let u = ed
        .wait_update("current_mode_update", is("current_mode_update"))
        .await;
    assert_eq!(u["currentModeId"], "plan");
    model.push_stream(vec![text("a plan")]);
    ed.prompt(&sid, "plan it").await.unwrap();
    let r = ed
        .request(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": "mode", "value": "build" }),
        )
        .await
        .expect("set_config_option");
    assert_eq!(r["configOptions"][0]["currentValue"], "build");
    model.push_stream(vec![text("built")]);
    ed.prompt(&sid, "do it").await.unwrap();
    let reqs = model.wait_requests(2).await;
    let plan = reqs[0].tool_names();
    assert!(
        plan.contains(&"read_file".to_owned()) && plan.contains(&"grep".to_owned()),
        "{plan:?}"
    );
    for w in ["write_file", "edit", "shell"] {
        assert!(
            !plan.contains(&w.to_owned()),
            "{w} offered in plan mode: {plan:?}"
        );
        assert!(
            reqs[1].tool_names().contains(&w.to_owned()),
            "{w} missing in build mode"
        );
    }
    assert!(reqs[0].text().contains("Plan mode is on"));
    // Bad values are refused.
    let e = ed
        .request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "yolo" }),
        )
        .await
        .unwrap_err();
    assert_eq!(e["code"], -32602);
}

#[tokio::test]
async fn builtin_model_switch_to_the_other_provider() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    std::fs::write(acpd.work().join("n.txt"), "forty-two\n").unwrap();
    let mut ed = acpd.editor(full_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    model.push_stream(vec![text("hi from claude")]);
    ed.prompt(&sid, "first").await.unwrap();

    let r = ed
        .request(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": "model", "value": "gpt" }),
        )
        .await
        .expect("switch model");
    let opts = r["configOptions"].as_array().unwrap();
    assert!(
        opts.iter()
            .any(|o| o["id"] == "model" && o["currentValue"] == "gpt")
    );
    assert!(
        opts.iter().any(|o| o["category"] == "thought_level"),
        "gpt reasons: a thought level is offered"
    );
    ed.wait_update("config_option_update", is("config_option_update"))
        .await;

    model.push_stream(vec![
        Ev::Thinking("hmm".into()),
        tool("read_file", json!({ "path": "n.txt" })),
    ]);
    model.push_stream(vec![text("It says forty-two.")]);
    assert_eq!(
        ed.prompt(&sid, "what is in n.txt").await.unwrap()["stopReason"],
        "end_turn"
    );
    let reqs = model.wait_requests(3).await;
    assert_eq!(reqs[0].api, "anthropic");
    assert_eq!(reqs[1].api, "openai");
    assert_eq!(reqs[1].body["model"], "gpt-test");
    assert_eq!(reqs[1].auth.as_deref(), Some("Bearer openai-test-key"));
    assert_eq!(reqs[1].body["reasoning_effort"], "medium");
    assert!(
        reqs[1].text().contains("hi from claude"),
        "the conversation carries over"
    );
    let tool_msg = reqs[2].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .expect("tool message");
    assert!(tool_msg["content"].as_str().unwrap().contains("forty-two"));
    assert!(
        ed.updates_of("agent_thought_chunk")
            .iter()
            .any(|u| u["content"]["text"] == "hmm")
    );
    // /model goes back, as a slash command.
    assert_eq!(
        ed.prompt(&sid, "/model claude").await.unwrap()["stopReason"],
        "end_turn"
    );
    model.push_stream(vec![text("claude again")]);
    ed.prompt(&sid, "hello").await.unwrap();
    assert_eq!(model.wait_requests(4).await[3].api, "anthropic");
}

#[tokio::test]
async fn builtin_provider_401_is_auth_required() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    model.push(Reply::Status(401, "invalid x-api-key"));
    let e = ed.prompt(&sid, "hi").await.unwrap_err();
    assert_eq!(e["code"], -32000, "{e}");
    assert!(e.to_string().contains("invalid x-api-key"), "{e}");
    // A provider refusing to answer is an error, not a hang; a refusal finish is a stop reason.
    model.push_stream(vec![text("I can't"), Ev::Finish("refusal")]);
    assert_eq!(
        ed.prompt(&sid, "bad").await.unwrap()["stopReason"],
        "refusal"
    );
    model.push_stream(vec![text("long"), Ev::Finish("max_tokens")]);
    assert_eq!(
        ed.prompt(&sid, "long").await.unwrap()["stopReason"],
        "max_tokens"
    );
}

#[tokio::test]
async fn builtin_turn_limit_and_client_tools() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "max_turn_requests = 2")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let bad = json!({ "_meta": { "acpd": { "clientTools": [{ "name": "read_file", "description": "x", "inputSchema": { "type": "object" } }] } } });
    let e = ed
        .request(
            "session/new",
            json!({ "cwd": acpd.work(), "mcpServers": [], "_meta": bad["_meta"] }),
        )
        .await
        .unwrap_err();
    assert_eq!(e["code"], -32602);
    let tools = json!({ "_meta": { "acpd": { "clientTools": [{ "name": "open_url", "description": "Opens a URL in the editor", "inputSchema": { "type": "object", "properties": { "url": { "type": "string" } } }, "mutating": false }] } } });
    let (sid, _) = ed.new_session(&acpd.work(), tools).await;
    model.push_stream(vec![tool(
        "open_url",
        json!({ "url": "https://example.test" }),
    )]);
    model.push_stream(vec![tool("list_dir", json!({}))]);
    assert_eq!(
        ed.prompt(&sid, "open it").await.unwrap()["stopReason"],
        "max_turn_requests"
    );
    let (_, p) = ed
        .requests()
        .into_iter()
        .find(|(m, _)| m == "_acpd/tool_call")
        .expect("client tool called");
    assert_eq!(p["name"], "open_url");
    assert_eq!(p["input"]["url"], "https://example.test");
    let reqs = model.wait_requests(2).await;
    assert!(reqs[0].tool_names().contains(&"open_url".to_owned()));
    assert!(reqs[1].text().contains("client tool open_url ran"));
}

#[tokio::test]
async fn builtin_session_continues_after_a_daemon_restart() {
    let model = ModelServer::start().await;
    let mut acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let sid = {
        let mut ed = acpd.editor(no_caps()).await;
        let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
        ed.request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "plan" }),
        )
        .await
        .unwrap();
        model.push_stream(vec![text("Noted: the word is pelican.")]);
        assert_eq!(
            ed.prompt(&sid, "Remember the word pelican").await.unwrap()["stopReason"],
            "end_turn"
        );
        sid
    };
    acpd.restart().await;
    let mut ed = acpd.editor(no_caps()).await;
    let r = ed
        .request(
            "session/resume",
            json!({ "sessionId": sid, "cwd": acpd.work(), "mcpServers": [] }),
        )
        .await
        .expect("resume after restart");
    assert_eq!(r["modes"]["currentModeId"], "plan", "the mode survived");
    model.push_stream(vec![text("pelican")]);
    assert_eq!(
        ed.prompt(&sid, "What was the word?").await.unwrap()["stopReason"],
        "end_turn"
    );
    let reqs = model.wait_requests(2).await;
    let second = reqs[1].text();
    assert!(
        second.contains("Remember the word pelican")
            && second.contains("Noted: the word is pelican."),
        "{second}"
    );
    // The system prompt is frozen: the same text both times.
    assert_eq!(reqs[0].body["system"], reqs[1].body["system"]);
    assert!(
        !reqs[1].tool_names().contains(&"shell".to_owned()),
        "still in plan mode"
    );
}

#[tokio::test]
async fn builtin_uses_mcp_server_tools() {
    use crate::builtin_support::mcp::{McpHttpServer, stdio_server};
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let http = McpHttpServer::start().await;
    let script = stdio_server(acpd.dir());
    let mut ed = acpd.editor(no_caps()).await;
    let servers = json!({ "mcpServers": [
        { "type": "http", "name": "calc", "url": http.url, "headers": [{ "name": "x-test", "value": "1" }] },
        { "name": "local", "command": script, "args": [], "env": [] },
    ] });
    let (sid, _) = ed.new_session(&acpd.work(), servers).await;
    model.push_stream(vec![tool("mcp__calc__add", json!({ "a": 2, "b": 3 }))]);
    model.push_stream(vec![tool(
        "mcp__local__note",
        json!({ "text": "remember" }),
    )]);
    model.push_stream(vec![text("5, noted")]);
    assert_eq!(
        ed.prompt(&sid, "add and note").await.unwrap()["stopReason"],
        "end_turn"
    );
    let reqs = model.wait_requests(3).await;
    let names = reqs[0].tool_names();
    for n in [
        "mcp__calc__add",
        "mcp__calc__note",
        "mcp__local__add",
        "mcp__local__note",
    ] {
        assert!(names.contains(&n.to_owned()), "{n} not offered: {names:?}");
    }
    assert!(reqs[1].text().contains("sum=5"), "{}", reqs[1].text());
    assert!(reqs[2].text().contains("stdio says hi"));
    assert_eq!(http.calls()[0]["name"], "add");
    let log =
        std::fs::read_to_string(acpd.dir().join("calls.log")).expect("the stdio server was called");
    assert!(log.contains("remember"));
    // Only the tool without a read-only hint asked for permission.
    assert_eq!(
        ed.request_methods()
            .iter()
            .filter(|m| *m == "session/request_permission")
            .count(),
        1
    );
    // Plan mode keeps the read-only MCP tool and hides the other.
    ed.request(
        "session/set_mode",
        json!({ "sessionId": sid, "modeId": "plan" }),
    )
    .await
    .unwrap();
    model.push_stream(vec![text("planned")]);
    ed.prompt(&sid, "plan").await.unwrap();
    let names = model.wait_requests(4).await[3].tool_names();
    assert!(
        names.contains(&"mcp__calc__add".to_owned())
            && !names.contains(&"mcp__calc__note".to_owned()),
        "{names:?}"
    );
}

#[tokio::test]
async fn builtin_from_environment_and_compact() {
    let model = ModelServer::start().await;
    let base = format!("http://{}", model.addr);
    let acpd = Acpd::start_with_env(
        "",
        &[
            ("ANTHROPIC_BASE_URL", &base),
            ("ANTHROPIC_API_KEY", "env-key"),
            ("ACPD_MODEL", "anthropic/claude-env"),
        ],
    )
    .await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, new) = ed.new_session(&acpd.work(), json!({})).await;
    let model_opt = new["configOptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == "model")
        .cloned()
        .unwrap();
    assert_eq!(model_opt["currentValue"], "anthropic/claude-env");
    model.push_stream(vec![text("hi there")]);
    ed.prompt(&sid, "the secret is walrus").await.unwrap();
    model.push_stream(vec![text("SUMMARY: the user said the secret is walrus")]);
    assert_eq!(
        ed.prompt(&sid, "/compact").await.unwrap()["stopReason"],
        "end_turn"
    );
    model.push_stream(vec![text("walrus")]);
    ed.prompt(&sid, "what was it?").await.unwrap();
    let reqs = model.wait_requests(3).await;
    assert_eq!(reqs[0].body["model"], "claude-env");
    assert_eq!(reqs[0].auth.as_deref(), Some("env-key"));
    assert!(
        reqs[1].text().contains("Do not call any tool now"),
        "the summary request"
    );
    let last = reqs[2].text();
    assert!(
        last.contains("SUMMARY: the user said") && !last.contains("hi there"),
        "{last}"
    );

    // A local OpenAI-compatible server needs no key.
    let local = Acpd::start_with_env(
        "",
        &[
            ("OPENAI_BASE_URL", &format!("{base}/v1")),
            ("ACPD_MODEL", "openai/local-model"),
        ],
    )
    .await;
    let mut ed = local.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&local.work(), json!({})).await;
    model.push_stream(vec![text("local hello")]);
    assert_eq!(
        ed.prompt(&sid, "hi").await.unwrap()["stopReason"],
        "end_turn"
    );
    let r = &model.wait_requests(4).await[3];
    assert_eq!(
        (r.api, r.body["model"].as_str()),
        ("openai", Some("local-model"))
    );
    assert_eq!(r.auth, None);
}

#[tokio::test]
async fn builtin_cancel_during_a_client_terminal() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(full_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    model.push_stream(vec![tool("shell", json!({ "command": "sleep 60" }))]);
    let rx = ed.start_prompt(&sid, "sleep in the editor");
    ed.wait_update("the terminal shown", |u| {
        u["content"][0]["type"] == "terminal"
    })
    .await;
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !ed.request_methods().iter().any(|m| m == "terminal/release") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "terminal not released: {:?}",
            ed.request_methods()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ed.request_methods().iter().any(|m| m == "terminal/kill"));
}

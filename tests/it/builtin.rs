//! The built-in agent end to end: the real `acpd` over WebSocket, the agent's model calls
//! going to a scripted model server (Anthropic and OpenAI formats over real HTTP + SSE):
//! sessions, modes, models, the environment. Tools: `builtin_tools.rs`; model providers
//! failing, stalling or flooding: `builtin_provider.rs`.

use serde_json::json;

use crate::builtin_support::model::{Ev, Reply, text, tool};
use crate::builtin_support::{
    Acpd, ModelServer, builtin_config, finished_updates, full_caps, is, no_caps,
};
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

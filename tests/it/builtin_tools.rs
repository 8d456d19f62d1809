//! The built-in agent's tools end to end: host tools confined to the session's directories,
//! permissions, cancelling mid-tool, client-declared tools, MCP servers.

use serde_json::{Value, json};

use crate::builtin_support::model::{Ev, text, tool};
use crate::builtin_support::{
    Acpd, ModelServer, builtin_config, finished_updates, full_caps, no_caps,
};

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
    // The model streams the text in two halves; cancel once both arrived, so what the
    // history must keep is all there (cancelling after the first raced the second).
    ed.wait_update("the partial text", |u| {
        u["sessionUpdate"] == "agent_message_chunk"
            && u["content"]["text"]
                .as_str()
                .is_some_and(|t| t.ends_with("answer"))
    })
    .await;
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");

    // Mid-tool (a host command that would run for a minute).
    ed.answer_permissions(&["allow_always"]);
    model.push_stream(vec![tool("shell", json!({ "command": "sleep 60" }))]);
    let rx = ed.start_prompt(&sid, "sleep");
    ed.wait_update("the shell running", |u| u["status"] == "in_progress")
        .await;
    ed.notify("session/cancel", json!({ "sessionId": sid }));
    // `sleep 60` outlives the editor's wait: an answer means the command was stopped.
    assert_eq!(ed.finish(rx).await.unwrap()["stopReason"], "cancelled");

    // While a permission request is pending: acpd answers it `cancelled`.
    ed.hold_permissions(true);
    model.push_stream(vec![tool(
        "write_file",
        json!({ "path": "x.txt", "content": "x" }),
    )]);
    let rx = ed.start_prompt(&sid, "write");
    ed.wait_request("session/request_permission").await;
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
async fn builtin_uses_mcp_server_tools() {
    use crate::builtin_support::mcp::{McpHttpServer, stdio_server};
    let model = ModelServer::start().await;
    // Stdio servers start without asking here (the policy itself: tests/it/mcp_policy.rs).
    let config = format!("mcp_stdio = \"allow\"\n{}", builtin_config(model.addr, ""));
    let acpd = Acpd::start(&config).await;
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
    ed.wait_request("terminal/release").await;
    assert!(ed.request_methods().iter().any(|m| m == "terminal/kill"));
}

#[tokio::test]
async fn builtin_symlinks_out_of_the_cwd_are_refused_before_asking() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let work = acpd.work();
    let planted = acpd.dir().join("planted.txt");
    let config = acpd.dir().join("acpd.toml");
    let link = |to: &std::path::Path, name: &str| std::os::unix::fs::symlink(to, work.join(name));
    link(&planted, "dangling").unwrap(); // absolute, to a file that does not exist
    link(&config, "config").unwrap(); // absolute, to a file that exists
    link(std::path::Path::new("../acpd.toml"), "rel").unwrap(); // relative, up and out
    model.push_stream(vec![tool(
        "write_file",
        json!({ "path": "dangling", "content": "pwned" }),
    )]);
    model.push_stream(vec![tool("read_file", json!({ "path": "config" }))]);
    model.push_stream(vec![tool(
        "edit",
        json!({ "path": "rel", "old_string": "claude", "new_string": "pwned" }),
    )]);
    model.push_stream(vec![tool(
        "write_file",
        json!({ "path": "new/fine.txt", "content": "fine" }),
    )]);
    model.push_stream(vec![text("done")]);

    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&work, json!({})).await;
    assert_eq!(
        ed.prompt(&sid, "go").await.unwrap()["stopReason"],
        "end_turn"
    );
    assert!(
        !planted.exists(),
        "nothing written through the dangling link"
    );
    let cfg = std::fs::read_to_string(&config).unwrap();
    assert!(cfg.contains("claude") && !cfg.contains("pwned"), "{cfg}");
    assert_eq!(
        std::fs::read_to_string(work.join("new/fine.txt")).unwrap(),
        "fine"
    );
    let perms = ed
        .request_methods()
        .into_iter()
        .filter(|m| m == "session/request_permission")
        .count();
    assert_eq!(
        perms, 1,
        "only the write inside the cwd was put to the user"
    );
    let reqs = model.wait_requests(5).await;
    // Each request carries the results so far: one refusal more each time.
    for (i, r) in reqs.iter().enumerate().take(4) {
        let refused = r.text().matches("outside the session").count();
        assert_eq!(refused, i, "request {i}: {}", r.text());
    }
    assert!(
        reqs.iter()
            .all(|r| !r.text().contains("anthropic-test-key")),
        "the config was not read"
    );
    let failed = finished_updates(&ed.seen)
        .into_iter()
        .filter(|u| u["status"] == "failed")
        .count();
    assert_eq!(failed, 3);
}

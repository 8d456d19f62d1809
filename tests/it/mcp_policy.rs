//! Stdio MCP servers are commands: the built-in agent starts one only under `mcp_stdio`
//! ("ask" by default: the client sees the exact command line; "always" lasts the session)
//! and `mcp_stdio_allow`. Each server touches a marker file when (if ever) it runs.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::builtin_support::mcp::stdio_server;
use crate::builtin_support::model::text;
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};

/// A stdio server that touches `marker` and then is the test MCP server.
fn marked_server(name: &str, dir: &Path, marker: &Path) -> Value {
    let script = stdio_server(dir);
    json!({ "name": name, "command": "sh",
        "args": ["-c", format!("touch {} && exec {}", marker.display(), script.display())],
        "env": [] })
}

fn permission_asks(requests: &[(String, Value)]) -> Vec<Value> {
    requests
        .iter()
        .filter(|(m, _)| m == "session/request_permission")
        .map(|(_, p)| p.clone())
        .collect()
}

fn marker(acpd: &Acpd, name: &str) -> PathBuf {
    acpd.dir().join(name)
}

#[tokio::test]
async fn a_stdio_mcp_server_without_consent_does_not_start() {
    let model = ModelServer::start().await;
    // The default policy.
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    ed.answer_permissions(&["reject_once"]);
    let m = marker(&acpd, "ran");
    let servers = json!({ "mcpServers": [marked_server("evil", acpd.dir(), &m)] });
    let (sid, _) = ed.new_session(&acpd.work(), servers).await;
    assert!(!m.exists(), "session/new started the command");
    model.push_stream(vec![text("fine")]);
    let r = ed.prompt(&sid, "hello").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let asks = permission_asks(&ed.requests());
    assert_eq!(asks.len(), 1, "{asks:?}");
    // The exact command line is shown.
    let title = asks[0]["toolCall"]["title"].as_str().unwrap_or_default();
    assert!(
        title.contains(&format!("touch {}", m.display())) && title.contains("sh -c"),
        "{title}"
    );
    assert!(!m.exists(), "a rejected MCP server ran");
    // The model was not offered its tools, and the user was told.
    let reqs = model.wait_requests(1).await;
    assert!(reqs[0].tool_names().iter().all(|n| !n.starts_with("mcp__")));
}

#[tokio::test]
async fn a_consented_stdio_mcp_server_starts_and_always_lasts_the_session() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    ed.answer_permissions(&["allow_always"]);
    let m = marker(&acpd, "ran");
    let servers = json!({ "mcpServers": [marked_server("local", acpd.dir(), &m)] });
    let (sid, _) = ed.new_session(&acpd.work(), servers.clone()).await;
    model.push_stream(vec![text("one")]);
    ed.prompt(&sid, "hello").await.expect("prompt");
    assert!(m.exists(), "the consented server did not start");
    let reqs = model.wait_requests(1).await;
    assert!(
        reqs[0]
            .tool_names()
            .contains(&"mcp__local__note".to_owned())
    );
    assert_eq!(permission_asks(&ed.requests()).len(), 1);
    // After a restart, the session loaded with the same server: started without asking.
    drop(ed);
    std::fs::remove_file(&m).expect("remove marker");
    let mut acpd = acpd;
    acpd.restart().await;
    let mut ed = acpd.editor(no_caps()).await;
    let mut params = servers;
    params["sessionId"] = json!(sid);
    params["cwd"] = json!(acpd.work());
    ed.request("session/load", params).await.expect("load");
    model.push_stream(vec![text("two")]);
    ed.prompt(&sid, "again").await.expect("prompt");
    assert!(m.exists(), "the server did not start again");
    assert!(permission_asks(&ed.requests()).is_empty());
}

#[tokio::test]
async fn mcp_stdio_deny_starts_only_the_allowlist_and_never_asks() {
    let model = ModelServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let allowed = stdio_server(dir.path());
    let config = format!(
        "mcp_stdio = \"deny\"\nmcp_stdio_allow = [{:?}]\n{}",
        allowed.display().to_string(),
        builtin_config(model.addr, "")
    );
    let acpd = Acpd::start(&config).await;
    let mut ed = acpd.editor(no_caps()).await;
    let m = marker(&acpd, "ran");
    let servers = json!({ "mcpServers": [
        marked_server("evil", acpd.dir(), &m),
        { "name": "ok", "command": allowed, "args": [], "env": [] },
    ] });
    let (sid, _) = ed.new_session(&acpd.work(), servers).await;
    model.push_stream(vec![text("done")]);
    ed.prompt(&sid, "hello").await.expect("prompt");
    assert!(!m.exists(), "a denied MCP server ran");
    assert!(permission_asks(&ed.requests()).is_empty());
    let names = model.wait_requests(1).await[0].tool_names();
    assert!(names.contains(&"mcp__ok__note".to_owned()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("mcp__evil")),
        "{names:?}"
    );
}

/// The client is the party `shell = "deny"` / `host_shell = false` restricts: its "allow"
/// must not start a command through `mcpServers` either.
#[tokio::test]
async fn without_a_shell_a_stdio_mcp_server_does_not_start_even_when_the_client_allows() {
    for shell in ["permissions.tools.shell = \"deny\"", "host_shell = false"] {
        let model = ModelServer::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let allowed = stdio_server(dir.path());
        let config = format!(
            "mcp_stdio_allow = [{:?}]\n{}",
            allowed.display().to_string(),
            builtin_config(model.addr, shell)
        );
        let acpd = Acpd::start(&config).await;
        let mut ed = acpd.editor(no_caps()).await;
        ed.answer_permissions(&["allow_always", "allow_always"]);
        let m = marker(&acpd, "ran");
        let servers = json!({ "mcpServers": [
            marked_server("evil", acpd.dir(), &m),
            { "name": "ok", "command": allowed, "args": [], "env": [] },
        ] });
        let (sid, _) = ed.new_session(&acpd.work(), servers).await;
        model.push_stream(vec![text("done")]);
        ed.prompt(&sid, "hello").await.expect("prompt");
        assert!(!m.exists(), "{shell}: a stdio MCP server ran");
        assert!(permission_asks(&ed.requests()).is_empty(), "{shell}");
        // The operator's allowlist still starts.
        let names = model.wait_requests(1).await[0].tool_names();
        assert!(
            names.contains(&"mcp__ok__note".to_owned()),
            "{shell}: {names:?}"
        );
    }
}

//! Stdio MCP servers and hosted agents: the scripted agent, like a real one, starts every
//! stdio server it is sent, so whether acpd let one through shows as a marker file. Under the
//! default policy ("ask", which acpd cannot ask for a hosted agent) and "deny" none reaches
//! the agent, in `session/new`, `session/load` or a restore after a restart; the allowlist
//! and "allow" let them through.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Daemon, DaemonOptions};

fn marked(marker: &Path) -> Value {
    json!({ "name": "evil", "command": "sh",
        "args": ["-c", format!("touch {}", marker.display())], "env": [] })
}

/// Whether `marker` appears within a while (the agent starts servers as it answers).
async fn appears(marker: &Path) -> bool {
    for _ in 0..20 {
        if marker.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    marker.exists()
}

#[tokio::test]
async fn a_hosted_agent_gets_no_stdio_mcp_server_without_consent() {
    let mut daemon = Daemon::start().await;
    let marker = daemon.dir().join("ran");
    let mut c = daemon.client().await;
    let r = c
        .request(
            "session/new",
            json!({ "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
        )
        .await
        .expect("session/new still succeeds");
    let sid = r["sessionId"].as_str().unwrap().to_owned();
    assert!(!appears(&marker).await, "session/new started the command");
    let refused = r["_meta"]["acpd"]["mcpServersRefused"].to_string();
    assert!(
        refused.contains(&format!("touch {}", marker.display())),
        "{r}"
    );
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(log.contains("stdio MCP server dropped"), "no audit line");

    // A load after a restart (the agent side re-created, the client's servers adopted).
    daemon.restart().await;
    let mut c = daemon.client().await;
    c.request(
        "session/load",
        json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
    )
    .await
    .expect("session/load");
    c.request(
        "session/resume",
        json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
    )
    .await
    .expect("session/resume");
    let (_, r) = c.prompt(&sid, "echo hi").await;
    r.expect("prompt");
    assert!(!appears(&marker).await, "load/resume started the command");
}

#[tokio::test]
async fn deny_refuses_and_the_allowlist_and_allow_let_servers_start() {
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--mcp-stdio", "deny")).await;
    let marker = daemon.dir().join("ran");
    let mut c = daemon.client().await;
    c.request(
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
    )
    .await
    .expect("session/new");
    assert!(!appears(&marker).await, "deny started the command");

    let conf = tempfile::tempdir().unwrap();
    let file = conf.path().join("acpd.toml");
    std::fs::write(&file, "mcp_stdio_allow = [\"sh\"]\n").unwrap();
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--config", file.display())).await;
    let marker = daemon.dir().join("ran");
    let mut c = daemon.client().await;
    c.request(
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
    )
    .await
    .expect("session/new");
    assert!(
        appears(&marker).await,
        "an allowlisted server did not start"
    );

    let daemon = Daemon::start_with(DaemonOptions::default().arg("--mcp-stdio", "allow")).await;
    let marker = daemon.dir().join("ran");
    let mut c = daemon.client().await;
    c.request(
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [marked(&marker)] }),
    )
    .await
    .expect("session/new");
    assert!(appears(&marker).await, "allow did not start the server");
}

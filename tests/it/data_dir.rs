//! acpd's data directory (the local user's token, every transcript) is off limits: a second
//! principal cannot open a session around it (the parent of the data directory as its cwd,
//! with no roots configured), and the built-in agent's tools refuse it whatever the
//! session's cwd — `read_file`, `list_dir`, `grep` and the shell's working directory.

use serde_json::json;

use crate::builtin_support::model::{text, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};
use crate::support::security_support as sec;
use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn a_session_around_the_data_directory_is_refused() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let secret = sec::token_create(&daemon, "mallory").await;
    let (h, v) = sec::bearer(&secret);
    let mut mallory = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    mallory.initialize().await;
    // No roots configured: the daemon's temp dir holds `data/` (with `data/token`).
    for cwd in [daemon.dir().to_owned(), daemon.dir().join("data/..")] {
        let err = mallory
            .request("session/new", json!({ "cwd": cwd, "mcpServers": [] }))
            .await
            .expect_err("a session around the data directory");
        assert_eq!(err.code, -32602, "{err}");
        assert!(err.message.contains("data directory"), "{err}");
    }
    // The connection lives on; the work dir beside the data directory is fine.
    mallory.open_session(&daemon.work_dir()).await;
}

#[tokio::test]
async fn no_builtin_tool_reaches_the_data_directory() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "permissions.mode = \"off\"")).await;
    let data = acpd.dir().join("data");
    let token = data.join("seeded-secret");
    std::fs::write(&token, "seeded-secret-value").expect("seed a file in the data dir");
    let calls = [
        tool("read_file", json!({ "path": token })),
        tool("read_file", json!({ "path": "../data/seeded-secret" })),
        tool("list_dir", json!({ "path": data })),
        tool("grep", json!({ "pattern": "seeded", "path": data })),
    ];
    for call in calls {
        model.push_stream(vec![call]);
    }
    model.push_stream(vec![text("done")]);
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let r = ed.prompt(&sid, "look for secrets").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let reqs = model.wait_requests(5).await;
    for (i, req) in reqs.iter().enumerate().skip(1) {
        let seen = req.text();
        assert!(!seen.contains("seeded-secret-value"), "call {i}: {seen}");
    }
    // Each call was answered with a refusal, not with the file or its name.
    let last = reqs[4].text();
    assert!(last.contains("data directory"), "{last}");
    assert!(!last.contains("seeded-secret:"), "{last}");
}

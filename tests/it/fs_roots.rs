//! Filesystem roots: acpd's data directory can never be a session root (exit 64), and the
//! built-in agent's host shell runs confined to the session's directories (Landlock), so a
//! command the user permitted still cannot read a file outside them.

use serde_json::json;

use crate::builtin_support::model::{text, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};
use crate::support::security_support::acpd;

#[tokio::test]
async fn a_root_that_reaches_the_data_directory_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let cases = [
        format!("default_roots = [{:?}]", dir.path().display().to_string()),
        format!(
            "default_roots = [{:?}]",
            data.join("builtin").display().to_string()
        ),
        "roots = { alice = [\"/\"] }".to_owned(),
        "default_roots = [\"relative\"]".to_owned(),
    ];
    for case in cases {
        let file = dir.path().join("acpd.toml");
        std::fs::write(&file, &case).expect("config");
        let run = acpd(&[
            "check-config",
            "--config",
            &file.display().to_string(),
            "--data-dir",
            &data.display().to_string(),
        ])
        .await;
        assert_eq!(run.code, Some(64), "{case}: {}", run.stderr);
        assert!(run.stderr.contains("roots"), "{case}: {}", run.stderr);
    }
    let ok = format!(
        "default_roots = [{:?}]",
        dir.path().join("work").display().to_string()
    );
    std::fs::write(dir.path().join("acpd.toml"), ok).expect("config");
    let file = dir.path().join("acpd.toml").display().to_string();
    let data = data.display().to_string();
    let run = acpd(&["check-config", "--config", &file, "--data-dir", &data]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[tokio::test]
async fn a_permitted_shell_command_cannot_read_outside_the_roots() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let work = acpd.work();
    std::fs::write(work.join("inside.txt"), "inside-ok\n").expect("write");
    // acpd.toml, one level up, holds the model's API key.
    model.push_stream(vec![tool(
        "shell",
        json!({ "command": "cat inside.txt; cat ../acpd.toml; echo made > made.txt" }),
    )]);
    model.push_stream(vec![text("done")]);
    let mut ed = acpd.editor(no_caps()).await;
    ed.answer_permissions(&["allow_once"]);
    let (sid, _) = ed.new_session(&work, json!({})).await;
    let r = ed.prompt(&sid, "go").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let reqs = model.wait_requests(2).await;
    let result = reqs[1].text();
    assert!(result.contains("inside-ok"), "{result}");
    assert!(
        !result.contains("anthropic-test-key"),
        "read outside: {result}"
    );
    assert!(result.contains("Permission denied"), "{result}");
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).expect("written inside"),
        "made\n"
    );
}

/// `session/new` in `cwd` with `extra` directories: the error code and message, if refused.
async fn refused(
    client: &mut crate::support::Client,
    cwd: &std::path::Path,
    extra: &[&std::path::Path],
) -> Option<(i64, String)> {
    let params = json!({ "cwd": cwd, "additionalDirectories": extra, "mcpServers": [] });
    match client.request("session/new", params).await {
        Ok(_) => None,
        Err(e) => Some((e.code, e.message)),
    }
}

#[tokio::test]
async fn no_session_may_use_acpds_data_directory() {
    // The first-start token and every transcript live there: a session in it (or reaching it
    // through a symlink, or as an extra directory) would let its tools read them.
    let daemon = crate::support::Daemon::start().await;
    let mut client = daemon.client().await;
    let work = daemon.work_dir();
    let data = work.parent().unwrap().join("data");
    std::os::unix::fs::symlink(&data, work.join("innocent")).expect("symlink");
    for (cwd, extra) in [
        (data.clone(), vec![]),
        (data.join("builtin"), vec![]),
        (work.join("innocent"), vec![]),
        (work.clone(), vec![data.as_path()]),
    ] {
        let (code, message) = refused(&mut client, &cwd, &extra)
            .await
            .unwrap_or_else(|| panic!("a session in {} {extra:?} was allowed", cwd.display()));
        assert_eq!(code, -32602, "{message}");
        assert!(message.contains("data directory"), "{message}");
    }
    assert_eq!(
        refused(&mut client, &work, &[]).await,
        None,
        "the work dir is fine"
    );
}

#[tokio::test]
async fn sessions_stay_within_the_configured_roots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("projects");
    std::fs::create_dir_all(root.join("app")).expect("root");
    let config = dir.path().join("acpd.toml");
    std::fs::write(
        &config,
        format!("default_roots = [{:?}]\n", root.display().to_string()),
    )
    .expect("config");
    let daemon = crate::support::Daemon::start_with(
        crate::support::DaemonOptions::default().arg("--config", config.display()),
    )
    .await;
    let mut client = daemon.client().await;
    let (code, message) = refused(&mut client, &daemon.work_dir(), &[])
        .await
        .expect("a cwd outside the roots is refused");
    assert_eq!(code, -32602);
    assert!(message.contains("outside"), "{message}");
    assert_eq!(refused(&mut client, &root.join("app"), &[]).await, None);
    let (code, _) = refused(&mut client, &root.join("app"), &[dir.path()])
        .await
        .expect("an extra directory outside the roots is refused");
    assert_eq!(code, -32602);
}

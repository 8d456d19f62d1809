//! Session bookkeeping: `session/list` (pages, cwd filter, titles from the journal and from
//! the agent's own list, RFC 3339 times),
//! `session/close`, `session/delete`, and -32002 for ids acpd does not know.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::support::{Daemon, DaemonOptions, client_of, daemon_with_profile, is_rfc3339};

/// Walks every page of `session/list` for `cwd`; returns the sessions and the page sizes.
async fn list_all(
    client: &mut crate::support::Client,
    cwd: &std::path::Path,
) -> (Vec<Value>, Vec<usize>) {
    let mut sessions = Vec::new();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list(Some(cwd), cursor.as_deref())
            .await
            .expect("session/list");
        let items = page["sessions"].as_array().expect("sessions array").clone();
        pages.push(items.len());
        sessions.extend(items);
        match page.get("nextCursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
        assert!(pages.len() < 20, "session/list never ends: pages {pages:?}");
    }
    (sessions, pages)
}

#[tokio::test]
async fn list_pages_newest_first() {
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--list-page-size", 3)).await;
    let mut client = daemon.client().await;
    let cwd = daemon.work_dir();
    let mut created = Vec::new();
    for _ in 0..7 {
        created.push(client.new_session(&cwd).await);
    }
    let (sessions, pages) = list_all(&mut client, &cwd).await;
    assert_eq!(pages, [3, 3, 1], "page size 3 over 7 sessions");
    let ids: Vec<&str> = sessions
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    let newest_first: Vec<&str> = created.iter().rev().map(String::as_str).collect();
    assert_eq!(ids, newest_first);
    for session in &sessions {
        assert_eq!(session["cwd"], json!(cwd));
        let updated = session["updatedAt"].as_str().expect("updatedAt");
        assert!(is_rfc3339(updated), "updatedAt is not RFC 3339: {updated}");
    }
}

#[tokio::test]
async fn list_filters_by_cwd_and_rejects_invalid_cursors() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let here = daemon.work_dir();
    let there = daemon.dir().join("elsewhere");
    std::fs::create_dir_all(&there).unwrap();
    let a = client.new_session(&here).await;
    let b = client.new_session(&there).await;

    let (sessions, _) = list_all(&mut client, &there).await;
    let ids: Vec<&str> = sessions
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [b.as_str()]);

    let all = client.list(None, None).await.unwrap();
    let ids: HashSet<&str> = all["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, HashSet::from([a.as_str(), b.as_str()]));

    let err = client.list(None, Some("not-a-cursor!")).await.unwrap_err();
    assert_eq!(err.code, -32602, "{err}");
}

#[tokio::test]
async fn titles_come_from_session_info_updates() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let untitled = client.new_session(&daemon.work_dir()).await;
    let (_, result) = client
        .prompt(&sid, "title Fix the flaky test; echo ok")
        .await;
    result.unwrap();
    let (sessions, _) = list_all(&mut client, &daemon.work_dir()).await;
    let find = |id: &str| {
        sessions
            .iter()
            .find(|s| s["sessionId"] == id)
            .cloned()
            .expect("listed")
    };
    assert_eq!(find(&sid)["title"], "Fix the flaky test");
    assert!(find(&untitled)["title"].is_null());
}

/// claude-agent-acp and opencode name sessions only in their own `session/list`: acpd asks the
/// agent (it advertises `sessionCapabilities.list`) and merges titles by its session id.
#[tokio::test]
async fn titles_come_from_the_agents_own_list() {
    let daemon = daemon_with_profile("lister", "--list").await;
    let cwd = daemon.work_dir();
    let (mut client, _) = client_of(&daemon, "lister").await;
    let sid = client.open_session(&cwd).await;
    let untitled = client.new_session(&cwd).await;
    let (updates, result) = client
        .prompt(&sid, "title Refactor the parser; echo ok")
        .await;
    result.unwrap();
    assert!(
        updates
            .iter()
            .all(|u| u["update"]["sessionUpdate"] != "session_info_update"),
        "this agent sends no title update: {updates:?}"
    );
    let (sessions, _) = list_all(&mut client, &cwd).await;
    let find = |id: &str| {
        sessions
            .iter()
            .find(|s| s["sessionId"] == id)
            .cloned()
            .expect("listed")
    };
    assert_eq!(find(&sid)["title"], "Refactor the parser");
    assert!(find(&untitled)["title"].is_null());
    assert!(is_rfc3339(find(&sid)["updatedAt"].as_str().unwrap()));
}

/// qwen-code names sessions only in its own `session/list`, and that list is of one project:
/// the request's `cwd`, or the agent process's own directory when none is given. acpd's list
/// without a `cwd` still carries the titles of sessions made in other directories.
#[tokio::test]
async fn titles_come_from_an_agent_whose_list_is_per_cwd() {
    let daemon = daemon_with_profile("qwenlike", "--list-by-cwd").await;
    let here = daemon.work_dir();
    let there = daemon.dir().join("elsewhere");
    std::fs::create_dir_all(&there).unwrap();
    let (mut client, _) = client_of(&daemon, "qwenlike").await;
    let a = client.open_session(&here).await;
    let b = client.open_session(&there).await;
    let untitled = client.new_session(&here).await;
    for (sid, title) in [(&a, "Port the lexer"), (&b, "Fix the build")] {
        let (updates, result) = client.prompt(sid, &format!("title {title}; echo ok")).await;
        result.unwrap();
        assert!(
            updates
                .iter()
                .all(|u| u["update"]["sessionUpdate"] != "session_info_update"),
            "this agent sends no title update: {updates:?}"
        );
    }
    for cwd in [None, Some(here.as_path())] {
        let page = client.list(cwd, None).await.expect("session/list");
        let sessions = page["sessions"].as_array().unwrap();
        let title = |id: &str| {
            sessions
                .iter()
                .find(|s| s["sessionId"] == id)
                .map(|s| s["title"].clone())
        };
        assert_eq!(
            title(&a),
            Some(json!("Port the lexer")),
            "cwd {cwd:?}: {page}"
        );
        assert_eq!(title(&untitled), Some(Value::Null), "cwd {cwd:?}: {page}");
        match cwd {
            None => assert_eq!(title(&b), Some(json!("Fix the build")), "{page}"),
            Some(_) => assert_eq!(title(&b), None, "another cwd's: {page}"),
        }
    }
}

#[tokio::test]
async fn close_cancels_the_turn_and_keeps_the_session() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let prompt = client
        .send_prompt(&sid, "echo working; wait_for_cancel")
        .await;
    client.updates_until_text("working").await;
    let result = client
        .request("session/close", json!({ "sessionId": sid }))
        .await;
    assert_eq!(result.unwrap(), json!({}));
    let (_, answer) = client.collect_updates_until_response(&prompt).await;
    assert_eq!(
        answer.unwrap(),
        json!({ "stopReason": "cancelled" }),
        "close cancels the running turn"
    );

    // Closed is not deleted: still listed, still loadable.
    let (sessions, _) = list_all(&mut client, &daemon.work_dir()).await;
    assert!(sessions.iter().any(|s| s["sessionId"] == sid.as_str()));
    let mut other = daemon.client().await;
    let (replayed, result) = other.load(&sid, &daemon.work_dir()).await;
    result.expect("load after close");
    assert!(
        replayed
            .iter()
            .any(|u| u["update"]["content"]["text"] == "working")
    );
}

#[tokio::test]
async fn delete_removes_the_session() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let keep = client.new_session(&daemon.work_dir()).await;
    let gone = client.open_session(&daemon.work_dir()).await;
    client.prompt(&gone, "echo soon gone").await.1.unwrap();
    assert_eq!(
        client
            .request("session/delete", json!({ "sessionId": gone }))
            .await
            .unwrap(),
        json!({})
    );

    let (sessions, _) = list_all(&mut client, &daemon.work_dir()).await;
    let ids: Vec<&str> = sessions
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [keep.as_str()]);
    let err = client.load(&gone, &daemon.work_dir()).await.1.unwrap_err();
    assert_eq!(err.code, -32002, "{err}");
    // Deleting what does not exist (any more) succeeds silently.
    assert_eq!(
        client
            .request("session/delete", json!({ "sessionId": gone }))
            .await
            .unwrap(),
        json!({})
    );
    assert_eq!(
        client
            .request("session/delete", json!({ "sessionId": "never-was" }))
            .await
            .unwrap(),
        json!({})
    );
}

#[tokio::test]
async fn unknown_session_ids_are_not_found() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let cwd = daemon.work_dir();
    let id = "no-such-session";
    let calls = [
        (
            "session/load",
            json!({ "sessionId": id, "cwd": cwd, "mcpServers": [] }),
        ),
        (
            "session/resume",
            json!({ "sessionId": id, "cwd": cwd, "mcpServers": [] }),
        ),
        (
            "session/prompt",
            json!({ "sessionId": id, "prompt": [{ "type": "text", "text": "echo x" }] }),
        ),
        ("session/close", json!({ "sessionId": id })),
        (
            "session/set_mode",
            json!({ "sessionId": id, "modeId": "plan" }),
        ),
        (
            "session/set_config_option",
            json!({ "sessionId": id, "configId": "verbosity", "value": "high" }),
        ),
        (
            "_acpd/session/attach",
            json!({ "sessionId": id, "afterSeq": 0 }),
        ),
    ];
    for (method, params) in calls {
        let err = client.request(method, params).await.expect_err(method);
        assert_eq!(err.code, -32002, "{method}: {err}");
    }
}

//! `session/fork`: for an agent that forks (`sessionCapabilities.fork`), the fork is an acpd
//! session of its own — a new acpd id (never the agent's), its journal a copy of the
//! parent's, listed, prompted, closed; the parent goes on untouched. For an agent that does
//! not, acpd's capabilities have no `fork` and `session/fork` is -32601.

use serde_json::{Value, json};

use crate::support::{
    Daemon, agent_texts, assert_consecutive, client_of, daemon_with_profile, kind,
};

fn fork_params(sid: &str, cwd: &std::path::Path) -> Value {
    json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] })
}

#[tokio::test]
async fn a_fork_is_an_acpd_session_with_the_parents_history() {
    let daemon = daemon_with_profile("fork", "--fork").await;
    let cwd = daemon.work_dir();
    let (mut client, init) = client_of(&daemon, "fork").await;
    assert!(
        init.pointer("/agentCapabilities/sessionCapabilities/fork")
            .is_some(),
        "{init}"
    );
    let parent = client.open_session(&cwd).await;
    let (_, r) = client.prompt(&parent, "echo one").await;
    r.unwrap();

    let fork = client
        .request("session/fork", fork_params(&parent, &cwd))
        .await
        .expect("session/fork");
    let fork_id = fork["sessionId"].as_str().expect("sessionId").to_owned();
    assert!(
        fork_id.starts_with("s-"),
        "an acpd id, not the agent's: {fork_id}"
    );
    assert_ne!(fork_id, parent);
    assert!(fork.get("modes").is_some(), "{fork}");

    // Listed next to its parent.
    let list = client.list(None, None).await.unwrap();
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [fork_id.as_str(), parent.as_str()]);

    // Its journal starts as a copy of the parent's, under its own id and seqs.
    let mut other = client_of(&daemon, "fork").await.0;
    let (replayed, r) = other.load(&fork_id, &cwd).await;
    r.expect("load the fork");
    assert_eq!(agent_texts(&replayed), ["one"]);
    assert!(replayed.iter().all(|u| u["sessionId"] == fork_id.as_str()));
    // The history in seq order, then the session's state (its commands) once.
    let (history, state) = replayed.split_at(replayed.len() - 1);
    assert_consecutive(history);
    assert_eq!(kind(&state[0]), "available_commands_update");
    assert!(replayed.iter().any(|u| kind(u) == "user_message_chunk"));

    // It runs on the agent's fork; the parent is untouched.
    let (updates, r) = client.prompt(&fork_id, "echo two").await;
    assert_eq!(r.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["two"]);
    assert!(updates.iter().all(|u| u["sessionId"] == fork_id.as_str()));
    let (updates, r) = client.prompt(&parent, "echo three").await;
    r.unwrap();
    assert_eq!(agent_texts(&updates), ["three"]);

    // Closable; a closed fork is still listed, the parent still works.
    let closed = client
        .request("session/close", json!({ "sessionId": fork_id }))
        .await;
    assert_eq!(closed.unwrap(), json!({}));
    let (updates, r) = client.prompt(&parent, "echo four").await;
    r.unwrap();
    assert_eq!(agent_texts(&updates), ["four"]);
    let mut third = client_of(&daemon, "fork").await.0;
    let (replayed, r) = third.load(&parent, &cwd).await;
    r.unwrap();
    assert_eq!(agent_texts(&replayed), ["one", "three", "four"]);
}

#[tokio::test]
async fn an_agent_without_fork_is_refused_cleanly() {
    let daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    let mut client = daemon.connect().await;
    let init = client.initialize().await;
    assert!(
        init.pointer("/agentCapabilities/sessionCapabilities/fork")
            .is_none(),
        "{init}"
    );
    let sid = client.open_session(&cwd).await;
    let err = client
        .request("session/fork", fork_params(&sid, &cwd))
        .await
        .expect_err("no fork");
    assert_eq!(err.code, -32601, "{err}");
    let list = client.list(None, None).await.unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
    // A relative cwd is refused before anything happens, as for a load.
    let bad = json!({ "sessionId": sid, "cwd": "work", "mcpServers": [] });
    let err = client
        .request("session/fork", bad)
        .await
        .expect_err("relative cwd");
    assert_eq!(err.code, -32602, "{err}");
}

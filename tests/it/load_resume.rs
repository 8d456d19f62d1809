//! Coming back to a session: `session/load` replays the journal before answering,
//! `session/resume` does not, `_acpd/session/attach` replays what came after a seq. The same
//! for an agent that supports neither load nor resume (acpd emulates them).

use serde_json::{Value, json};

use crate::support::{Client, Daemon, agent_texts, assert_increasing, kind, seq};

/// A session with two turns; returns its id and every update the creating client received.
async fn session_with_history(client: &mut Client, daemon: &Daemon) -> (String, Vec<Value>) {
    let sid = client.new_session(&daemon.work_dir()).await;
    let mut seen = vec![client.next_update().await];
    let (turn, result) = client.prompt(&sid, "echo one; tool").await;
    result.unwrap();
    seen.extend(turn);
    let (turn, result) = client.prompt(&sid, "thought two\necho three").await;
    result.unwrap();
    seen.extend(turn);
    (sid, seen)
}

/// Asserts `replayed` is `seen` (same updates, same seqs) plus the user prompts `prompts`.
fn assert_replay(replayed: &[Value], seen: &[Value], prompts: &[&str]) {
    assert_increasing(replayed);
    let (users, agent): (Vec<&Value>, Vec<&Value>) = replayed
        .iter()
        .partition(|u| kind(u) == "user_message_chunk");
    let user_texts: Vec<&str> = users
        .iter()
        .map(|u| u["update"]["content"]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(user_texts, prompts, "user prompts are journaled");
    assert_eq!(
        agent.len(),
        seen.len(),
        "replay: {replayed:?}\nseen live: {seen:?}"
    );
    for (r, s) in agent.iter().zip(seen) {
        assert_eq!(seq(r), seq(s), "same seq on replay");
        assert_eq!(r["update"], s["update"], "replayed exactly as first sent");
    }
}

#[tokio::test]
async fn load_replays_the_journal_before_responding() {
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await;
    let (sid, seen) = session_with_history(&mut first, &daemon).await;

    let mut second = daemon.client().await;
    let (replayed, result) = second.load(&sid, &daemon.work_dir()).await;
    let result = result.expect("session/load");
    assert!(result.get("sessionId").is_none() || result["sessionId"] == sid.as_str());
    assert!(replayed.iter().all(|u| u["sessionId"] == sid.as_str()));
    assert_replay(
        &replayed,
        &seen,
        &["echo one; tool", "thought two\necho three"],
    );

    // The loaded session takes prompts; seqs go on from the journal.
    let (turn, result) = second.prompt(&sid, "echo after load").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&turn), ["after load"]);
    assert!(seq(&turn[0]) > seq(replayed.last().unwrap()));
}

#[tokio::test]
async fn resume_does_not_replay() {
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await;
    let (sid, seen) = session_with_history(&mut first, &daemon).await;

    let mut second = daemon.client().await;
    let params = json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [] });
    let id = second.send_request("session/resume", params).await;
    let (replayed, result) = second.collect_updates_until_response(&id).await;
    result.expect("session/resume");
    assert!(replayed.is_empty(), "resume must not replay: {replayed:?}");
    let (turn, result) = second.prompt(&sid, "echo resumed").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&turn), ["resumed"]);
    assert!(seq(&turn[0]) > seq(seen.last().unwrap()));
}

#[tokio::test]
async fn attach_replays_what_came_after_a_seq() {
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await;
    let (sid, seen) = session_with_history(&mut first, &daemon).await;
    let last = seq(seen.last().unwrap());
    let after = seq(&seen[2]);

    let mut second = daemon.client().await;
    let id = second
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": after }),
        )
        .await;
    let (replayed, result) = second.collect_updates_until_response(&id).await;
    let result = result.expect("attach");
    assert_eq!(result["lastSeq"], last);
    assert_eq!(result["role"], "controller", "the default role");
    assert!(replayed.iter().all(|u| seq(u) > after), "{replayed:?}");
    let expected: Vec<&Value> = seen.iter().filter(|u| seq(u) > after).collect();
    let got: Vec<&Value> = replayed
        .iter()
        .filter(|u| kind(u) != "user_message_chunk")
        .collect();
    assert_eq!(got.len(), expected.len(), "{replayed:?}");
    for (g, e) in got.iter().zip(expected) {
        assert_eq!((seq(g), &g["update"]), (seq(e), &e["update"]));
    }

    // Caught up: nothing to replay.
    let id = second
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": last }),
        )
        .await;
    let (replayed, result) = second.collect_updates_until_response(&id).await;
    assert_eq!(result.unwrap()["lastSeq"], last);
    assert!(replayed.is_empty(), "{replayed:?}");

    let (turn, _) = second.prompt(&sid, "echo attached").await;
    assert_eq!(agent_texts(&turn), ["attached"]);
}

/// `?agent=noload` runs the scripted agent with `--no-load --no-resume`: acpd still offers
/// load and resume, from its journal.
#[tokio::test]
async fn load_and_resume_work_for_an_agent_without_them() {
    let daemon = Daemon::start().await;
    let url = format!("{}?agent=noload", daemon.ws_url());
    let mut first = Client::connect_ws(&url).await.unwrap();
    let init = first.initialize().await;
    assert_eq!(init["agentCapabilities"]["loadSession"], true);
    assert_eq!(
        init["agentCapabilities"]["sessionCapabilities"]["resume"],
        json!({})
    );
    let (sid, seen) = session_with_history(&mut first, &daemon).await;

    let mut second = Client::connect_ws(&url).await.unwrap();
    second.initialize().await;
    let (replayed, result) = second.load(&sid, &daemon.work_dir()).await;
    result.expect("emulated session/load");
    assert_replay(
        &replayed,
        &seen,
        &["echo one; tool", "thought two\necho three"],
    );
    let (turn, result) = second.prompt(&sid, "echo still here").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&turn), ["still here"]);

    let mut third = Client::connect_ws(&url).await.unwrap();
    third.initialize().await;
    let params = json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [] });
    let id = third.send_request("session/resume", params).await;
    let (replayed, result) = third.collect_updates_until_response(&id).await;
    result.expect("emulated session/resume");
    assert!(replayed.is_empty(), "{replayed:?}");
    let (turn, _) = third.prompt(&sid, "echo resumed").await;
    assert_eq!(agent_texts(&turn), ["resumed"]);
}

#[tokio::test]
async fn load_on_the_connection_that_prompted_replays_its_prompts_too() {
    // The prompter's own prompt is not echoed to it live; a later load must still show it.
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let (sid, seen) = session_with_history(&mut client, &daemon).await;
    let (replayed, result) = client.load(&sid, &daemon.work_dir()).await;
    result.expect("load");
    assert_replay(
        &replayed,
        &seen,
        &["echo one; tool", "thought two\necho three"],
    );
}

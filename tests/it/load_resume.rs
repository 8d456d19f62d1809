//! Coming back to a session: `session/load` replays the journal before answering, as the
//! agent's own load would (one entry per message, then the session's state once),
//! `session/resume` does not, `_acpd/session/attach` replays every seq that came after a seq.
//! The same for an agent that supports neither load nor resume (acpd emulates them), and for
//! many sessions loaded at once after a restart.

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

/// The `sessionUpdate` kinds that state the session's state: a load replays them after the
/// history, the latest of each once, in this order.
const STATE: [&str; 3] = [
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
];

fn is_state(u: &Value) -> bool {
    STATE.contains(&kind(u))
}

/// A load's replay: the history, then the state updates that end it (each kind once, in
/// `STATE` order, none of them in the history).
fn split_state(replayed: &[Value]) -> (&[Value], &[Value]) {
    let n = replayed.iter().rev().take_while(|u| is_state(u)).count();
    let (history, state) = replayed.split_at(replayed.len() - n);
    assert!(
        !history.iter().any(is_state),
        "the state comes after the history, not in it: {replayed:?}"
    );
    let kinds: Vec<&str> = state.iter().map(kind).collect();
    let mut expected: Vec<&str> = STATE.to_vec();
    expected.retain(|k| kinds.contains(k));
    assert_eq!(kinds, expected, "each state kind once, in order");
    (history, state)
}

/// The latest update of each `STATE` kind among `seen`, in `STATE` order.
fn latest_state(seen: &[Value]) -> Vec<&Value> {
    STATE
        .iter()
        .filter_map(|k| seen.iter().rev().find(|u| kind(u) == *k))
        .collect()
}

/// Asserts `replayed` is `seen` (same updates, same seqs) plus the user prompts `prompts`, as
/// a load replays it: the history in seq order, then the latest state updates once.
fn assert_replay(replayed: &[Value], seen: &[Value], prompts: &[&str]) {
    let (history, state) = split_state(replayed);
    assert_increasing(history);
    let (users, agent): (Vec<&Value>, Vec<&Value>) = history
        .iter()
        .partition(|u| kind(u) == "user_message_chunk");
    let user_texts: Vec<&str> = users
        .iter()
        .map(|u| u["update"]["content"]["text"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(user_texts, prompts, "user prompts are journaled");
    let seen_history: Vec<&Value> = seen.iter().filter(|u| !is_state(u)).collect();
    assert_eq!(
        agent.len(),
        seen_history.len(),
        "replay: {replayed:?}\nseen live: {seen:?}"
    );
    let seen_state = latest_state(seen);
    assert_eq!(state.len(), seen_state.len(), "{state:?}");
    let pairs = agent.iter().copied().zip(seen_history);
    for (r, s) in pairs.chain(state.iter().zip(seen_state)) {
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

/// Updates a client would see as runs merged per message: consecutive text chunks of one kind
/// (and message id) count once, as journal compaction forms them.
fn messages(updates: &[&Value]) -> usize {
    let mergeable = |u: &Value| {
        matches!(
            kind(u),
            "agent_message_chunk" | "agent_thought_chunk" | "user_message_chunk"
        ) && u["update"]["content"]["type"] == "text"
    };
    let same = |a: &Value, b: &Value| {
        mergeable(a)
            && mergeable(b)
            && kind(a) == kind(b)
            && a["update"]["messageId"] == b["update"]["messageId"]
    };
    let mut n = 0;
    for (i, u) in updates.iter().enumerate() {
        if i == 0 || !same(updates[i - 1], u) {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn load_replays_the_compacted_history_then_the_state_once_and_attach_every_seq() {
    let daemon = Daemon::start().await;
    let mut first = daemon.client().await;
    let cwd = daemon.work_dir();
    let sid = first.open_session(&cwd).await;
    let prompts = [
        "stream 200 8\ntool\necho done",
        "thought hm\necho a\necho b",
    ];
    let mut seen = vec![];
    let (turn, result) = first.prompt(&sid, prompts[0]).await;
    assert_eq!(result.expect("first turn")["stopReason"], "end_turn");
    seen.extend(turn);
    let mode = json!({ "sessionId": sid, "modeId": "plan" });
    first
        .request("session/set_mode", mode)
        .await
        .expect("set mode");
    let (turn, result) = first.prompt(&sid, prompts[1]).await;
    assert_eq!(result.expect("second turn")["stopReason"], "end_turn");
    seen.extend(turn);

    let mut second = daemon.client().await;
    let (replayed, result) = second.load(&sid, &cwd).await;
    result.expect("session/load");
    let (history, state) = split_state(&replayed);
    assert_increasing(history);
    // The journal compacted: the prompts and the creator's updates, merged per message.
    let live: Vec<&Value> = seen.iter().filter(|u| !is_state(u)).collect();
    let compacted = messages(&live) + prompts.len();
    assert!(
        history.len() <= compacted,
        "{} replayed, the compacted history is {compacted}: {history:?}",
        history.len()
    );
    assert!(history.len() < 20, "200 chunks are one message");
    let text = |us: &[&Value]| -> String {
        us.iter()
            .filter(|u| kind(u) == "agent_message_chunk")
            .filter_map(|u| u["update"]["content"]["text"].as_str())
            .collect()
    };
    assert_eq!(
        text(&history.iter().collect::<Vec<_>>()),
        text(&live),
        "the same words"
    );
    // The state once, after it: the commands, and the mode as set.
    let kinds: Vec<&str> = state.iter().map(kind).collect();
    assert_eq!(kinds, ["available_commands_update", "current_mode_update"]);
    assert_eq!(state[1]["update"]["currentModeId"], "plan");

    // `_acpd/session/attach` catches up exactly: every seq, one by one.
    let mut third = daemon.client().await;
    let id = third
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": 0 }),
        )
        .await;
    let (all, result) = third.collect_updates_until_response(&id).await;
    let last = result.expect("attach")["lastSeq"]
        .as_i64()
        .expect("lastSeq");
    let seqs: Vec<i64> = all.iter().map(seq).collect();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "every seq once");
    assert_eq!(agent_texts(&all).len(), 200 + 3, "every chunk on its own");
}

/// A resume that reaches a session while its `session/close` is ending it (sent right behind
/// the close, or by another connection as the actor winds down) opens the session again: it
/// is answered, never dropped nor refused as "closing", and the session takes prompts.
#[tokio::test]
async fn a_resume_racing_a_close_opens_the_session_again() {
    let daemon = Daemon::start().await;
    let mut owner = daemon.client().await;
    let mut other = daemon.client().await;
    let cwd = daemon.work_dir();
    let sid = owner.open_session(&cwd).await;
    let params = json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] });
    for round in 0..40u64 {
        let (_, result) = owner.prompt(&sid, &format!("echo round {round}")).await;
        result.unwrap();
        let close = owner
            .send_request("session/close", json!({ "sessionId": sid }))
            .await;
        // Sweep the window: right behind the close, then later into the actor's end.
        tokio::time::sleep(std::time::Duration::from_micros(round * 150)).await;
        let resumer = if round % 2 == 0 {
            &mut owner
        } else {
            &mut other
        };
        let resume = resumer.send_request("session/resume", params.clone()).await;
        let resumed = resumer.wait_response(&resume).await;
        assert!(
            resumed.is_ok(),
            "round {round}: session/resume: {resumed:?}"
        );
        owner.wait_response(&close).await.expect("session/close");
        // Whoever resumed, the owner prompts next (attaching again if it was closed for it).
        let (updates, result) = owner.prompt(&sid, &format!("echo after {round}")).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn", "round {round}");
        assert!(
            agent_texts(&updates).contains(&format!("after {round}")),
            "round {round}: {updates:?}"
        );
    }
}

/// After a restart every session's agent side is re-created (`session/resume` to the agent, in
/// band). Loaded all at once, the sessions' registrations with the agent's router and the
/// agent's answers race each other in the router; every load must still be answered, replay
/// its session, and leave it taking prompts. (An answer the router took before its session's
/// registration used to be dropped, and that `session/load` never answered.)
#[tokio::test]
async fn sessions_loaded_all_at_once_after_a_restart_each_restore_and_take_a_prompt() {
    const N: usize = 40;
    let mut daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    let mut client = daemon.client().await;
    let mut sids = Vec::new();
    for i in 0..N {
        let sid = client.new_session(&cwd).await;
        let (_, result) = client.prompt(&sid, &format!("echo before {i}")).await;
        result.expect("prompt before the restart");
        sids.push(sid);
    }
    daemon.restart().await;
    drop(client);

    let mut client = daemon.client().await;
    let mut loads = Vec::new();
    for sid in &sids {
        let params = json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] });
        loads.push(client.send_request("session/load", params).await);
    }
    for (i, id) in loads.iter().enumerate() {
        let result = client.wait_response(id).await;
        assert!(result.is_ok(), "session {i}: session/load: {result:?}");
    }
    let replayed = agent_texts(&client.take_buffered_updates());
    for i in 0..N {
        let text = format!("before {i}");
        assert!(
            replayed.contains(&text),
            "session {i}'s load did not replay its turn"
        );
    }
    let mut prompts = Vec::new();
    for (i, sid) in sids.iter().enumerate() {
        prompts.push(client.send_prompt(sid, &format!("echo after {i}")).await);
    }
    for (i, id) in prompts.iter().enumerate() {
        let result = client
            .wait_response(id)
            .await
            .expect("prompt after the restart");
        assert_eq!(result["stopReason"], "end_turn", "session {i}");
    }
}

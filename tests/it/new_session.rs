//! `session/new` through acpd: acpd's own ids, early agent updates held until after the
//! response, the session live as soon as it is answered and durable before anything of it
//! is, and the session's modes and config options relayed both ways.

use serde_json::json;

use crate::support::{Client, Daemon, agent_texts, kind, seq};

#[tokio::test]
async fn session_id_is_acpds_own_and_setup_is_relayed() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let result = client.new_session_result(&daemon.work_dir()).await;
    let sid = result["sessionId"].as_str().expect("sessionId");
    assert!(
        !sid.starts_with("sa-"),
        "acpd must not hand out the agent's session id: {sid}"
    );
    assert_eq!(result["modes"]["currentModeId"], "default");
    assert_eq!(
        result["modes"]["availableModes"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(result["configOptions"][0]["id"], "verbosity");
    assert_eq!(result["configOptions"][0]["currentValue"], "low");
    let other = client.new_session(&daemon.work_dir()).await;
    assert_ne!(sid, other);
}

/// The scripted agent sends `available_commands_update` before its `session/new` response;
/// acpd must deliver it after the response (Zed drops updates of sessions it does not know).
#[tokio::test]
async fn early_agent_updates_are_held_until_after_the_response() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let id = client
        .send_request(
            "session/new",
            json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
        )
        .await;
    let result = client.wait_response(&id).await.expect("session/new");
    let sid = result["sessionId"].as_str().unwrap();
    // Everything that arrived before the response is still buffered.
    let early: Vec<_> = client.take_buffered_updates();
    assert!(
        early.is_empty(),
        "updates arrived before the session/new response: {early:?}"
    );
    let update = client.next_update().await;
    assert_eq!(update["sessionId"], sid);
    assert_eq!(
        update["update"],
        json!({
            "sessionUpdate": "available_commands_update",
            "availableCommands": [{ "name": "echo", "description": "Echo text" }],
        })
    );
    seq(&update);
}

/// The actor `session/new` started is the session's one actor from the moment it is
/// answered: another connection attaching right after the answer joins it (two clients
/// attached) instead of opening the session a second time from its row.
#[tokio::test]
async fn a_new_session_is_live_for_other_connections_once_answered() {
    let daemon = Daemon::start().await;
    let mut creator = daemon.client().await;
    let mut other = daemon.client().await;
    for _ in 0..20 {
        let sid = creator.new_session(&daemon.work_dir()).await;
        let joined = other
            .request(
                "_acpd/session/attach",
                json!({ "sessionId": sid, "afterSeq": 0 }),
            )
            .await
            .expect("attach right after session/new");
        assert_eq!(
            joined["clients"].as_array().map(Vec::len),
            Some(2),
            "the attach found another actor than the creator's: {joined}"
        );
    }
}

/// `session/new` answers before its row commits: the row is queued to the journal writer
/// ahead of everything else of the session. Killed (SIGKILL) right after a burst of answers,
/// each id either loads and is listed, or is cleanly unknown (-32002) and not listed: never
/// half there. Killed right after a prompt's answer, the session always loads with its turn:
/// the answer vouches for the prompt's entry, which commits after the row.
#[tokio::test]
async fn a_kill_right_after_session_new_leaves_each_id_whole_or_unknown() {
    const N: usize = 30;
    let mut daemon = Daemon::start().await;
    let work = daemon.work_dir();
    let mut client = daemon.client().await;
    let new = json!({ "cwd": work, "mcpServers": [] });
    let mut ids = Vec::new();
    for _ in 0..N {
        ids.push(client.send_request("session/new", new.clone()).await);
    }
    let mut sids = Vec::new();
    for id in &ids {
        let result = client.wait_response(id).await.expect("session/new");
        sids.push(result["sessionId"].as_str().expect("sessionId").to_owned());
    }
    daemon.restart().await;
    drop(client);

    let mut client = daemon.client().await;
    let listed = list_all(&mut client, &work).await;
    let mut kept = Vec::new();
    for sid in &sids {
        match client.load(sid, &work).await.1 {
            Ok(_) => {
                assert!(listed.contains(sid), "{sid} loads but is not listed");
                kept.push(sid.clone());
            }
            Err(e) => {
                assert_eq!(e.code, -32002, "{sid} is neither whole nor unknown: {e}");
                assert!(!listed.contains(sid), "{sid} is listed but does not load");
            }
        }
    }
    assert_eq!(
        listed.len(),
        kept.len(),
        "listed: {listed:?}, kept: {kept:?}"
    );
    eprintln!(
        "{} of {N} sessions answered right before the kill were kept",
        kept.len()
    );
    if let Some(sid) = kept.last() {
        let (turn, result) = client.prompt(sid, "echo after the kill").await;
        assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
        assert_eq!(agent_texts(&turn), ["after the kill"]);
    }

    // A prompt right behind its session/new; the kill right behind the prompt's answer.
    let sid = client.new_session(&work).await;
    let (_, result) = client.prompt(&sid, "echo answered before the kill").await;
    result.expect("prompt");
    daemon.restart().await;
    drop(client);
    let mut client = daemon.client().await;
    let (replayed, result) = client.load(&sid, &work).await;
    result.expect("a session whose prompt was answered loads after a kill");
    assert_eq!(agent_texts(&replayed), ["answered before the kill"]);
}

/// Every page of `session/list` in `cwd`: the ids.
async fn list_all(client: &mut Client, cwd: &std::path::Path) -> Vec<String> {
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list(Some(cwd), cursor.as_deref())
            .await
            .expect("session/list after the kill");
        for s in page["sessions"].as_array().expect("sessions") {
            listed.push(s["sessionId"].as_str().expect("sessionId").to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return listed,
        }
    }
}

#[tokio::test]
async fn mode_and_config_changes_are_relayed() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;

    let result = client
        .request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "plan" }),
        )
        .await;
    assert_eq!(result.unwrap(), json!({}));
    let update = client.next_update().await;
    assert_eq!(update["sessionId"], sid);
    assert_eq!(
        update["update"],
        json!({ "sessionUpdate": "current_mode_update", "currentModeId": "plan" })
    );
    let mode_seq = seq(&update);

    let params = json!({ "sessionId": sid, "configId": "verbosity", "value": "high" });
    let result = client
        .request("session/set_config_option", params)
        .await
        .unwrap();
    assert_eq!(result["configOptions"][0]["currentValue"], "high");
    let update = client.next_update().await;
    assert_eq!(kind(&update), "config_option_update");
    assert_eq!(update["update"]["configOptions"], result["configOptions"]);
    assert!(seq(&update) > mode_seq);

    // The agent's own refusal comes back as an error.
    let bad = json!({ "sessionId": sid, "modeId": "no-such-mode" });
    assert!(client.request("session/set_mode", bad).await.is_err());
}

/// A session just made counts against its creator's budgets at once: the actor takes the
/// owner's name from the creating connection (no read of the store), so a named principal's
/// own budget is the one `quota/read` reports, not the default's.
#[tokio::test]
async fn a_new_session_is_metered_by_its_creators_budgets() {
    use crate::support::DaemonOptions;
    use crate::support::security_support as sec;
    let dir = tempfile::tempdir().expect("config dir");
    let file = dir.path().join("acpd.toml");
    let config = "[budgets.default]\nsession = { tokens = 5000, action = \"warn\" }\n\
                  [budgets.principals.alice]\nsession = { tokens = 100, action = \"stop\" }\n";
    std::fs::write(&file, config).expect("config file");
    let opts = DaemonOptions::default()
        .auth()
        .arg("--config", file.display());
    let daemon = Daemon::start_with(opts).await;
    let alice = sec::token_create(&daemon, "alice").await;
    let (h, v) = sec::bearer(&alice);
    let mut c = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    let sid = c.new_session(&daemon.work_dir()).await;
    let snap = c
        .request("quota/read", json!({ "sessionId": sid }))
        .await
        .expect("quota/read");
    let ids: Vec<&str> = snap["pools"][0]["meters"]
        .as_array()
        .expect("meters")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["principals.alice.session.tokens"], "{snap}");
    // The budget stops alice's second turn once the first used it up.
    c.prompt(&sid, "usage 100 50").await.1.expect("first turn");
    let e = c
        .prompt(&sid, "echo over")
        .await
        .1
        .expect_err("over alice's budget");
    assert_eq!(e.code, -32013, "{e}");
    let data = e.data.expect("data");
    assert_eq!(data["budget"], "principals.alice.session.tokens");
}

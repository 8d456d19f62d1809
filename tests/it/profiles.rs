//! Profiles scope sessions: on a connection of one profile (`?agent=NAME`, or the default),
//! `session/list`, load, resume, attach, prompt and close see only that profile's sessions; a
//! session of another profile is -32002 like an unknown one. `_meta.acpd.allProfiles: true`
//! on `session/list` (and on load/resume) asks for every profile.

use serde_json::{Value, json};

use crate::support::{Client, Daemon, agent_texts};

async fn client_of(daemon: &Daemon, profile: &str) -> Client {
    crate::support::client_of(daemon, profile).await.0
}

fn ids(list: &Value) -> Vec<&str> {
    list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_connection_sees_only_its_profiles_sessions() {
    let daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    // The default profile is `scripted`.
    let mut main = daemon.client().await;
    let ours = main.open_session(&cwd).await;
    let mut other = client_of(&daemon, "noload").await;
    let theirs = other.open_session(&cwd).await;

    assert_eq!(ids(&main.list(None, None).await.unwrap()), [ours.as_str()]);
    assert_eq!(
        ids(&other.list(None, None).await.unwrap()),
        [theirs.as_str()]
    );

    let calls = [
        (
            "session/load",
            json!({ "sessionId": ours, "cwd": cwd, "mcpServers": [] }),
        ),
        (
            "session/resume",
            json!({ "sessionId": ours, "cwd": cwd, "mcpServers": [] }),
        ),
        (
            "_acpd/session/attach",
            json!({ "sessionId": ours, "afterSeq": 0 }),
        ),
        (
            "session/prompt",
            json!({ "sessionId": ours, "prompt": [{ "type": "text", "text": "echo x" }] }),
        ),
        (
            "session/set_mode",
            json!({ "sessionId": ours, "modeId": "plan" }),
        ),
        ("session/close", json!({ "sessionId": ours })),
    ];
    for (method, params) in calls {
        let err = other.request(method, params).await.expect_err(method);
        assert_eq!(err.code, -32002, "{method}: {err}");
    }
    // Deleting it there is deleting an unknown session: nothing happens to it.
    let deleted = other
        .request("session/delete", json!({ "sessionId": ours }))
        .await;
    assert_eq!(deleted.unwrap(), json!({}));

    // Untouched on its own profile.
    let (updates, result) = main.prompt(&ours, "echo still here").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["still here"]);
    assert_eq!(ids(&main.list(None, None).await.unwrap()), [ours.as_str()]);
}

#[tokio::test]
async fn all_profiles_lists_and_loads_every_profile() {
    let daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    let mut main = daemon.client().await;
    let ours = main.open_session(&cwd).await;
    let (_, r) = main.prompt(&ours, "echo from scripted").await;
    r.unwrap();
    let mut other = client_of(&daemon, "noload").await;
    let theirs = other.open_session(&cwd).await;

    let all = other
        .request(
            "session/list",
            json!({ "_meta": { "acpd": { "allProfiles": true } } }),
        )
        .await
        .unwrap();
    assert_eq!(ids(&all), [theirs.as_str(), ours.as_str()]);
    let agent_of = |id: &str| {
        all["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sessionId"] == id)
            .unwrap()["_meta"]["acpd"]["agent"]
            .clone()
    };
    assert_eq!(agent_of(&ours), "scripted");
    assert_eq!(agent_of(&theirs), "noload");

    let params = json!({
        "sessionId": ours, "cwd": cwd, "mcpServers": [],
        "_meta": { "acpd": { "allProfiles": true } },
    });
    let id = other.send_request("session/load", params).await;
    let (replayed, result) = other.collect_updates_until_response(&id).await;
    result.expect("an explicit all-profiles load");
    assert_eq!(agent_texts(&replayed), ["from scripted"]);
}

/// The same from the store (no live actor): after a restart, a session is opened from its row
/// and its profile checked there.
#[tokio::test]
async fn scoping_holds_for_sessions_read_back_from_the_store() {
    let mut daemon = Daemon::start().await;
    let cwd = daemon.work_dir();
    let mut main = daemon.client().await;
    let ours = main.open_session(&cwd).await;
    let (_, r) = main.prompt(&ours, "echo before").await;
    r.unwrap();
    drop(main);
    daemon.restart().await;

    let mut other = client_of(&daemon, "noload").await;
    let load = json!({ "sessionId": ours, "cwd": cwd, "mcpServers": [] });
    let err = other
        .request("session/load", load.clone())
        .await
        .expect_err("another profile's session");
    assert_eq!(err.code, -32002, "{err}");
    let mut main = daemon.client().await;
    let (replayed, r) = main.load(&ours, &cwd).await;
    r.expect("its own profile loads it");
    assert_eq!(agent_texts(&replayed), ["before"]);
}

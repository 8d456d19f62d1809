//! A grant is not ownership: a principal granted a role on another's session (controller or
//! observer) steers it as far as its role allows, but only the owner deletes it, forks it or
//! changes its grants (-32010 for a grantee), and a grantee's `session/close` detaches only
//! its own client; the owner's session, turn and history go on.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::security_support::{self as sec, bearer};
use crate::support::{Client, Daemon, DaemonOptions, agent_texts, scripted_agent_bin};

/// A daemon with tokens and an agent that forks (so `session/fork` is offered at all).
async fn daemon() -> Daemon {
    let agent = format!("forking={} --fork", scripted_agent_bin());
    Daemon::start_with(DaemonOptions::default().auth().arg("--agent", agent)).await
}

/// A client of `secret`'s principal on the forking agent, initialized.
async fn client_as(daemon: &Daemon, secret: &str) -> Client {
    let (h, v) = bearer(secret);
    let url = format!("{}?agent=forking", daemon.ws_url());
    sec::client(&url, &[(h, &v)], None).await
}

async fn share(owner: &mut Client, sid: &str, with: &str, role: &str) {
    let r = owner
        .request(
            "_acpd/session/share",
            json!({ "sessionId": sid, "with": with, "role": role }),
        )
        .await
        .expect("the owner shares");
    assert_eq!(r["role"], role, "{r}");
}

/// `method` from `c` is refused with -32010 (a grant is not ownership).
async fn refused(c: &mut Client, method: &str, params: Value) {
    let e = c
        .request(method, params)
        .await
        .expect_err("only the owner may");
    assert_eq!(e.code, -32010, "{method}: {e:?}");
    assert_eq!(e.data.unwrap()["acpd"]["owner"], false, "{method}");
}

fn attach_params(sid: &str, role: &str) -> Value {
    json!({ "sessionId": sid, "afterSeq": 0, "role": role })
}

/// The owner's session loads on a new connection with its whole history and takes a prompt.
async fn owner_still_has(daemon: &Daemon, secret: &str, sid: &str, history: &[&str]) {
    let mut a = client_as(daemon, secret).await;
    let (replayed, r) = a.load(sid, &daemon.work_dir()).await;
    r.expect("the owner's session still loads");
    assert_eq!(agent_texts(&replayed), history);
    let (ups, r) = a.prompt(sid, "echo still here").await;
    r.expect("the owner prompts");
    assert_eq!(agent_texts(&ups), ["still here"]);
}

#[tokio::test]
async fn a_controller_grantee_cannot_delete_the_owners_session() {
    let daemon = daemon().await;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let mut a = client_as(&daemon, &alice).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let (_, r) = a.prompt(&sid, "echo kept").await;
    r.expect("prompt");
    share(&mut a, &sid, "bob", "controller").await;
    let delete = json!({ "sessionId": sid });

    // Not attached (a delete attaches nothing first) ...
    let mut b = client_as(&daemon, &bob).await;
    refused(&mut b, "session/delete", delete.clone()).await;
    // ... and attached as a controller, which steers but does not own.
    let mut b2 = client_as(&daemon, &bob).await;
    let r = b2
        .request("_acpd/session/attach", attach_params(&sid, "controller"))
        .await
        .expect("attach");
    assert_eq!(r["role"], "controller");
    assert_eq!(agent_texts(&b2.take_buffered_updates()), ["kept"]);
    let (ups, r) = b2.prompt(&sid, "echo from bob").await;
    r.expect("a controller grantee prompts");
    assert_eq!(agent_texts(&ups), ["from bob"]);
    refused(&mut b2, "session/delete", delete.clone()).await;

    a.close().await;
    owner_still_has(&daemon, &alice, &sid, &["kept", "from bob"]).await;
    // The owner deletes.
    let mut a = client_as(&daemon, &alice).await;
    a.request("session/delete", delete)
        .await
        .expect("the owner deletes");
    let e = a
        .request("_acpd/session/attach", attach_params(&sid, "controller"))
        .await
        .expect_err("deleted");
    assert_eq!(e.code, -32002, "{e:?}");
}

#[tokio::test]
async fn a_grantee_neither_shares_nor_forks_nor_deletes() {
    let daemon = daemon().await;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let carol = sec::token_create(&daemon, "carol").await;
    let mut a = client_as(&daemon, &alice).await;
    let cwd = daemon.work_dir();
    let sid = a.open_session(&cwd).await;
    let (_, r) = a.prompt(&sid, "echo kept").await;
    r.expect("prompt");
    share(&mut a, &sid, "bob", "controller").await;
    share(&mut a, &sid, "carol", "observer").await;

    let mut b = client_as(&daemon, &bob).await;
    let share_carol = json!({ "sessionId": sid, "with": "carol", "role": "controller" });
    refused(&mut b, "_acpd/session/share", share_carol).await;
    let unshare_carol = json!({ "sessionId": sid, "with": "carol", "revoke": true });
    refused(&mut b, "_acpd/session/share", unshare_carol).await;
    let bob_to_controller = json!({ "sessionId": sid, "with": "bob", "role": "controller" });
    refused(&mut b, "_acpd/session/share", bob_to_controller).await;
    let fork = json!({ "sessionId": sid, "cwd": cwd, "mcpServers": [] });
    refused(&mut b, "session/fork", fork.clone()).await;

    // An observer grantee, attached or not; a refused delete attaches nothing that would
    // let it steer afterwards.
    let mut c = client_as(&daemon, &carol).await;
    refused(&mut c, "session/delete", json!({ "sessionId": sid })).await;
    let e = c
        .request(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo no" }] }),
        )
        .await
        .expect_err("an observer's prompt");
    assert_eq!(e.code, -32010, "{e:?}");
    assert_eq!(
        e.data.as_ref().unwrap()["acpd"]["role"],
        "observer",
        "{e:?}"
    );
    let r = c
        .request("_acpd/session/attach", attach_params(&sid, "observer"))
        .await
        .expect("attach");
    assert_eq!(r["role"], "observer");
    refused(&mut c, "session/delete", json!({ "sessionId": sid })).await;
    refused(&mut c, "session/fork", fork.clone()).await;
    let unshare_bob = json!({ "sessionId": sid, "with": "bob", "revoke": true });
    refused(&mut c, "_acpd/session/share", unshare_bob).await;

    // Nothing changed: bob's grant stands, the owner's list has one session, no fork.
    let r = b
        .request("_acpd/session/attach", attach_params(&sid, "controller"))
        .await
        .expect("bob's grant stands");
    assert_eq!(r["role"], "controller");
    let list = a.list(None, None).await.expect("list");
    let ids: Vec<&Value> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["sessionId"])
        .collect();
    assert_eq!(ids, [&json!(sid)], "{list}");
    // The owner forks.
    a.request("session/fork", fork)
        .await
        .expect("the owner forks");
    a.close().await;
    owner_still_has(&daemon, &alice, &sid, &["kept"]).await;
}

#[tokio::test]
async fn a_grantees_close_detaches_only_its_own_client() {
    let daemon = daemon().await;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let mut a = client_as(&daemon, &alice).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    share(&mut a, &sid, "bob", "controller").await;
    let mut b = client_as(&daemon, &bob).await;
    b.request("_acpd/session/attach", attach_params(&sid, "controller"))
        .await
        .expect("attach");

    // Alice's turn is running when bob closes.
    let turn = a.send_prompt(&sid, "sleep 800; echo finished").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = b
        .request("session/close", json!({ "sessionId": sid }))
        .await
        .expect("a grantee's close");
    assert_eq!(r, json!({}));
    let (ups, r) = a.collect_updates_until_response(&turn).await;
    assert_eq!(
        r.expect("alice's turn")["stopReason"],
        "end_turn",
        "a grantee's close does not end the owner's turn"
    );
    assert_eq!(agent_texts(&ups), ["finished"]);
    let gone = a
        .next_notification_where("bob's client detached", |m| {
            m["method"] == "_acpd/session/presence" && m["params"]["event"] == "detached"
        })
        .await;
    assert_eq!(gone["params"]["client"]["principal"], "bob", "{gone}");
    // Bob may come back: the close did not touch his grant.
    let (ups, r) = b.prompt(&sid, "echo back").await;
    r.expect("bob prompts again");
    assert_eq!(agent_texts(&ups), ["back"]);
}

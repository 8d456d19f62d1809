//! Shared sessions: several clients on one live session. Every update reaches each in seq
//! order; observers read and never steer; a permission goes to every controller and the first
//! valid answer wins; a request whose client drops moves on; prompts from several controllers
//! queue (or are refused); presence tells the others who comes and goes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::security_support::{self as sec, bearer};
use crate::support::{Client, Daemon, DaemonOptions, agent_texts, kind, seq};

/// Attaches `c` to `sid` with `role` after `after`; returns the answer.
async fn attach(c: &mut Client, sid: &str, role: &str, after: i64) -> Value {
    let params = json!({ "sessionId": sid, "afterSeq": after, "role": role });
    let id = c.send_request("_acpd/session/attach", params).await;
    let (_, r) = c.collect_updates_until_response(&id).await;
    r.expect("attach")
}

/// Attaches `c` from the start and waits for the replay (dropped).
async fn join(c: &mut Client, sid: &str, role: &str) -> Value {
    attach(c, sid, role, 0).await
}

/// The next `_acpd/...` notification of `method`.
async fn next_of(c: &mut Client, method: &str) -> Value {
    let what = format!("a {method} notification");
    c.next_notification_where(&what, |m| m["method"] == method)
        .await
}

/// Waits until `c` sees the user message `text` (another client's prompt has started);
/// returns the updates taken meanwhile.
async fn wait_prompt_seen(c: &mut Client, text: &str) -> Vec<Value> {
    let what = format!("the user_message_chunk {text:?}");
    c.collect_updates_until(&what, |ups| {
        ups.iter()
            .any(|u| kind(u) == "user_message_chunk" && u["update"]["content"]["text"] == text)
    })
    .await
}

#[tokio::test]
async fn three_clients_get_one_streaming_turn_identically_and_in_order() {
    let daemon = Daemon::start().await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = daemon.client().await;
    let mut c = daemon.client().await;
    assert_eq!(join(&mut b, &sid, "controller").await["role"], "controller");
    assert_eq!(join(&mut c, &sid, "observer").await["role"], "observer");

    let (mine, r) = a.prompt(&sid, "stream 300 64\necho done").await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    let theirs_b = b.updates_until_text("done").await;
    let theirs_c = c.updates_until_text("done").await;
    assert_eq!(theirs_b, theirs_c, "one serialization, one order");
    let seqs: Vec<i64> = theirs_b.iter().map(seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The prompter is not echoed its own prompt; the rest is the same.
    let others: Vec<&Value> = theirs_b
        .iter()
        .filter(|u| kind(u) != "user_message_chunk")
        .collect();
    let mine: Vec<&Value> = mine.iter().collect();
    assert_eq!(mine, others);
    assert!(agent_texts(&theirs_b).len() > 300);
}

#[tokio::test]
async fn an_observer_sees_everything_and_steers_nothing() {
    let daemon = Daemon::start().await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut o = daemon.client().await;
    join(&mut o, &sid, "observer").await;

    let e = o
        .request(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo no" }] }),
        )
        .await
        .expect_err("an observer's prompt");
    assert_eq!(e.code, -32010, "{e:?}");
    assert!(e.message.contains("observer"), "{e:?}");
    let e = o
        .request(
            "session/set_mode",
            json!({ "sessionId": sid, "modeId": "code" }),
        )
        .await
        .expect_err("an observer's set_mode");
    assert_eq!(e.code, -32010, "{e:?}");
    let e = o
        .request("session/close", json!({ "sessionId": sid }))
        .await
        .expect_err("an observer's close");
    assert_eq!(e.code, -32010, "{e:?}");

    // Its cancel does not end the controller's turn.
    let id = a.send_prompt(&sid, "sleep 300\necho finished").await;
    wait_prompt_seen(&mut o, "sleep 300\necho finished").await;
    o.notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let (ups, r) = a.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["finished"]);
    assert_eq!(
        agent_texts(&o.updates_until_text("finished").await),
        ["finished"]
    );

    // A permission is never asked of it; it is told how it was decided.
    let (ups, r) = a.prompt(&sid, "permission").await;
    r.expect("prompt");
    assert_eq!(agent_texts(&ups), ["permission: selected allow-once"]);
    let resolved = next_of(&mut o, "_acpd/session/request_resolved").await;
    assert_eq!(resolved["params"]["outcome"]["optionId"], "allow-once");
    assert!(o.received_requests.is_empty(), "{:?}", o.received_requests);
}

#[tokio::test]
async fn a_permission_answered_by_the_second_controller_reaches_the_agent_once() {
    let daemon = Daemon::start().await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = daemon.client().await;
    let mut c = daemon.client().await;
    let b_conn = join(&mut b, &sid, "controller").await["clients"]
        .as_array()
        .and_then(|cs| cs.last().cloned())
        .expect("the attach answer lists the clients")["connectionId"]
        .clone();
    join(&mut c, &sid, "controller").await;
    for x in [&mut a, &mut b, &mut c] {
        x.editor.hold("session/request_permission");
    }

    let id = a.send_prompt(&sid, "permission").await;
    let asked_a = a.wait_held_request("session/request_permission").await;
    let asked_b = b.wait_held_request("session/request_permission").await;
    let asked_c = c.wait_held_request("session/request_permission").await;
    assert_eq!(asked_a["params"], asked_b["params"]);
    let choice = json!({ "outcome": { "outcome": "selected", "optionId": "reject-once" } });
    b.respond(&asked_b["id"], Ok(choice)).await;

    for (x, asked) in [(&mut a, &asked_a), (&mut c, &asked_c)] {
        let withdrawn = next_of(x, "$/cancel_request").await;
        assert_eq!(withdrawn["params"]["requestId"], asked["id"]);
        let resolved = next_of(x, "_acpd/session/request_resolved").await;
        let p = &resolved["params"];
        assert_eq!(p["sessionId"], sid.as_str());
        assert_eq!(p["outcome"]["optionId"], "reject-once");
        assert_eq!(p["decidedBy"]["connectionId"], b_conn);
        assert_eq!(p["decidedBy"]["role"], "controller");
        assert_eq!(p["toolCallId"], asked["params"]["toolCall"]["toolCallId"]);
    }
    // A late answer from another copy changes nothing.
    let late = json!({ "outcome": { "outcome": "selected", "optionId": "allow-always" } });
    a.respond(&asked_a["id"], Ok(late)).await;
    let (ups, r) = a.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["permission: selected reject-once"]);
    let (ups, _) = a.prompt(&sid, "echo next").await;
    assert_eq!(agent_texts(&ups), ["next"]);
}

#[tokio::test]
async fn a_controller_that_drops_mid_request_hands_it_to_another() {
    let daemon = Daemon::start().await;
    let input = daemon.work_dir().join("notes.txt");
    std::fs::write(&input, "remember the milk").unwrap();
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = daemon.client().await;
    join(&mut b, &sid, "controller").await;

    // fs goes to the prompter only; it drops with the request unanswered.
    a.editor.hold("fs/read_text_file");
    a.send_prompt(&sid, &format!("read {}", input.display()))
        .await;
    a.wait_held_request("fs/read_text_file").await;
    assert!(b.received_requests.is_empty());
    a.close().await;
    drop(a);

    let ups = b.updates_until_text("read: remember the milk").await;
    assert!(!ups.is_empty());
    assert_eq!(b.received_requests.len(), 1);
    assert_eq!(b.received_requests[0]["method"], "fs/read_text_file");

    // A permission held by two: the one that drops leaves it to the other.
    let mut c = daemon.client().await;
    join(&mut c, &sid, "controller").await;
    c.editor.hold("session/request_permission");
    b.editor.hold("session/request_permission");
    let id = b.send_prompt(&sid, "permission").await;
    c.wait_held_request("session/request_permission").await;
    let asked_b = b.wait_held_request("session/request_permission").await;
    c.close().await;
    drop(c);
    let choice = json!({ "outcome": { "outcome": "selected", "optionId": "allow-once" } });
    b.respond(&asked_b["id"], Ok(choice)).await;
    let (ups, r) = b.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["permission: selected allow-once"]);
}

#[tokio::test]
async fn presence_tells_the_others_who_comes_and_goes() {
    let daemon = Daemon::start().await;
    let mut a = daemon.connect().await;
    let init = a.initialize().await;
    let shared = &init["_meta"]["acpd"]["sharedSessions"];
    assert_eq!(shared["roles"], json!(["controller", "observer"]), "{init}");
    assert_eq!(shared["presence"], true);
    assert_eq!(shared["busyPrompts"], "queue");
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut o = daemon.client().await;
    let r = join(&mut o, &sid, "observer").await;
    assert_eq!(r["clients"].as_array().map(Vec::len), Some(2), "{r}");

    let p = next_of(&mut a, "_acpd/session/presence").await["params"].clone();
    assert_eq!(p["sessionId"], sid.as_str());
    assert_eq!(p["event"], "attached");
    assert_eq!(p["client"]["role"], "observer");
    assert_eq!(p["client"]["name"], "acpd-tests");
    assert!(p["client"]["principal"].is_string(), "{p}");
    assert_eq!(p["clients"].as_array().map(Vec::len), Some(2), "{p}");
    let o_conn = p["client"]["connectionId"].clone();

    o.close().await;
    drop(o);
    let p = next_of(&mut a, "_acpd/session/presence").await["params"].clone();
    assert_eq!(p["event"], "detached");
    assert_eq!(p["client"]["connectionId"], o_conn);
    assert_eq!(p["clients"].as_array().map(Vec::len), Some(1), "{p}");
}

#[tokio::test]
async fn a_plain_client_loads_as_a_second_controller_and_prompts_queue() {
    let daemon = Daemon::start().await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = daemon.client().await;
    let (_, r) = b.load(&sid, &daemon.work_dir()).await;
    r.expect("session/load");

    let b_id = b.send_prompt(&sid, "sleep 200\necho from b").await;
    // Sent while b's turn runs: it waits for it.
    let mut seen = wait_prompt_seen(&mut a, "sleep 200\necho from b").await;
    let a_id = a.send_prompt(&sid, "echo from a").await;
    let (ups, r) = b.collect_updates_until_response(&b_id).await;
    assert_eq!(r.expect("b's prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["from b"]);
    let (ups, r) = a.collect_updates_until_response(&a_id).await;
    assert_eq!(r.expect("a's prompt")["stopReason"], "end_turn");
    seen.extend(ups);
    let ups = seen;
    // a saw b's turn first, then its own.
    assert_eq!(agent_texts(&ups), ["from b", "from a"]);
    let texts = agent_texts(&b.updates_until_text("from a").await);
    assert_eq!(texts, ["from a"]);
}

#[tokio::test]
async fn any_controller_cancels_and_a_busy_prompt_can_be_refused() {
    let opts = DaemonOptions::default().arg("--busy-prompts", "refuse");
    let daemon = Daemon::start_with(opts).await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = daemon.client().await;
    join(&mut b, &sid, "controller").await;

    let b_id = b.send_prompt(&sid, "wait_for_cancel").await;
    wait_prompt_seen(&mut a, "wait_for_cancel").await;
    let e = a
        .request(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo no" }] }),
        )
        .await
        .expect_err("busy");
    assert_eq!(e.code, -32011, "{e:?}");
    a.notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let (_, r) = b.collect_updates_until_response(&b_id).await;
    assert_eq!(r.expect("b's prompt")["stopReason"], "cancelled");
}

/// A client of `secret`'s principal, initialized.
async fn client_as(daemon: &Daemon, secret: &str) -> Client {
    let (h, v) = bearer(secret);
    sec::client(&daemon.ws_url(), &[(h, &v)], None).await
}

async fn share_cli(daemon: &Daemon, args: &[&str]) -> sec::Run {
    let data = daemon.dir().join("data").display().to_string();
    let store = daemon.store_url();
    let mut all = vec!["share"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--data-dir", &data, "--store", &store]);
    sec::acpd(&all).await
}

#[tokio::test]
async fn sharing_and_revoking_across_two_principals() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let mut a = client_as(&daemon, &alice).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let attach_params = json!({ "sessionId": sid, "afterSeq": 0, "role": "controller" });

    // Not shared: bob sees no such session.
    let mut b = client_as(&daemon, &bob).await;
    let e = b
        .request("_acpd/session/attach", attach_params.clone())
        .await
        .expect_err("not shared");
    assert_eq!(e.code, -32002, "{e:?}");
    // Only the owner shares.
    let e = b
        .request(
            "_acpd/session/share",
            json!({ "sessionId": sid, "with": "bob", "role": "controller" }),
        )
        .await
        .expect_err("bob does not own it");
    assert_eq!(e.code, -32002, "{e:?}");

    let r = a
        .request(
            "_acpd/session/share",
            json!({ "sessionId": sid, "with": "bob", "role": "observer" }),
        )
        .await
        .expect("share");
    assert_eq!(r["role"], "observer");
    // Bob asks to control; the grant makes him an observer.
    let mut b = client_as(&daemon, &bob).await;
    let r = attach(&mut b, &sid, "controller", 0).await;
    assert_eq!(r["role"], "observer");
    let p = next_of(&mut a, "_acpd/session/presence").await["params"].clone();
    assert_eq!(p["client"]["principal"], "bob");
    assert_eq!(p["client"]["role"], "observer");
    let e = b
        .request(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo no" }] }),
        )
        .await
        .expect_err("an observer's prompt");
    assert_eq!(e.code, -32010);
    let (_, r) = a.prompt(&sid, "echo for bob").await;
    r.expect("prompt");
    assert_eq!(
        agent_texts(&b.updates_until_text("for bob").await),
        ["for bob"]
    );

    // The administrator makes bob a controller; a new connection of his steers.
    let run = share_cli(&daemon, &[&sid, "--with", "bob", "--role", "controller"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let mut b2 = client_as(&daemon, &bob).await;
    assert_eq!(
        attach(&mut b2, &sid, "controller", 0).await["role"],
        "controller"
    );
    let (ups, r) = b2.prompt(&sid, "echo from bob").await;
    r.expect("bob's prompt");
    assert_eq!(agent_texts(&ups), ["from bob"]);

    // Revoked in another process: both of bob's clients are cut off within a second.
    let run = share_cli(&daemon, &[&sid, "--with", "bob", "--revoke"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for x in [&mut b, &mut b2] {
        tokio::time::timeout(Duration::from_secs(1), x.wait_closed())
            .await
            .expect("the revoked client is cut off within a second");
    }
    let mut b3 = client_as(&daemon, &bob).await;
    let e = b3
        .request("_acpd/session/attach", attach_params)
        .await
        .expect_err("revoked");
    assert_eq!(e.code, -32002, "{e:?}");
    // Alice goes on (she saw bob's turn).
    let ups = a.updates_until_text("from bob").await;
    assert_eq!(agent_texts(&ups), ["from bob"]);
    let (ups, _) = a.prompt(&sid, "echo still mine").await;
    assert_eq!(agent_texts(&ups), ["still mine"]);
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(log.contains("session shared"), "audit line");
    assert!(log.contains("grant revoked: client cut off"), "audit line");
}

#[tokio::test]
async fn fs_goes_to_a_controller_that_declared_it_when_the_prompter_did_not() {
    let daemon = Daemon::start().await;
    let input = daemon.work_dir().join("notes.txt");
    std::fs::write(&input, "from the laptop").unwrap();
    let mut laptop = daemon.client().await;
    let sid = laptop.open_session(&daemon.work_dir()).await;
    // A phone: no filesystem, no terminal.
    let mut phone = daemon.connect().await;
    let init = json!({
        "protocolVersion": 1,
        "clientCapabilities": {},
        "clientInfo": { "name": "phone", "version": "0" },
    });
    phone.request("initialize", init).await.expect("initialize");
    join(&mut phone, &sid, "controller").await;

    let p = next_of(&mut laptop, "_acpd/session/presence").await["params"].clone();
    assert_eq!(p["client"]["name"], "phone");
    // The laptop answers the read while the phone waits for its turn.
    let script = format!("read {}", input.display());
    let ((ups, r), _) = tokio::join!(
        phone.prompt(&sid, &script),
        laptop.updates_until_text("read: from the laptop")
    );
    assert_eq!(r.expect("the phone's prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["read: from the laptop"]);
    assert!(
        phone.received_requests.is_empty(),
        "{:?}",
        phone.received_requests
    );
    assert_eq!(laptop.received_requests.len(), 1);
    assert_eq!(laptop.received_requests[0]["method"], "fs/read_text_file");
}

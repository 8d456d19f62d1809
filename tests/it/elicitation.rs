//! Elicitation in shared sessions, and per-client capabilities: an agent's
//! `elicitation/create` goes to the controllers that declared its mode (form or URL), the
//! first valid answer wins and the other copies are withdrawn; an observer or a client
//! without the mode never gets it; nobody able to answer means an answer at once;
//! `elicitation/complete` reaches the clients that declared URL mode; a gated update kind
//! never reaches a client that did not declare it, live or in replay. The built-in agent
//! asks through its `ask_user` tool.

use serde_json::{Value, json};

use crate::builtin_support::model::{text, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};
use crate::support::{Client, Daemon, agent_texts, kind};

const CREATE: &str = "elicitation/create";
const COMPLETE: &str = "elicitation/complete";

/// A client with a full editor's capabilities plus `extra` (merged in at the top level).
async fn client_with(daemon: &Daemon, name: &str, extra: Value) -> Client {
    let mut caps = json!({
        "fs": { "readTextFile": true, "writeTextFile": true },
        "terminal": true,
    });
    if let (Some(c), Value::Object(e)) = (caps.as_object_mut(), extra) {
        c.extend(e);
    }
    let mut c = daemon.connect().await;
    let init = json!({
        "protocolVersion": 1,
        "clientCapabilities": caps,
        "clientInfo": { "name": name, "version": "0" },
    });
    c.request("initialize", init).await.expect("initialize");
    c
}

/// Attaches `c` to `sid` from the start with `role`; returns its connection id.
async fn join(c: &mut Client, sid: &str, role: &str) -> Value {
    let params = json!({ "sessionId": sid, "afterSeq": 0, "role": role });
    let id = c.send_request("_acpd/session/attach", params).await;
    let (_, r) = c.collect_updates_until_response(&id).await;
    let r = r.expect("attach");
    assert_eq!(r["role"], role, "{r}");
    r["clients"]
        .as_array()
        .and_then(|cs| cs.last())
        .expect("the attach answer lists the clients")["connectionId"]
        .clone()
}

async fn next_of(c: &mut Client, method: &str) -> Value {
    let what = format!("a {method} notification");
    c.next_notification_where(&what, |m| m["method"] == method)
        .await
}

fn kinds(ups: &[Value]) -> Vec<String> {
    ups.iter().map(|u| kind(u).to_owned()).collect()
}

#[tokio::test]
async fn form_and_url_questions_go_to_the_controllers_that_declared_the_mode_and_the_first_answer_wins()
 {
    let daemon = Daemon::start().await;
    let both = json!({ "elicitation": { "form": {}, "url": {} } });
    let mut a = client_with(&daemon, "laptop", both.clone()).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    // A tablet shows forms but opens no URLs; an observer could do both.
    let form_only = json!({ "elicitation": { "form": {}, "url": null } });
    let mut b = client_with(&daemon, "tablet", form_only).await;
    let b_conn = join(&mut b, &sid, "controller").await;
    let mut o = client_with(&daemon, "watcher", both).await;
    join(&mut o, &sid, "observer").await;
    for x in [&mut a, &mut b, &mut o] {
        x.editor.hold(CREATE);
    }

    let script = "elicit_form What is your name?\n\
                  elicit_url login-1 https://example.test/login\n\
                  elicit_complete login-1";
    let id = a.send_prompt(&sid, script).await;
    let asked_a = a.wait_held_request(CREATE).await;
    let asked_b = b.wait_held_request(CREATE).await;
    assert_eq!(asked_a["params"], asked_b["params"]);
    assert_eq!(asked_a["params"]["mode"], "form");
    assert_eq!(asked_a["params"]["sessionId"], sid.as_str());
    assert_eq!(asked_a["params"]["message"], "What is your name?");
    let answer = json!({ "action": "accept", "content": { "name": "Ada" } });
    b.respond(&asked_b["id"], Ok(answer)).await;

    // The laptop's copy is withdrawn, and it is told who answered (not what was typed).
    let withdrawn = next_of(&mut a, "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked_a["id"]);
    let p = next_of(&mut a, "_acpd/session/request_resolved").await["params"].clone();
    assert_eq!(p["sessionId"], sid.as_str());
    assert_eq!(p["method"], CREATE);
    assert_eq!(p["outcome"], json!({ "action": "accept" }));
    assert_eq!(p["decidedBy"]["connectionId"], b_conn);
    assert_eq!(p["decidedBy"]["name"], "tablet");
    // A late answer of the withdrawn copy changes nothing.
    let late = json!({ "action": "decline" });
    a.respond(&asked_a["id"], Ok(late)).await;

    // URL mode: only the laptop declared it.
    let url = a.wait_held_request(CREATE).await;
    assert_eq!(url["params"]["mode"], "url");
    assert_eq!(url["params"]["elicitationId"], "login-1");
    assert_eq!(url["params"]["url"], "https://example.test/login");
    a.respond(&url["id"], Ok(json!({ "action": "accept" })))
        .await;

    let (ups, r) = a.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&ups),
        [
            r#"elicit: accept {"name":"Ada"}"#,
            "elicit: accept",
            "completed login-1"
        ]
    );
    // The completion reaches the clients that declared URL mode, as the agent sent it.
    let done = next_of(&mut a, COMPLETE).await;
    assert_eq!(done["params"], json!({ "elicitationId": "login-1" }));
    let done = next_of(&mut o, COMPLETE).await;
    assert_eq!(done["params"]["elicitationId"], "login-1");
    // The tablet got the form and nothing of the URL question: the completion, sent
    // before the agent's last words, is not among what it has received by them.
    b.updates_until_text("completed login-1").await;
    assert!(!b.has_buffered(|m| m["method"] == COMPLETE));
    let asked: Vec<&Value> = b.received_requests.iter().map(|r| &r["method"]).collect();
    assert_eq!(asked, [CREATE], "{:?}", b.received_requests);
    assert_eq!(b.received_requests[0]["params"]["mode"], "form");
    assert!(o.received_requests.is_empty(), "{:?}", o.received_requests);
}

#[tokio::test]
async fn a_question_nobody_attached_can_answer_is_declined_at_once() {
    let daemon = Daemon::start().await;
    // Full editors, but none shows elicitations; an observer that could is never asked.
    let mut a = client_with(&daemon, "laptop", json!({})).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let mut b = client_with(&daemon, "tablet", json!({ "elicitation": {} })).await;
    join(&mut b, &sid, "controller").await;
    let both = json!({ "elicitation": { "form": {}, "url": {} } });
    let mut o = client_with(&daemon, "watcher", both).await;
    join(&mut o, &sid, "observer").await;

    let script = "elicit_form What is your name?\nelicit_url x-1 https://example.test/x";
    let (ups, r) = a.prompt(&sid, script).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&ups), ["elicit: decline", "elicit: decline"]);
    for x in [&a, &b, &o] {
        assert!(x.received_requests.is_empty(), "{:?}", x.received_requests);
    }
}

#[tokio::test]
async fn a_controller_that_leaves_mid_question_hands_it_on_and_the_last_leaving_cancels_it() {
    let daemon = Daemon::start().await;
    let mut a = client_with(&daemon, "laptop", json!({})).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let form = json!({ "elicitation": { "form": {} } });
    let mut b = client_with(&daemon, "tablet", form.clone()).await;
    join(&mut b, &sid, "controller").await;
    b.editor.hold(CREATE);

    let id = a
        .send_prompt(&sid, "elicit_form first?\nelicit_form second?")
        .await;
    b.wait_held_request(CREATE).await;
    // A controller attaching while it is open is asked too; the first one leaves.
    let mut c = client_with(&daemon, "phone", form).await;
    c.editor.hold(CREATE);
    join(&mut c, &sid, "controller").await;
    let asked_c = c.wait_held_request(CREATE).await;
    assert_eq!(asked_c["params"]["message"], "first?");
    b.close().await;
    drop(b);
    let answer = json!({ "action": "accept", "content": { "name": "Cy" } });
    c.respond(&asked_c["id"], Ok(answer)).await;

    // The second question: its only able controller leaves, nobody able remains.
    let second = c.wait_held_request(CREATE).await;
    assert_eq!(second["params"]["message"], "second?");
    c.close().await;
    drop(c);
    let (ups, r) = a.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(
        agent_texts(&ups),
        [r#"elicit: accept {"name":"Cy"}"#, "elicit: cancel"]
    );
    assert!(a.received_requests.is_empty(), "{:?}", a.received_requests);
}

#[tokio::test]
async fn a_gated_update_reaches_only_clients_that_declared_it_live_and_in_replay() {
    let daemon = Daemon::start().await;
    let notices = json!({ "session": { "notices": {} } });
    let mut a = client_with(&daemon, "laptop", notices.clone()).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let (ups, r) = a.prompt(&sid, "notice heads up\necho after it").await;
    r.expect("prompt");
    assert_eq!(kinds(&ups), ["notice", "agent_message_chunk"]);

    // Replay: after a seq, and a whole session/load, without and with the capability.
    let mut b = client_with(&daemon, "plain", json!({})).await;
    let (ups, r) = b.attach_after(&sid, 0).await;
    r.expect("attach");
    assert!(!kinds(&ups).contains(&"notice".to_owned()), "{ups:?}");
    assert_eq!(agent_texts(&ups), ["after it"]);
    let mut c = client_with(&daemon, "plain loader", json!({})).await;
    let (ups, r) = c.load(&sid, &daemon.work_dir()).await;
    r.expect("load");
    assert!(!kinds(&ups).contains(&"notice".to_owned()), "{ups:?}");
    assert_eq!(agent_texts(&ups), ["after it"]);
    let mut d = client_with(&daemon, "noticing loader", notices).await;
    let (ups, r) = d.load(&sid, &daemon.work_dir()).await;
    r.expect("load");
    let notice: Vec<&Value> = ups.iter().filter(|u| kind(u) == "notice").collect();
    assert_eq!(notice.len(), 1, "{ups:?}");
    assert_eq!(notice[0]["update"]["title"], "heads up");

    // Live.
    let (ups, _) = a.prompt(&sid, "notice again\necho live").await;
    assert_eq!(kinds(&ups), ["notice", "agent_message_chunk"]);
    for x in [&mut b, &mut c] {
        let ups = x.updates_until_text("live").await;
        assert!(!kinds(&ups).contains(&"notice".to_owned()), "{ups:?}");
    }
    let ups = d.updates_until_text("live").await;
    assert!(kinds(&ups).contains(&"notice".to_owned()), "{ups:?}");
}

#[tokio::test]
async fn builtin_ask_user_asks_a_form_question_through_the_session() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    model.push_stream(vec![tool(
        "ask_user",
        json!({ "question": "Which colour should the button be?" }),
    )]);
    model.push_stream(vec![text("ok")]);
    let mut ed = acpd.editor(json!({ "elicitation": { "form": {} } })).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let r = ed.prompt(&sid, "go").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let asked: Vec<Value> = ed
        .requests()
        .into_iter()
        .filter(|(m, _)| m == CREATE)
        .map(|(_, p)| p)
        .collect();
    assert_eq!(asked.len(), 1, "{:?}", ed.request_methods());
    assert_eq!(asked[0]["mode"], "form");
    assert_eq!(asked[0]["sessionId"], sid.as_str());
    assert_eq!(asked[0]["message"], "Which colour should the button be?");
    assert!(asked[0]["toolCallId"].is_string(), "{}", asked[0]);
    assert_eq!(
        asked[0]["requestedSchema"]["properties"]["answer"]["type"],
        "string"
    );
    let reqs = model.wait_requests(2).await;
    assert!(reqs[0].tool_names().contains(&"ask_user".to_owned()));
    assert!(
        reqs[1].text().contains("The user answered: blue"),
        "{}",
        reqs[1].text()
    );
}

#[tokio::test]
async fn builtin_ask_user_is_not_offered_to_a_client_that_shows_no_forms() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    model.push_stream(vec![text("fine")]);
    let mut plain = acpd.editor(no_caps()).await;
    let (sid, _) = plain.new_session(&acpd.work(), json!({})).await;
    plain.prompt(&sid, "go").await.expect("prompt");
    let reqs = model.wait_requests(1).await;
    assert!(!reqs[0].tool_names().is_empty(), "tools are offered");
    assert!(
        !reqs[0].tool_names().contains(&"ask_user".to_owned()),
        "{:?}",
        reqs[0].tool_names()
    );
}

#[tokio::test]
async fn a_cancelled_turn_withdraws_its_open_question() {
    let daemon = Daemon::start().await;
    let form = json!({ "elicitation": { "form": {} } });
    let mut a = client_with(&daemon, "laptop", form).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    a.editor.hold(CREATE);
    let id = a.send_prompt(&sid, "elicit_form never answered?").await;
    let asked = a.wait_held_request(CREATE).await;
    a.notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let withdrawn = next_of(&mut a, "$/cancel_request").await;
    assert_eq!(withdrawn["params"]["requestId"], asked["id"]);
    let (_, r) = a.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("prompt")["stopReason"], "cancelled");
    let (ups, _) = a.prompt(&sid, "echo next").await;
    assert_eq!(agent_texts(&ups), ["next"]);
}

#[tokio::test]
async fn fs_and_terminal_never_reach_a_client_that_did_not_declare_them() {
    let daemon = Daemon::start().await;
    let input = daemon.work_dir().join("notes.txt");
    std::fs::write(&input, "on the box").unwrap();
    let mut phone = daemon.connect().await;
    let init = json!({ "protocolVersion": 1, "clientCapabilities": {}, "clientInfo": { "name": "phone" } });
    phone.request("initialize", init).await.expect("initialize");
    let sid = phone.open_session(&daemon.work_dir()).await;
    let script = format!(
        "read {}\nterminal echo hi\necho still here",
        input.display()
    );
    let (ups, r) = phone.prompt(&sid, &script).await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    let texts = agent_texts(&ups);
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(texts[0].starts_with("error: -32601"), "{texts:?}");
    assert!(texts[0].contains("fs/readTextFile"), "{texts:?}");
    assert!(texts[1].contains("terminal"), "{texts:?}");
    assert_eq!(texts[2], "still here");
    assert!(
        phone.received_requests.is_empty(),
        "{:?}",
        phone.received_requests
    );
}

//! The built-in agent's model providers misbehaving, end to end: refused credentials, busy
//! servers (bounded retries), a stream that stalls (the read timeout), one slower in total
//! than that timeout (streams on), an endless event (the size cap).

use serde_json::json;

use crate::builtin_support::model::{Ev, Reply, text};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};

#[tokio::test]
async fn builtin_provider_401_is_auth_required() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    model.push(Reply::Status(401, "invalid x-api-key"));
    let e = ed.prompt(&sid, "hi").await.unwrap_err();
    assert_eq!(e["code"], -32000, "{e}");
    assert!(e.to_string().contains("invalid x-api-key"), "{e}");
    // A provider refusing to answer is an error, not a hang; a refusal finish is a stop reason.
    model.push_stream(vec![text("I can't"), Ev::Finish("refusal")]);
    assert_eq!(
        ed.prompt(&sid, "bad").await.unwrap()["stopReason"],
        "refusal"
    );
    model.push_stream(vec![text("long"), Ev::Finish("max_tokens")]);
    assert_eq!(
        ed.prompt(&sid, "long").await.unwrap()["stopReason"],
        "max_tokens"
    );
}

#[tokio::test]
async fn builtin_a_stalled_model_stream_ends_the_turn_within_the_read_timeout() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "read_timeout_secs = 1")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    // The model says something, then goes quiet with the connection open.
    model.push_stream(vec![text("partial answer"), Ev::Hang]);
    let e = ed.prompt(&sid, "talk").await.unwrap_err();
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("stopped sending") && msg.contains("read_timeout_secs"),
        "a clear error: {e}"
    );
    assert!(
        !ed.updates_of("agent_message_chunk").is_empty(),
        "the partial text was streamed"
    );
    // The session goes on, and what streamed before the stall is kept.
    model.push_stream(vec![text("back")]);
    assert_eq!(
        ed.prompt(&sid, "again").await.unwrap()["stopReason"],
        "end_turn"
    );
    let reqs = model.wait_requests(2).await;
    assert!(
        reqs[1].text().contains("partial answer"),
        "{}",
        reqs[1].text()
    );
}

#[tokio::test]
async fn builtin_an_answer_longer_than_the_read_timeout_streams_to_the_end() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "read_timeout_secs = 2")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    // Longer in total than the read timeout, but never quiet that long: the timeout is for
    // silence, not for the whole answer.
    let mut evs = vec![];
    for w in ["one ", "two ", "three ", "four"] {
        evs.push(text(w));
        evs.push(Ev::Pause(700));
    }
    model.push_stream(evs);
    assert_eq!(
        ed.prompt(&sid, "count slowly").await.unwrap()["stopReason"],
        "end_turn"
    );
    let said: String = ed
        .updates_of("agent_message_chunk")
        .iter()
        .filter_map(|u| u["content"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(said, "one two three four");
}

#[tokio::test]
async fn builtin_an_endless_event_ends_the_turn_with_an_error() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    for m in ["claude", "gpt"] {
        ed.request(
            "session/set_config_option",
            json!({ "sessionId": sid, "configId": "model", "value": m }),
        )
        .await
        .expect("switch model");
        model.push_stream(vec![text("before"), Ev::Endless]);
        let e = ed.prompt(&sid, "talk").await.unwrap_err();
        assert!(
            e["message"]
                .as_str()
                .unwrap_or_default()
                .contains("over 16 MiB"),
            "{m}: {e}"
        );
    }
    // The session goes on.
    model.push_stream(vec![text("fine")]);
    assert_eq!(
        ed.prompt(&sid, "again").await.unwrap()["stopReason"],
        "end_turn"
    );
}

#[tokio::test]
async fn builtin_provider_retries_are_bounded() {
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "retries = 2")).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    // Busy three times: the first try and both retries fail, then the turn gives up.
    for _ in 0..3 {
        model.push(Reply::Status(503, "overloaded"));
    }
    let e = ed.prompt(&sid, "hi").await.unwrap_err();
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(msg.contains("503") && msg.contains("overloaded"), "{e}");
    // A 400 is not retried.
    model.push(Reply::Status(400, "bad request"));
    let e = ed.prompt(&sid, "hi").await.unwrap_err();
    assert!(e.to_string().contains("bad request"), "{e}");
    // Exactly 3 + 1 requests were made before this one.
    model.push_stream(vec![text("fine")]);
    assert_eq!(
        ed.prompt(&sid, "again").await.unwrap()["stopReason"],
        "end_turn"
    );
    assert_eq!(model.wait_requests(5).await.len(), 5);
}

#[tokio::test]
async fn builtin_a_provider_that_never_answers_ends_the_turn_within_the_read_timeout() {
    let model = ModelServer::start().await;
    let config = builtin_config(model.addr, "read_timeout_secs = 1\nretries = 1");
    let acpd = Acpd::start(&config).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    // Silent twice: the first try and its one retry.
    model.push(Reply::Silent);
    model.push(Reply::Silent);
    let e = ed.prompt(&sid, "hello?").await.unwrap_err();
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("no answer within 1 s (read_timeout_secs"),
        "a clear error: {e}"
    );
    assert_eq!(model.requests().len(), 2, "retried once, then gave up");
}

#[tokio::test]
async fn builtin_without_a_model_says_how_to_try_the_demo_model() {
    // No [builtin.models], no key in the environment (`Acpd` removes them).
    let acpd = Acpd::start("").await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let e = ed.prompt(&sid, "hi").await.unwrap_err();
    let text = e.to_string();
    for hint in [
        "no model is configured",
        "ANTHROPIC_API_KEY",
        "ACPD_MODEL=demo",
    ] {
        assert!(text.contains(hint), "{hint} missing from {e}");
    }
}

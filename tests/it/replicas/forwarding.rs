//! Forwarding (`--advertise-url`): a client on a replica that does not own its session is
//! served by the owner over the internal link, so it gets every update exactly once with the
//! owner's seqs, its cancel stops the owner's turn, and a load replays the owner's journal.

use std::time::Duration;

use serde_json::json;

use super::takeover::{replica, secret};
use crate::support::{Daemon, agent_texts, assert_consecutive, seqs};

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_client_on_a_non_owner_gets_every_update_of_the_owners_turn_exactly_once() {
    let s = secret();
    let a = Daemon::start_with(replica("a", 2000, &s.path).postgres().advertise()).await;
    let b = Daemon::start_beside(&a, replica("b", 2000, &s.path).advertise()).await;
    let c = Daemon::start_beside(&a, replica("c", 2000, &s.path).advertise()).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;

    // B prompts A's session: the turn runs on A, its updates come through B.
    let mut on_b = b.client().await;
    let updates = super::prompt_through(&mut on_b, &sid, 60).await;

    // A's own client saw the same entries under the same seqs (the owner numbered them).
    let on_a_saw = on_a.updates_until_text("chunk-60").await;
    let mine: Vec<i64> = seqs(&updates);
    let theirs: Vec<i64> = on_a_saw
        .iter()
        .filter(|u| crate::support::kind(u) == "agent_message_chunk")
        .map(crate::support::seq)
        .collect();
    assert_eq!(mine, theirs);

    // A load through a third replica replays A's journal, one entry per message; an attach
    // from the start gives every seq.
    let mut on_c = c.client().await;
    let (replay, loaded) = on_c.load(&sid, &cwd).await;
    loaded.expect("load through c");
    let history = super::history(&replay);
    assert_eq!(super::words(&history), super::words(&updates));
    assert_eq!(
        agent_texts(&history).len(),
        1,
        "the turn's chunks are one message"
    );
    let mut reader = c.client().await;
    let all = super::attach_all(&mut reader, &sid).await;
    assert_consecutive(&all);
    assert_eq!(agent_texts(&all), agent_texts(&updates));
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_cancel_sent_to_a_non_owner_stops_the_owners_turn() {
    let s = secret();
    let a = Daemon::start_with(replica("a", 2000, &s.path).postgres().advertise()).await;
    let b = Daemon::start_beside(&a, replica("b", 2000, &s.path).advertise()).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;
    let mut on_b = b.client().await;
    let turn = on_b
        .send_prompt(&sid, "echo started\nsleep 20000\necho too-late")
        .await;
    on_b.updates_until_text("started").await;
    on_b.notify("session/cancel", json!({ "sessionId": sid }))
        .await;
    let answer = tokio::time::timeout(Duration::from_secs(10), on_b.wait_response(&turn))
        .await
        .expect("the turn ends soon after the cancel");
    assert_eq!(answer.expect("answered")["stopReason"], "cancelled");
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn an_unreachable_owner_is_reported_owned_elsewhere_then_taken_over() {
    let s = secret();
    let mut a = Daemon::start_with(replica("a", 1500, &s.path).postgres().advertise()).await;
    let b = Daemon::start_beside(&a, replica("b", 1500, &s.path).advertise()).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;
    let (_, first) = on_a.prompt(&sid, "echo one").await;
    assert_eq!(first.expect("turn on a")["stopReason"], "end_turn");
    a.kill().await;
    // While A's lease lives B cannot forward to it: -32012 with a retry hint, then the
    // takeover once the lease is out.
    let mut on_b = b.client().await;
    let (_, refused) = on_b.load(&sid, &cwd).await;
    let err = refused.expect_err("a dead owner's lease still lives");
    assert_eq!(err.code, -32012, "{err}");
    assert!(err.data.expect("data")["acpd"]["retryAfterMs"].as_i64() <= Some(1500));
    let (replay, _) =
        super::takeover::load_when_free(&mut on_b, &sid, &cwd, Duration::from_secs(15)).await;
    assert_eq!(agent_texts(&replay), ["one"]);
}

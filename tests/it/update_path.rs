//! The update path never waits on a client: a client stuck in a big `session/load` holds up
//! no other session of the agent; a connection's commands for a session still being opened
//! keep their order (a cancel never overtakes its prompt); a re-attach while the client's
//! queue is full delivers every update exactly once, in seq order; a prompt sent the moment
//! `session/new` answers is never lost; an agent streaming faster than the journal commits is
//! slowed down, never cut off, and a session that takes nothing (its journal stalled) is detached from
//! its agent after a bound; a close sent while the client lags is answered once it caught up.
//! `/metrics` shows each of these while it lasts.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::operations::sample;
use crate::support::agent_chunks as chunks;
use crate::support::{Daemon, DaemonOptions, agent_texts, assert_consecutive, seq, seqs};

#[tokio::test]
async fn a_client_stuck_in_a_big_load_holds_up_no_other_session_of_the_agent() {
    const HISTORY: usize = 100_000;
    // The stuck client must stay attached (and stuck) for the whole test; no retention, so
    // the replay is the journal as streamed.
    let opts = DaemonOptions::default()
        .arg("--slow-client-cutoff-ms", 600_000)
        .arg("--journal-max-entries", 0);
    let daemon = Daemon::start_with(opts).await;
    let long = Duration::from_secs(180);
    let mut writer = daemon.client().await.with_timeout(long);
    let big = writer.open_session(&daemon.work_dir()).await;
    let (turn, r) = writer.prompt(&big, &format!("stream {HISTORY} 64")).await;
    assert_eq!(r.unwrap()["stopReason"], "end_turn");
    assert_eq!(chunks(&turn).len(), HISTORY);
    let history: String = agent_texts(&turn).concat();
    // The big session keeps its agent busy while it is loaded: its actor gets events all along.
    writer.send_prompt(&big, "stream 50000 64").await;
    drop(writer);

    // The stuck client asks for the whole journal and reads nothing.
    let mut stuck = daemon.client().await.with_timeout(long);
    let params = json!({ "sessionId": big, "cwd": daemon.work_dir(), "mcpServers": [] });
    let load = stuck.send_request("session/load", params).await;

    // Another session of the same agent streams meanwhile.
    let mut other = daemon.client().await.with_timeout(Duration::from_secs(60));
    let sid = other.open_session(&daemon.work_dir()).await;
    let (turn, r) = other.prompt(&sid, "stream 10000 32").await;
    assert_eq!(
        r.expect("the other session's turn")["stopReason"],
        "end_turn"
    );
    let turn = chunks(&turn);
    assert_eq!(turn.len(), 10_000, "every update of the other session");
    assert_consecutive(&turn);

    // The stuck client was slow, not lost: once it reads, it gets the whole journal in order.
    let (replayed, r) = stuck.collect_updates_until_response(&load).await;
    r.expect("the load answers after its replay");
    // One entry per message (a page of the journal at most): the same words, seqs ascending.
    let replayed = chunks(&replayed);
    let text: String = agent_texts(&replayed).concat();
    assert!(
        text.starts_with(&history),
        "{} bytes replayed in {} messages, seqs {:?}..{:?}",
        text.len(),
        replayed.len(),
        replayed.first().map(seq),
        replayed.last().map(seq)
    );
    crate::support::assert_increasing(&replayed);
}

#[tokio::test]
async fn cancel_right_after_prompt_on_a_session_being_opened_ends_the_turn_cancelled() {
    let daemon = Daemon::start().await;
    let mut creator = daemon.client().await;
    let sid = creator.open_session(&daemon.work_dir()).await;
    drop(creator);
    // Each round a fresh connection, for which the session is still being opened when both
    // commands arrive back to back.
    for round in 0..30 {
        let mut c = daemon.client().await;
        let prompt = c.send_prompt(&sid, "wait_for_cancel; echo never").await;
        c.notify("session/cancel", json!({ "sessionId": sid }))
            .await;
        let (updates, r) = c.collect_updates_until_response(&prompt).await;
        assert_eq!(
            r.unwrap_or_else(|e| panic!("round {round}: {e:?}")),
            json!({ "stopReason": "cancelled" }),
            "round {round}"
        );
        assert!(
            !agent_texts(&updates).contains(&"never".to_string()),
            "round {round}: the turn ran on after the cancel: {updates:?}"
        );
    }
}

#[tokio::test]
async fn re_attach_during_a_full_queue_delivers_every_update_once_in_order() {
    const N: usize = 20_000;
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(120));
    let sid = c.open_session(&daemon.work_dir()).await;
    let before = c.take_buffered_updates();
    let last_read = before.last().map_or(0, seq);
    // 20 MiB: far more than the client's queue and the socket buffers.
    let prompt = c.send_prompt(&sid, &format!("stream {N} 1024")).await;
    // Read nothing until the session says the client's queue is full.
    daemon.until_lagging().await;
    // Re-attach after the last update actually read.
    let attach = c
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": last_read }),
        )
        .await;
    let (mut updates, r) = c.collect_updates_until_response(&prompt).await;
    assert_eq!(r.unwrap()["stopReason"], "end_turn");
    let (more, r) = c.collect_updates_until_response(&attach).await;
    let last_seq = r.expect("attach")["lastSeq"].as_i64().unwrap();
    updates.extend(more);
    let seqs = seqs(&updates);
    assert_eq!(
        seqs.iter().collect::<HashSet<_>>().len(),
        seqs.len(),
        "an update arrived twice"
    );
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "seqs out of order");
    assert!(seqs.iter().all(|s| *s > last_read));
    let turn = chunks(&updates);
    assert_eq!(turn.len(), N, "every update of the turn");
    assert_consecutive(&turn);
    assert!(last_seq >= seq(&turn[0]), "lastSeq {last_seq}");
}

#[tokio::test]
async fn a_prompt_sent_the_moment_session_new_answers_is_never_lost() {
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await;
    // The answer can reach the client before the connection has filed the new session: the
    // prompt then waits for it, in order, rather than being dropped.
    for round in 0..20 {
        let sid = c.new_session(&daemon.work_dir()).await;
        let (updates, r) = c.prompt(&sid, &format!("echo round {round}")).await;
        assert_eq!(
            r.unwrap_or_else(|e| panic!("round {round}: {e:?}"))["stopReason"],
            "end_turn"
        );
        assert!(agent_texts(&updates).contains(&format!("round {round}")));
    }
}

#[tokio::test]
async fn an_agent_streaming_faster_than_the_journal_keeps_loses_nothing() {
    // The scripted agent writes a burst far faster than any journal commits it: the router
    // must slow the agent down rather than give up on the session.
    const N: usize = 300_000;
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(240));
    let sid = c.open_session(&daemon.work_dir()).await;
    let (turn, r) = c.prompt(&sid, &format!("stream {N} 16")).await;
    assert_eq!(r.expect("the turn")["stopReason"], "end_turn");
    let turn = chunks(&turn);
    assert_eq!(turn.len(), N, "every update of the turn");
    assert_consecutive(&turn);
    // Alone on the machine the agent outruns the journal by far (the log says "pausing the
    // agent's output"); under a loaded test run it may not, and then there is nothing to slow.
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(!log.contains("detaching it from the agent"), "{log}");
}

#[tokio::test]
async fn a_close_sent_while_the_client_lags_is_answered_once_caught_up() {
    const N: usize = 20_000;
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(120));
    let sid = c.open_session(&daemon.work_dir()).await;
    // 20 MiB: far more than the client's queue and the socket buffers.
    let prompt = c.send_prompt(&sid, &format!("stream {N} 1024")).await;
    daemon.until_lagging().await;
    // The answers to the turn and to the close are held behind the client's catch-up; the
    // session ends after the close, and must not drop them on its way out.
    let close = c
        .send_request("session/close", json!({ "sessionId": sid }))
        .await;
    let (_, r) = c.collect_updates_until_response(&prompt).await;
    let stop = r.expect("the turn's answer")["stopReason"].clone();
    assert!(stop == "cancelled" || stop == "end_turn", "{stop}");
    let (_, r) = c.collect_updates_until_response(&close).await;
    assert_eq!(r.expect("the close's answer"), json!({}));
}

#[tokio::test]
async fn metrics_show_clients_fed_from_the_journal_until_they_caught_up() {
    const N: usize = 20_000;
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(120));
    let sid = c.open_session(&daemon.work_dir()).await;
    // 20 MiB the client does not read for a while: its queue fills.
    let prompt = c.send_prompt(&sid, &format!("stream {N} 1024")).await;
    daemon.until_lagging().await;
    let m = metrics(&daemon).await;
    assert_eq!(sample(&m, "acpd_clients_catching_up"), 1.0, "{m}");
    assert_eq!(sample(&m, CAUGHT_UP_BEHIND), 1.0, "{m}");
    let (turn, r) = c.collect_updates_until_response(&prompt).await;
    assert_eq!(r.expect("the turn")["stopReason"], "end_turn");
    assert_eq!(chunks(&turn).len(), N);
    until_metric(&daemon, "acpd_clients_catching_up", 0.0).await;
    let attaches = sample(&metrics(&daemon).await, CAUGHT_UP_ATTACH);

    // A load replays the journal: a catch-up of its own, over once the load is answered.
    let mut loader = daemon.client().await.with_timeout(Duration::from_secs(120));
    let params = json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [] });
    let load = loader.send_request("session/load", params).await;
    let (replayed, r) = loader.collect_updates_until_response(&load).await;
    r.expect("the load");
    // One entry per message (a page of the journal at most), the whole text.
    let text: String = agent_texts(&replayed).concat();
    assert_eq!(text, agent_texts(&turn).concat());
    until_metric(&daemon, "acpd_clients_catching_up", 0.0).await;
    let m = metrics(&daemon).await;
    assert_eq!(sample(&m, CAUGHT_UP_ATTACH), attaches + 1.0, "{m}");
    // (Reading, the client may have caught up and fallen behind again.)
    assert!(sample(&m, CAUGHT_UP_BEHIND) >= 1.0, "{m}");
    // Nothing here held an agent up.
    assert_eq!(sample(&m, "acpd_sessions_behind_agent"), 0.0, "{m}");
    assert_eq!(sample(&m, "acpd_sessions_cut_from_agent_total"), 0.0, "{m}");
}

const CAUGHT_UP_BEHIND: &str = r#"acpd_client_catch_ups_total{cause="behind"}"#;
const CAUGHT_UP_ATTACH: &str = r#"acpd_client_catch_ups_total{cause="attach"}"#;

async fn metrics(daemon: &Daemon) -> String {
    crate::operations::http_get(daemon.addr, "/metrics").await.1
}

/// Waits (bounded) until `series` shows `want`.
async fn until_metric(daemon: &Daemon, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(daemon).await;
        if sample(&m, series) == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} is not {want}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store that stalls (the test holds its write lock) never stalls the agent: the session
/// stops its journal and fails the turn with the store's error rather than stop taking the
/// agent's output, so the router never has to pause the agent or cut the session off.
#[tokio::test]
async fn a_stalled_store_fails_the_turn_and_its_agents_other_sessions_go_on() {
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(90));
    let sid = c.open_session(&daemon.work_dir()).await;
    let lock = StoreLock::take(&daemon.store_url()).await;
    let prompt = c.send_prompt(&sid, "stream 300000 16").await;
    let (_, r) = c.collect_updates_until_response(&prompt).await;
    let err = r.expect_err("the turn fails while the store takes no writes");
    assert!(err.message.contains("not taking writes"), "{err:?}");
    let m = metrics(&daemon).await;
    assert_eq!(sample(&m, "acpd_sessions_cut_from_agent_total"), 0.0, "{m}");
    // Whatever the router held for it while the store still looked slow drains.
    until_metric(&daemon, "acpd_sessions_behind_agent", 0.0).await;
    lock.release().await;
    // The agent goes on: the same session reopens from its journal (once the store's stuck
    // commit is over: until then it answers "closing; try again"), and a new one works.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, r) = c.prompt(&sid, "echo again").await;
        match r {
            Ok(r) => break assert_eq!(r["stopReason"], "end_turn"),
            Err(e) if e.message.contains("closing") => {
                assert!(tokio::time::Instant::now() < deadline, "{e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the next turn: {e:?}"),
        }
    }
    let other = c.open_session(&daemon.work_dir()).await;
    let (updates, r) = c.prompt(&other, "echo other").await;
    assert_eq!(r.expect("another session")["stopReason"], "end_turn");
    assert!(agent_texts(&updates).contains(&"other".to_owned()));
}

/// The journal's write lock, held by the test (SQLite: an exclusive transaction; Postgres: the
/// journal table locked against writes).
enum StoreLock {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

impl StoreLock {
    async fn take(url: &str) -> StoreLock {
        use sqlx::Connection;
        if url.starts_with("sqlite:") {
            let mut db = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut db)
                .await
                .expect("lock");
            StoreLock::Sqlite(db)
        } else {
            let mut db = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("BEGIN").execute(&mut db).await.expect("begin");
            sqlx::query("LOCK TABLE journal IN EXCLUSIVE MODE")
                .execute(&mut db)
                .await
                .expect("lock");
            StoreLock::Postgres(db)
        }
    }

    async fn release(self) {
        use sqlx::Connection;
        match self {
            StoreLock::Sqlite(mut db) => {
                sqlx::query("ROLLBACK")
                    .execute(&mut db)
                    .await
                    .expect("unlock");
                db.close().await.ok();
            }
            StoreLock::Postgres(mut db) => {
                sqlx::query("ROLLBACK")
                    .execute(&mut db)
                    .await
                    .expect("unlock");
                db.close().await.ok();
            }
        }
    }
}

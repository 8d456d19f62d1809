//! The daemon on Postgres while its database connections are killed (mid-stream, between
//! requests): nothing the client was sent is lost, the turn completes, a `session/new` is
//! answered, and the daemon recovers by itself.

use sqlx::{Connection, Executor};
use std::time::Duration;

use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn postgres_connections_killed_mid_stream_lose_nothing() {
    let daemon = Daemon::start_with(DaemonOptions::default().postgres()).await;
    let db = daemon.postgres_db().expect("postgres store");
    let (admin_url, name) = (db.admin_url().to_owned(), db.name().to_owned());
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    let sid = client.open_session(&daemon.work_dir()).await;
    let prompt_id = client.send_prompt(&sid, "stream 3000 32").await;

    // Kill every connection of the daemon to its database, three times during the stream.
    let killer = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            kill_connections(&admin_url, &name).await;
        }
    });
    let (live, result) = client.collect_updates_until_response(&prompt_id).await;
    killer.await.unwrap();
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let chunks: Vec<&Value> = live
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .collect();
    assert_eq!(chunks.len(), 3000, "every chunk reached the client");
    let seqs: Vec<i64> = chunks
        .iter()
        .map(|u| u["_meta"]["acpd"]["seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive seqs"
    );

    // Everything the client saw is in the journal.
    let mut other = daemon.client().await.with_timeout(Duration::from_secs(60));
    // Every seq, one by one (a load would merge the turn's chunks into one message).
    let (replay, result) = other.attach_after(&sid, 0).await;
    result.expect("attach after the kills");
    let replayed: Vec<i64> = replay
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|u| u["_meta"]["acpd"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(replayed, seqs);

    // And the daemon works normally afterwards.
    let (_, result) = client.prompt(&sid, "echo still here").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

use serde_json::Value;

/// Terminates every connection to database `name` but the one doing it.
async fn kill_connections(admin_url: &str, name: &str) {
    let mut admin = sqlx::PgConnection::connect(admin_url).await.unwrap();
    let sql = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    );
    admin.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    admin.close().await.ok();
}

/// The pool does not ping a connection back from use a moment ago before it hands it out
/// again (a round trip in front of every statement); a `session/new` whose connection a
/// server restart killed meanwhile is still answered (the insert takes another), and so is
/// one after the daemon sat idle (long-idle connections are pinged and replaced).
#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn postgres_session_new_after_its_connections_were_killed() {
    let daemon = Daemon::start_with(DaemonOptions::default().postgres()).await;
    let db = daemon.postgres_db().expect("postgres store");
    let (admin_url, name) = (db.admin_url().to_owned(), db.name().to_owned());
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(60));
    for idle in [false, true, false, true] {
        // Connections just used (and so not pinged again), or idle past the ping threshold.
        client.new_session(&daemon.work_dir()).await;
        if idle {
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        kill_connections(&admin_url, &name).await;
        let sid = client.new_session(&daemon.work_dir()).await;
        let (_, result) = client.prompt(&sid, "echo after the kill").await;
        assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    }
}

/// Makes the daemon's journal commits wait: an open transaction of another connection holds
/// an exclusive lock on the journal table until the returned connection is dropped (a
/// database that takes no writes, without an error to retry).
async fn block_journal(url: &str) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    conn.execute("BEGIN").await.unwrap();
    conn.execute("LOCK TABLE journal IN EXCLUSIVE MODE")
        .await
        .unwrap();
    conn
}

/// `session/set_mode` to an unknown mode: a round trip through the session's actor and its
/// agent that journals nothing. Answered (an error) within a second.
async fn answers_within_a_second(client: &mut crate::support::Client, sid: &str) {
    let params = serde_json::json!({ "sessionId": sid, "modeId": "no-such-mode" });
    let answer = tokio::time::timeout(
        Duration::from_secs(1),
        client.request("session/set_mode", params),
    )
    .await
    .expect("another session of the connection answers while the store takes no writes");
    assert!(answer.is_err(), "{answer:?}");
}

/// The session actor never waits on the store: while journal writes are stuck, the client's
/// `session/cancel` reaches the agent and the turn ends `cancelled` within a second (the
/// updates that are not durable are never sent), and the connection's other session answers.
#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn cancel_ends_the_turn_while_the_store_takes_no_writes() {
    let daemon = Daemon::start_with(DaemonOptions::default().postgres()).await;
    let db = daemon.postgres_db().expect("postgres store");
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let other = client.open_session(&daemon.work_dir()).await;
    let lock = block_journal(db.url()).await;
    let prompt = client
        .send_prompt(&sid, "stream 20 16; wait_for_cancel")
        .await;
    // Long enough for the journal's commit to count as stuck.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cancelled_at = tokio::time::Instant::now();
    client
        .notify("session/cancel", serde_json::json!({ "sessionId": sid }))
        .await;
    let result = tokio::time::timeout(Duration::from_secs(1), client.wait_response(&prompt))
        .await
        .expect("the cancelled turn is answered within a second");
    assert_eq!(result.unwrap()["stopReason"], "cancelled");
    assert!(cancelled_at.elapsed() < Duration::from_secs(1));
    answers_within_a_second(&mut client, &other).await;
    drop(lock);
}

/// A store whose write queue fills (journal writes stuck while the agent streams) fails the
/// running turn with a clear error instead of stalling the session; the connection's other
/// session answers meanwhile.
#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_full_store_queue_fails_the_turn_and_spares_the_connection() {
    let daemon = Daemon::start_with(DaemonOptions::default().postgres()).await;
    let db = daemon.postgres_db().expect("postgres store");
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(30));
    let sid = client.open_session(&daemon.work_dir()).await;
    let other = client.open_session(&daemon.work_dir()).await;
    let lock = block_journal(db.url()).await;
    // More updates than the store's write queue (8 192) and a batch hold.
    let prompt = client
        .send_prompt(&sid, "stream 12000 16; wait_for_cancel")
        .await;
    let err = client
        .wait_response(&prompt)
        .await
        .expect_err("the turn fails");
    assert!(err.message.contains("not taking writes"), "{err:?}");
    answers_within_a_second(&mut client, &other).await;
    drop(lock);
}

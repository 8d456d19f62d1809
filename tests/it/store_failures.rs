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

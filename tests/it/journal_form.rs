//! Journal format 3 as a user meets it: a streamed update is stored without its session id
//! and seq, an attach from the start (`_acpd/session/attach`, exact per seq) gives back
//! exactly what was sent live, and a journal written before the upgrade (whole bodies,
//! format 2) reads as it was.

use std::time::Duration;

use sqlx::{Connection, SqliteConnection};

use crate::support::agent_chunks as chunks;
use crate::support::{Client, Daemon, DaemonOptions};

/// Every update of `sid` from the journal, one per seq (a `session/load` merges messages).
async fn replay_all(client: &mut Client, sid: &str) -> Vec<serde_json::Value> {
    let params = serde_json::json!({ "sessionId": sid, "afterSeq": 0 });
    let id = client.send_request("_acpd/session/attach", params).await;
    let (all, result) = client.collect_updates_until_response(&id).await;
    result.expect("attach from the start");
    all
}

/// `(seq, n_entries, body)` of every journal row of `sid`, oldest first.
async fn rows(db: &mut SqliteConnection, sid: &str) -> Vec<(i64, i64, String)> {
    sqlx::query_as("SELECT seq, n_entries, body FROM journal WHERE session_id = ? ORDER BY seq")
        .bind(sid)
        .fetch_all(db)
        .await
        .expect("journal rows")
}

#[tokio::test]
async fn updates_are_stored_without_session_id_and_seq_and_load_back_exactly_even_from_format_2_rows()
 {
    let mut daemon = Daemon::start_with(DaemonOptions::default().sqlite()).await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(30));
    let sid = client.open_session(&daemon.work_dir()).await;
    let (live, result) = client.prompt(&sid, "stream 500 40").await;
    assert_eq!(result.expect("stream")["stopReason"], "end_turn");
    let live = chunks(&live);
    assert_eq!(live.len(), 500);
    drop(client);
    assert!(daemon.sigterm().await.success());

    let url = format!("sqlite://{}", daemon.dir().join("acpd.db").display());
    let mut db = SqliteConnection::connect(&url)
        .await
        .expect("open the file");
    let stored = rows(&mut db, &sid).await;
    let mut short = 0;
    for (seq, n, body) in &stored {
        assert!(
            !body.contains(&sid) && !body.contains(r#""_meta":{"acpd""#),
            "row {seq} stores what its columns hold: {body}"
        );
        short += body
            .split('\n')
            .filter(|b| b.starts_with(r#","update":{"sessionUpdate":"agent_message_chunk""#))
            .count();
        assert_eq!(body.split('\n').count() as i64, *n, "row {seq}");
    }
    assert_eq!(short, 500, "every streamed chunk stored short");

    // What an acpd before format 3 wrote: every body whole, as sent.
    for (seq, n, body) in &stored {
        let whole: Vec<String> = body
            .split('\n')
            .zip(*seq..*seq + *n)
            .map(|(members, seq)| {
                let mut text = String::new();
                let parts = acpd_protocol::update_form::Parts {
                    session_id: &sid,
                    members,
                    seq,
                };
                acpd_protocol::update_form::join(parts, &mut text);
                text
            })
            .collect();
        sqlx::query("UPDATE journal SET body = ? WHERE session_id = ? AND seq = ?")
            .bind(whole.join("\n"))
            .bind(&sid)
            .bind(seq)
            .execute(&mut db)
            .await
            .expect("rewrite a row whole");
    }
    assert!(
        rows(&mut db, &sid)
            .await
            .iter()
            .all(|(_, _, b)| b.contains(&sid))
    );
    db.close().await.ok();

    daemon.restart().await;
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(30));
    let loaded = replay_all(&mut client, &sid).await;
    assert_eq!(
        chunks(&loaded),
        live,
        "the journal gives back what was sent live"
    );
    // New updates after the old rows are stored short again and load in order.
    let (more, result) = client.prompt(&sid, "stream 3 8").await;
    result.expect("a turn after the load");
    let mut again = daemon.client().await.with_timeout(Duration::from_secs(30));
    let all = replay_all(&mut again, &sid).await;
    let mut expected = live.clone();
    expected.extend(chunks(&more));
    assert_eq!(chunks(&all), expected);
}

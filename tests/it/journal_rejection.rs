//! An update the database rejects: the turn answers an error, no update after it reaches a
//! client (none could be replayed), other sessions stream on, and the session reopens from
//! its journal on the next request. The test's own database refuses one specific update
//! (and, further down, one new session's row).

use serde_json::Value;
use sqlx::{Connection, PgConnection, SqliteConnection};

use crate::support::{Daemon, DaemonOptions, chunk_text, kind, seq, seqs};

/// The text of the one agent chunk the database refuses.
const MARKER: &str = "REJECT-ME";

/// Makes the daemon's database refuse every agent chunk that carries `MARKER` (a trigger on
/// SQLite, a CHECK constraint on Postgres: both are data errors, never retried).
async fn refuse_marker(url: &str) {
    refuse(
        url,
        "CREATE TRIGGER test_reject BEFORE INSERT ON journal \
         WHEN NEW.kind = 'agent_message_chunk' AND NEW.body LIKE '%REJECT-ME%' \
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        "ALTER TABLE journal ADD CONSTRAINT test_reject \
         CHECK (kind <> 'agent_message_chunk' OR body NOT LIKE '%REJECT-ME%')",
    )
    .await;
}

/// Runs the statement for the daemon's database: `sqlite` on SQLite, `postgres` on Postgres.
async fn refuse(url: &str, sqlite: &str, postgres: &str) {
    if url.starts_with("sqlite:") {
        let mut db = SqliteConnection::connect(url)
            .await
            .expect("connect sqlite");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sqlite))
            .execute(&mut db)
            .await
            .expect("install the refusal");
        db.close().await.ok();
    } else {
        let mut db = PgConnection::connect(url).await.expect("connect postgres");
        sqlx::raw_sql(sqlx::AssertSqlSafe(postgres))
            .execute(&mut db)
            .await
            .expect("install the refusal");
        db.close().await.ok();
    }
}

fn chunks(updates: &[Value]) -> Vec<&str> {
    updates
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .filter_map(|u| chunk_text(u))
        .collect()
}

#[tokio::test]
async fn an_update_the_database_rejects_ends_the_turn_with_an_error_and_nothing_after_it_is_sent() {
    rejected_update(DaemonOptions::default()).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn on_postgres_an_update_the_database_rejects_ends_the_turn_with_an_error() {
    rejected_update(DaemonOptions::default().postgres()).await;
}

async fn rejected_update(opts: DaemonOptions) {
    let daemon = Daemon::start_with(opts).await;
    let mut a = daemon.client().await;
    let mut b = daemon.client().await;
    let s1 = a.open_session(&daemon.work_dir()).await;
    let s2 = b.open_session(&daemon.work_dir()).await;
    // The schema is in place once a session exists.
    refuse_marker(&daemon.store_url()).await;

    // The refused chunk comes after 100 good ones, and 100 more would follow it; meanwhile
    // another session of the same agent streams.
    let p1 = a
        .send_prompt(&s1, &format!("stream 100 16\necho {MARKER}\nstream 100 16"))
        .await;
    let p2 = b.send_prompt(&s2, "stream 2000 16").await;
    let ((seen, result), (other, other_result)) = tokio::join!(
        a.collect_updates_until_response(&p1),
        b.collect_updates_until_response(&p2)
    );
    let err = result.expect_err("the turn answers an error");
    assert!(
        err.message.contains("rejected update"),
        "the error says what happened: {err}"
    );
    let texts = chunks(&seen);
    assert_eq!(
        texts.len(),
        100,
        "exactly the chunks before the refused one"
    );
    assert!(texts.iter().all(|t| !t.contains(MARKER)));
    assert!(seen.iter().all(|u| u["sessionId"] == s1.as_str()));
    let last_sent = *seqs(&seen).last().expect("some updates were sent");

    assert_eq!(
        other_result.expect("the other session")["stopReason"],
        "end_turn"
    );
    assert_eq!(chunks(&other).len(), 2000, "the other session lost nothing");

    // Nothing of s1 arrives after the error: a round trip on the same connection brings none.
    let (_, listed) = (a.take_buffered_updates(), a.list(None, None).await);
    listed.expect("session/list");
    assert!(
        a.take_buffered_updates().is_empty(),
        "no update of the stopped session after its error"
    );

    // What the client saw is exactly what the journal replays.
    let mut c = daemon.client().await;
    let (replay, loaded) = c.attach_after(&s1, 0).await;
    loaded.expect("the session reopens from its journal");
    assert_eq!(seqs(&replay).last(), Some(&last_sent));
    let replayed: Vec<i64> = replay
        .iter()
        .map(seq)
        .filter(|s| *s >= seq(&seen[0]))
        .collect();
    assert_eq!(
        replayed,
        seqs(&seen),
        "every update sent is durable, nothing more"
    );

    // And the session goes on: the next turn works and continues the journal.
    let (more, result) = c.prompt(&s1, "echo after").await;
    assert_eq!(result.expect("next turn")["stopReason"], "end_turn");
    assert_eq!(chunks(&more), ["after"]);
    assert!(seqs(&more).iter().all(|s| *s > last_sent));
}

/// The directory name whose sessions' rows the database refuses.
const REFUSED_DIR: &str = "refuse-this-row";

/// Makes the daemon's database refuse every new session row whose cwd is in `REFUSED_DIR`.
async fn refuse_rows(url: &str) {
    refuse(
        url,
        "CREATE TRIGGER test_reject_row BEFORE INSERT ON sessions \
         WHEN NEW.cwd LIKE '%refuse-this-row%' \
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        "ALTER TABLE sessions ADD CONSTRAINT test_reject_row \
         CHECK (cwd NOT LIKE '%refuse-this-row%')",
    )
    .await;
}

#[tokio::test]
async fn a_new_session_row_the_database_refuses_fails_that_session_alone() {
    refused_row(DaemonOptions::default()).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn on_postgres_a_new_session_row_the_database_refuses_fails_that_session_alone() {
    refused_row(DaemonOptions::default().postgres()).await;
}

/// `session/new` answers before its row commits, and the writer commits the rows queued
/// together in one statement. One of them refused: that session's prompt answers an error
/// and its id ends unknown; the rows queued beside it are kept, one by one.
async fn refused_row(opts: DaemonOptions) {
    let daemon = Daemon::start_with(opts).await;
    let work = daemon.work_dir();
    let mut client = daemon.client().await;
    client.open_session(&work).await; // the schema is in place
    refuse_rows(&daemon.store_url()).await;
    let refused_cwd = work.join(REFUSED_DIR);
    std::fs::create_dir(&refused_cwd).expect("mkdir");

    let cwds = [&work, &work, &refused_cwd, &work, &work];
    let mut ids = Vec::new();
    for cwd in cwds {
        let params = serde_json::json!({ "cwd": cwd, "mcpServers": [] });
        ids.push(client.send_request("session/new", params).await);
    }
    let mut sids = Vec::new();
    for id in &ids {
        let result = client
            .wait_response(id)
            .await
            .expect("answered before the commit");
        sids.push(result["sessionId"].as_str().expect("sessionId").to_owned());
    }
    for (i, sid) in sids.iter().enumerate() {
        let (_, result) = client.prompt(sid, "echo hello").await;
        if i == 2 {
            // Unknown once the session heard of the refusal (it ends then), or the refusal
            // itself when the prompt came first.
            let e = result.expect_err("the refused session's prompt fails");
            let refused = e.message.contains("refused this new session's row");
            assert!(e.code == -32002 || refused, "{e}");
        } else {
            assert_eq!(
                result.expect("a kept session's prompt")["stopReason"],
                "end_turn"
            );
        }
    }

    let mut other = daemon.client().await;
    for (i, sid) in sids.iter().enumerate() {
        let result = other.load(sid, cwds[i]).await.1;
        if i == 2 {
            assert_eq!(result.expect_err("unknown").code, -32002);
        } else {
            result.expect("a kept session loads");
        }
    }
}

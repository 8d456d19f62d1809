//! Store checks of the journal: group commit, flush on close, deletion, compaction, and the
//! writer riding out killed connections.

use std::sync::Arc;

use acpd::compact;
use acpd_store::{Store, StoreError, StoreKind, StoreOptions, Watermark};
use sqlx::{Connection, PgConnection};
use tokio::time::timeout;

use super::{
    WAIT, new_entry, odd_body, on_postgres, open, session, wait_durable, watermark, whole_journal,
};

both!(sqlite_append_10k, postgres_append_10k, check_append_10k);
both!(
    sqlite_close_flushes,
    postgres_close_flushes,
    check_close_flushes
);
both!(
    sqlite_delete_removes_journal,
    postgres_delete_removes_journal,
    check_delete_removes_journal
);
both!(sqlite_compaction, postgres_compaction, check_compaction);
both!(
    sqlite_a_batch_over_many_sessions_raises_every_row,
    postgres_a_batch_over_many_sessions_raises_every_row,
    check_a_batch_over_many_sessions_raises_every_row
);

/// Appends to 700 sessions at once (more than one statement's worth of sessions, 512, in a
/// group commit): every session's row reaches its last seq and its newest entry's time.
async fn check_a_batch_over_many_sessions_raises_every_row(url: String) {
    const SESSIONS: usize = 700;
    const PER: i64 = 3;
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("s{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let store = super::open_with_sessions(&url, &refs).await;
    let sids: Vec<Arc<str>> = ids.iter().map(|s| Arc::from(s.as_str())).collect();
    let marks: Vec<_> = sids.iter().map(|_| watermark()).collect();
    for seq in 1..=PER {
        for (sid, (durable, _)) in sids.iter().zip(&marks) {
            store
                .append(
                    new_entry(sid, seq, "agent_message_chunk", odd_body(seq)),
                    durable.clone(),
                )
                .await
                .expect("append");
        }
    }
    for (_, mut rx) in marks {
        wait_durable(&mut rx, PER).await;
    }
    for id in &ids {
        let row = store.session(id).await.expect("get").expect("exists");
        assert_eq!(
            (row.last_seq, row.updated_at_ms),
            (PER, 1_000 + PER),
            "{id}"
        );
        assert_eq!(whole_journal(&store, id).await.len(), PER as usize, "{id}");
    }
    store.close().await;
}

async fn check_append_10k(url: String) {
    const N: i64 = 10_000;
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let (durable, mut rx) = watermark();
    for seq in 1..=N {
        store
            .append(
                new_entry(&sid, seq, "agent_message_chunk", odd_body(seq)),
                durable.clone(),
            )
            .await
            .expect("append");
    }
    wait_durable(&mut rx, N).await;
    assert_eq!(*rx.borrow(), Watermark::at(N));

    let journal = whole_journal(&store, "s1").await;
    assert_eq!(journal.len(), N as usize);
    for (i, e) in journal.iter().enumerate() {
        let seq = i as i64 + 1;
        assert_eq!(e.seq, seq);
        assert_eq!(*e.body, odd_body(seq), "exact body text");
        assert_eq!(
            (&*e.kind, e.at_ms, &*e.session_id),
            ("agent_message_chunk", 1_000 + seq, "s1")
        );
    }
    let tail = store.journal_after("s1", N - 3, 10).await.expect("tail");
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [N - 2, N - 1, N]
    );
    assert!(
        store
            .journal_after("s1", N, 10)
            .await
            .expect("past end")
            .is_empty()
    );
    let bytes: i64 = (1..=N).map(|s| odd_body(s).len() as i64).sum();
    assert_eq!(store.journal_size("s1").await.expect("size"), (N, bytes));
    let row = store.session("s1").await.expect("get").expect("exists");
    // The commits moved the row along: its last seq, and its activity time (the newest entry's).
    assert_eq!((row.last_seq, row.updated_at_ms), (N, 1_000 + N));
    // Compaction rewrites old entries: it is no activity, and never moves the time back.
    let first = whole_journal(&store, "s1").await.remove(0);
    store
        .replace_journal_range("s1", 1, 1, &[first])
        .await
        .expect("replace");
    let row = store.session("s1").await.expect("get").expect("exists");
    assert_eq!((row.last_seq, row.updated_at_ms), (N, 1_000 + N));
    store.close().await;
}

async fn check_close_flushes(url: String) {
    const N: i64 = 5_000;
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let (durable, rx) = watermark();
    for seq in 1..=N {
        store
            .append(new_entry(&sid, seq, "k", odd_body(seq)), durable.clone())
            .await
            .expect("append");
    }
    timeout(WAIT, store.close()).await.expect("close in time");
    assert_eq!(
        *rx.borrow(),
        Watermark::at(N),
        "close waited for every queued append"
    );
    assert!(matches!(
        store
            .append(new_entry(&sid, N + 1, "k", "{}".into()), durable)
            .await,
        Err(StoreError::Unavailable(_))
    ));

    let store = open(&url).await;
    assert_eq!(whole_journal(&store, "s1").await.len(), N as usize);
    store.close().await;
}

async fn check_delete_removes_journal(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let (durable, mut rx) = watermark();
    for seq in 1..=100 {
        store
            .append(new_entry(&sid, seq, "k", odd_body(seq)), durable.clone())
            .await
            .expect("append");
    }
    wait_durable(&mut rx, 100).await;
    assert!(store.delete_session("s1").await.expect("delete"));
    assert!(
        store
            .journal_after("s1", 0, 1000)
            .await
            .expect("journal")
            .is_empty()
    );
    assert_eq!(store.journal_size("s1").await.expect("size"), (0, 0));

    // Late appends for a deleted session are discarded, and still acknowledged.
    store
        .append(new_entry(&sid, 101, "k", "{}".into()), durable.clone())
        .await
        .expect("late append");
    wait_durable(&mut rx, 101).await;
    assert!(
        store
            .journal_after("s1", 0, 1000)
            .await
            .expect("journal")
            .is_empty()
    );
    store.close().await;
}

fn chunk_body(seq: i64, text: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{{"sessionUpdate":"agent_message_chunk","messageId":"m","content":{{"type":"text","text":"{text}"}}}},"_meta":{{"acpd":{{"seq":{seq}}}}}}}}}"#
    )
}

async fn check_compaction(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let (durable, mut rx) = watermark();
    let tool = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"t1"}}}"#;
    for seq in 1..=20 {
        let entry = if seq == 11 {
            new_entry(&sid, seq, "tool_call", tool.into())
        } else {
            new_entry(
                &sid,
                seq,
                "agent_message_chunk",
                chunk_body(seq, &format!("<{seq}>")),
            )
        };
        store.append(entry, durable.clone()).await.expect("append");
    }
    wait_durable(&mut rx, 20).await;
    let before = store.journal_size("s1").await.expect("size");

    let compacted = compact(&whole_journal(&store, "s1").await);
    assert_eq!(
        compacted.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [10, 11, 20]
    );
    store
        .replace_journal_range("s1", 1, 20, &compacted)
        .await
        .expect("replace");

    let journal = whole_journal(&store, "s1").await;
    assert_eq!(journal, compacted);
    assert_eq!(&*journal[1].body, tool);
    let text: String = (1..=10).map(|s| format!("<{s}>")).collect();
    let merged: serde_json::Value = serde_json::from_str(&journal[0].body).expect("json");
    assert_eq!(merged["params"]["update"]["content"]["text"], text.as_str());
    assert_eq!(
        store
            .session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        20
    );
    let after = store.journal_size("s1").await.expect("size");
    assert!(
        after.0 == 3 && after.1 < before.1,
        "{before:?} -> {after:?}"
    );

    // The journal goes on after the compacted range; resuming inside the range still works.
    store
        .append(
            new_entry(&sid, 21, "agent_message_chunk", chunk_body(21, "x")),
            durable.clone(),
        )
        .await
        .expect("append");
    wait_durable(&mut rx, 21).await;
    let resumed = store.journal_after("s1", 5, 100).await.expect("resume");
    assert_eq!(
        resumed.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [10, 11, 20, 21]
    );
    assert_eq!(
        store
            .session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        21
    );

    // Replacements outside the range, out of order, or for an unknown session are refused.
    let mut outside = journal[0].clone();
    outside.seq = 30;
    assert!(matches!(
        store.replace_journal_range("s1", 1, 20, &[outside]).await,
        Err(StoreError::Conflict(_))
    ));
    let backwards = [journal[1].clone(), journal[0].clone()];
    assert!(matches!(
        store.replace_journal_range("s1", 1, 20, &backwards).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.replace_journal_range("ghost", 1, 20, &[]).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        whole_journal(&store, "s1").await.len(),
        4,
        "refused replacements changed nothing"
    );
    store.close().await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn postgres_writer_survives_terminated_connections() {
    on_postgres(check_terminated_connections).await;
}

/// Kills every store connection over and over while 20 000 appends stream in: whatever the
/// watermark acknowledges is in the journal at that moment, and in the end everything is.
async fn check_terminated_connections(url: String) {
    const N: i64 = 20_000;
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let (durable, mut rx) = watermark();
    let appender = tokio::spawn({
        let store = store.clone();
        async move {
            let sid: Arc<str> = "s1".into();
            for seq in 1..=N {
                store
                    .append(new_entry(&sid, seq, "k", odd_body(seq)), durable.clone())
                    .await
                    .expect("append");
            }
        }
    });

    // This connection survives: the kill spares the backend that sends it.
    let mut admin = PgConnection::connect(&url).await.expect("admin connection");
    let mut kills = 0;
    let mut acked = 0;
    while acked < N {
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&mut admin)
        .await
        .expect("terminate backends");
        kills += killed.iter().filter(|k| **k).count();
        timeout(WAIT, rx.changed())
            .await
            .expect("watermark moves despite the kills")
            .expect("sender alive");
        let now = rx.borrow_and_update().durable;
        assert!(now > acked, "watermark only grows");
        acked = now;
        let present: i64 = sqlx::query_scalar(
            // Entries, not rows: a row holds a pack of them (a batch never splits one).
            "SELECT CAST(COALESCE(SUM(n_entries), 0) AS BIGINT) FROM journal \
             WHERE session_id = 's1' AND seq <= $1",
        )
        .bind(acked)
        .fetch_one(&mut admin)
        .await
        .expect("count");
        assert_eq!(present, acked, "every acknowledged entry is stored");
    }
    timeout(WAIT, appender)
        .await
        .expect("appender done")
        .expect("appender ok");
    assert!(kills >= 3, "the test killed connections ({kills})");

    let journal = whole_journal(&store, "s1").await;
    assert_eq!(journal.len(), N as usize);
    assert!(
        journal
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as i64 + 1 && *e.body == odd_body(e.seq))
    );
    assert_eq!(
        store
            .session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        N
    );
    admin.close().await.ok();
    store.close().await;
}

#[tokio::test]
async fn sqlite_in_memory_and_bad_urls() {
    let store = open("sqlite::memory:").await;
    assert_eq!(store.kind(), StoreKind::Sqlite);
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let (durable, mut rx) = watermark();
    for seq in 1..=100 {
        store
            .append(new_entry(&sid, seq, "k", odd_body(seq)), durable.clone())
            .await
            .expect("append");
    }
    wait_durable(&mut rx, 100).await;
    assert_eq!(whole_journal(&store, "s1").await.len(), 100);
    // Two closes at once: both return only after the flush, neither breaks the other.
    let other = store.clone();
    timeout(WAIT, async { tokio::join!(store.close(), other.close()) })
        .await
        .expect("close in time");

    for bad in ["mysql://localhost/db", "", "file.db"] {
        assert!(
            matches!(
                Store::open(bad, StoreOptions::default()).await,
                Err(StoreError::InvalidUrl(_))
            ),
            "{bad}"
        );
    }
}

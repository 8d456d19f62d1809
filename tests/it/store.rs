//! Store tests: one suite of checks, each run against SQLite and (when a server is named) Postgres.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use acpd::compact;
use acpd_store::{
    DurableSeq, JournalEntry, ListQuery, NewEntry, SessionPatch, SessionRow, Store, StoreError,
    StoreKind, StoreOptions,
};
use sqlx::{Connection, PgConnection, SqliteConnection};
use tokio::sync::watch;
use tokio::time::timeout;

use crate::pgtest::TestDb;

/// Generous: the machine running the suite may be busy with other builds.
const WAIT: Duration = Duration::from_secs(60);

/// Declares the SQLite and the Postgres test of one `check_*(url)`.
macro_rules! both {
    ($sqlite:ident, $postgres:ident, $check:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("data/acpd.db").display());
            $check(url).await;
        }

        #[tokio::test]
        #[cfg_attr(
            not(acpd_pg),
            ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
        )]
        async fn $postgres() {
            on_postgres($check).await;
        }
    };
}

/// Runs a check on a fresh Postgres database and drops it afterwards, also when the check fails.
async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDb::create().await;
    let outcome = tokio::spawn(check(db.url().to_owned())).await;
    db.drop_db().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

both!(
    sqlite_migrations_idempotent,
    postgres_migrations_idempotent,
    check_migrations
);
both!(
    sqlite_schema_too_new,
    postgres_schema_too_new,
    check_schema_too_new
);
both!(
    sqlite_session_crud,
    postgres_session_crud,
    check_session_crud
);
both!(
    sqlite_list_pagination,
    postgres_list_pagination,
    check_list_pagination
);
both!(sqlite_append_10k, postgres_append_10k, check_append_10k);
both!(
    sqlite_unknown_session_append,
    postgres_unknown_session_append,
    check_unknown_session_append
);
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
both!(sqlite_tokens, postgres_tokens, check_tokens);

async fn open(url: &str) -> Store {
    Store::open(url, StoreOptions::default())
        .await
        .expect("open store")
}

fn session(id: &str, principal: &str, cwd: &str, created_at_ms: i64) -> SessionRow {
    SessionRow {
        id: id.to_owned(),
        principal_id: principal.to_owned(),
        agent: "builtin".into(),
        agent_session_id: None,
        cwd: cwd.to_owned(),
        additional_dirs: "[]".into(),
        title: None,
        mode_id: None,
        config_values: "{}".into(),
        meta: "{}".into(),
        created_at_ms,
        updated_at_ms: created_at_ms,
        closed: false,
        last_seq: 0,
        owner_instance: None,
        lease_until_ms: None,
    }
}

fn new_entry(session_id: &Arc<str>, seq: i64, kind: &str, body: String) -> NewEntry {
    NewEntry {
        session_id: session_id.clone(),
        seq,
        kind: kind.into(),
        body: body.into(),
        at_ms: 1_000 + seq,
    }
}

/// A body that must come back byte for byte: odd spacing, escapes, non-ASCII.
fn odd_body(seq: i64) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\", \"method\":\"session/update\",\"params\":{{\"n\": {seq}, \"t\":\"é\\u00e9 \\\"q\\\" ✓\\n\"}} }}"
    )
}

fn watermark() -> (Arc<DurableSeq>, watch::Receiver<i64>) {
    let (tx, rx) = watch::channel(0);
    (Arc::new(tx), rx)
}

async fn wait_durable(rx: &mut watch::Receiver<i64>, seq: i64) {
    timeout(WAIT, rx.wait_for(|v| *v >= seq))
        .await
        .expect("watermark reached in time")
        .expect("watermark sender alive");
}

/// All of a session's journal, read in pages.
async fn whole_journal(store: &Store, session_id: &str) -> Vec<JournalEntry> {
    let mut all: Vec<JournalEntry> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.seq);
        let page = store
            .journal_after(session_id, after, 1000)
            .await
            .expect("journal_after");
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Runs one statement on the store's database, outside the store.
async fn raw(url: &str, sql: &'static str) {
    raw_per_backend(url, sql, sql).await;
}

async fn raw_per_backend(url: &str, sqlite: &'static str, postgres: &'static str) {
    if url.starts_with("sqlite:") {
        let mut conn = SqliteConnection::connect(url)
            .await
            .expect("connect sqlite");
        sqlx::query(sqlite)
            .execute(&mut conn)
            .await
            .expect("raw sql");
    } else {
        let mut conn = PgConnection::connect(url).await.expect("connect postgres");
        sqlx::query(postgres)
            .execute(&mut conn)
            .await
            .expect("raw sql");
    }
}

async fn check_migrations(url: String) {
    let v1 = Store::migrate(&url).await.expect("first migrate");
    assert!(v1 >= 1);
    assert_eq!(Store::migrate(&url).await.expect("second migrate"), v1);

    let store = open(&url).await;
    let expected = if url.starts_with("sqlite:") {
        StoreKind::Sqlite
    } else {
        StoreKind::Postgres
    };
    assert_eq!(store.kind(), expected);
    store.ping().await.expect("ping");
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 5))
        .await
        .expect("insert");
    store.close().await;

    assert_eq!(Store::migrate(&url).await.expect("migrate after use"), v1);
    let store = open(&url).await;
    let row = store
        .session("s1")
        .await
        .expect("session")
        .expect("survives reopen");
    assert_eq!(row.cwd, "/w");
    store.close().await;
}

async fn check_schema_too_new(url: String) {
    open(&url).await.close().await;
    raw_per_backend(
        &url,
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', TRUE, X'00', 0)",
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99990101000000, 'from the future', TRUE, '\\x00'::bytea, 0)",
    )
    .await;
    match Store::open(&url, StoreOptions::default()).await {
        Err(StoreError::SchemaTooNew { found, known }) => {
            assert_eq!(found, 99990101000000);
            assert!(known >= 1 && known < found);
        }
        Err(e) => panic!("expected SchemaTooNew, got {e}"),
        Ok(_) => panic!("expected SchemaTooNew, the store opened"),
    }
    assert!(matches!(
        Store::migrate(&url).await,
        Err(StoreError::SchemaTooNew { .. })
    ));

    // A journal format newer than this build is refused the same way.
    raw(
        &url,
        "DELETE FROM _sqlx_migrations WHERE version = 99990101000000",
    )
    .await;
    raw(
        &url,
        "UPDATE meta SET value = '2' WHERE key = 'journal_format'",
    )
    .await;
    assert!(matches!(
        Store::open(&url, StoreOptions::default()).await,
        Err(StoreError::SchemaTooNew { found: 2, known: 1 })
    ));
}

async fn check_session_crud(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    let mut row = session("s1", &p.id, "/work", 100);
    row.agent_session_id = Some("agent-1".into());
    row.mode_id = Some("ask".into());
    row.title = Some("first".into());
    row.meta = r#"{"modes":{"currentModeId":"ask"}}"#.into();
    store.insert_session(&row).await.expect("insert");
    assert_eq!(store.session("s1").await.expect("get").as_ref(), Some(&row));
    assert!(store.session("nope").await.expect("get unknown").is_none());
    assert!(matches!(
        store.insert_session(&row).await,
        Err(StoreError::Conflict(_))
    ));

    let patch = SessionPatch {
        title: Some(Some("renamed".into())),
        mode_id: Some(None),
        closed: Some(true),
        config_values: Some(r#"{"model":"x"}"#.into()),
        owner_instance: Some(Some("replica-a".into())),
        lease_until_ms: Some(Some(9_000)),
        updated_at_ms: 200,
        ..Default::default()
    };
    store.update_session("s1", &patch).await.expect("update");
    let expected = SessionRow {
        title: Some("renamed".into()),
        mode_id: None,
        closed: true,
        config_values: r#"{"model":"x"}"#.into(),
        owner_instance: Some("replica-a".into()),
        lease_until_ms: Some(9_000),
        updated_at_ms: 200,
        ..row.clone()
    };
    assert_eq!(
        store.session("s1").await.expect("get").as_ref(),
        Some(&expected)
    );

    // An empty patch only bumps updated_at_ms.
    let bump = SessionPatch {
        updated_at_ms: 300,
        ..Default::default()
    };
    store.update_session("s1", &bump).await.expect("bump");
    let after = store.session("s1").await.expect("get").expect("exists");
    assert_eq!(
        after,
        SessionRow {
            updated_at_ms: 300,
            ..expected
        }
    );
    assert!(matches!(
        store.update_session("nope", &bump).await,
        Err(StoreError::Conflict(_))
    ));

    store.put_agent_state("s1", "k", "v1").await.expect("put");
    store
        .put_agent_state("s1", "k", "v2")
        .await
        .expect("overwrite");
    assert_eq!(
        store.agent_state("s1", "k").await.expect("get").as_deref(),
        Some("v2")
    );
    assert_eq!(store.agent_state("s1", "other").await.expect("get"), None);
    assert!(matches!(
        store.put_agent_state("nope", "k", "v").await,
        Err(StoreError::Conflict(_))
    ));

    assert!(store.delete_session("s1").await.expect("delete"));
    assert!(store.session("s1").await.expect("get deleted").is_none());
    assert!(!store.delete_session("s1").await.expect("delete again"));
    assert!(!store.delete_session("nope").await.expect("delete unknown"));
    assert_eq!(store.agent_state("s1", "k").await.expect("get"), None);
    assert!(matches!(
        store.update_session("s1", &bump).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.put_agent_state("s1", "k", "v").await,
        Err(StoreError::Conflict(_))
    ));
    // The id of a deleted session is never handed out again.
    assert!(matches!(
        store.insert_session(&row).await,
        Err(StoreError::Conflict(_))
    ));
    let q = ListQuery {
        principal_id: p.id.clone(),
        cwd: None,
        cursor: None,
        limit: 10,
    };
    assert!(
        store
            .list_sessions(&q)
            .await
            .expect("list")
            .sessions
            .is_empty()
    );
    store.close().await;
}

/// Every page of a listing, in order.
async fn list_all(store: &Store, q: &ListQuery) -> Vec<SessionRow> {
    let mut q = q.clone();
    let mut all = Vec::new();
    loop {
        let page = store.list_sessions(&q).await.expect("list page");
        assert!(page.sessions.len() <= q.limit as usize);
        all.extend(page.sessions);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => return all,
        }
    }
}

async fn check_list_pagination(url: String) {
    let store = open(&url).await;
    let alice = store.ensure_principal("alice").await.expect("alice").id;
    let bob = store.ensure_principal("bob").await.expect("bob").id;
    // Ties in created_at_ms on purpose: the id breaks them.
    let mut initial = HashSet::new();
    for i in 0..30 {
        let id = format!("a{i:02}");
        let cwd = if i % 2 == 0 { "/even" } else { "/odd" };
        store
            .insert_session(&session(&id, &alice, cwd, 1_000 + i / 3))
            .await
            .expect("insert");
        initial.insert(id);
    }
    for i in 0..5 {
        store
            .insert_session(&session(&format!("b{i}"), &bob, "/even", 1_000 + i))
            .await
            .expect("insert");
    }

    let mut q = ListQuery {
        principal_id: alice.clone(),
        cwd: None,
        cursor: None,
        limit: 7,
    };
    let mut listed = Vec::new();
    for page_no in 0_i64.. {
        let page = store.list_sessions(&q).await.expect("list page");
        assert!(page.sessions.len() <= 7);
        listed.extend(page.sessions);
        let Some(cursor) = page.next_cursor else {
            break;
        };
        q.cursor = Some(cursor);
        // Newer, older and tied sessions appear, and listed ones are updated, between pages.
        for (n, created) in [(0, 5_000 + page_no), (1, 1_004), (2, 999 - page_no)] {
            let row = session(&format!("new{page_no}-{n}"), &alice, "/even", created);
            store
                .insert_session(&row)
                .await
                .expect("insert between pages");
        }
        let patch = SessionPatch {
            title: Some(Some("touched".into())),
            updated_at_ms: 9_999_999,
            ..Default::default()
        };
        for id in ["a00", "a15", "a29"] {
            store
                .update_session(id, &patch)
                .await
                .expect("update between pages");
        }
    }
    q.cursor = None;
    let ids: Vec<&str> = listed.iter().map(|s| s.id.as_str()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "no session listed twice: {ids:?}");
    for id in &initial {
        assert!(unique.contains(id.as_str()), "{id} missing from {ids:?}");
    }
    assert!(
        listed.iter().all(|s| s.principal_id == alice),
        "only alice's sessions"
    );
    let keys: Vec<(i64, &str)> = listed
        .iter()
        .map(|s| (s.created_at_ms, s.id.as_str()))
        .collect();
    assert!(
        keys.windows(2).all(|w| w[0] > w[1]),
        "newest first: {keys:?}"
    );

    // cwd filter, across pages.
    let q_odd = ListQuery {
        cwd: Some("/odd".into()),
        limit: 4,
        ..q.clone()
    };
    let odd = list_all(&store, &q_odd).await;
    let odd_ids: HashSet<String> = odd.into_iter().map(|s| s.id).collect();
    let expected: HashSet<String> = (0..30)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("a{i:02}"))
        .collect();
    assert_eq!(odd_ids, expected);

    // Bob sees his five, nothing else.
    let q_bob = ListQuery {
        principal_id: bob.clone(),
        cwd: None,
        cursor: None,
        limit: 100,
    };
    let page = store.list_sessions(&q_bob).await.expect("bob");
    let bob_ids: Vec<&str> = page.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(bob_ids, ["b4", "b3", "b2", "b1", "b0"]);
    assert!(page.next_cursor.is_none());

    for bad in ["not-hex!", "abc", "zz", "3132"] {
        let q_bad = ListQuery {
            cursor: Some(bad.into()),
            ..q.clone()
        };
        assert!(
            matches!(
                store.list_sessions(&q_bad).await,
                Err(StoreError::InvalidCursor)
            ),
            "{bad}"
        );
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
    assert_eq!(*rx.borrow(), N);

    let journal = whole_journal(&store, "s1").await;
    assert_eq!(journal.len(), N as usize);
    for (i, e) in journal.iter().enumerate() {
        let seq = i as i64 + 1;
        assert_eq!(e.seq, seq);
        assert_eq!(e.body, odd_body(seq), "exact body text");
        assert_eq!(
            (e.kind.as_str(), e.at_ms, e.session_id.as_str()),
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
    assert_eq!(
        store
            .session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        N
    );
    store.close().await;
}

async fn check_unknown_session_append(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let (ghost_durable, ghost_rx) = watermark();
    store
        .append(
            new_entry(&"ghost".into(), 1, "k", "{}".into()),
            ghost_durable,
        )
        .await
        .expect("append");
    let sid: Arc<str> = "s1".into();
    let (durable, mut rx) = watermark();
    for seq in 1..=10 {
        store
            .append(
                new_entry(&sid, seq, "k", format!("{{\"n\":{seq}}}")),
                durable.clone(),
            )
            .await
            .expect("append");
    }
    // The writer works in order, so once s1 is durable the ghost entry has been dealt with:
    // rejected and not acknowledged, without holding back its neighbours.
    wait_durable(&mut rx, 10).await;
    assert_eq!(*ghost_rx.borrow(), 0);
    assert_eq!(whole_journal(&store, "s1").await.len(), 10);
    assert!(
        store
            .journal_after("ghost", 0, 10)
            .await
            .expect("ghost journal")
            .is_empty()
    );
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
    assert_eq!(*rx.borrow(), N, "close waited for every queued append");
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
    assert_eq!(journal[1].body, tool);
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

async fn check_tokens(url: String) {
    let store = open(&url).await;
    let alice = store.ensure_principal("alice").await.expect("principal");
    assert_eq!(
        store.ensure_principal("alice").await.expect("again").id,
        alice.id
    );
    assert_ne!(
        store.ensure_principal("bob").await.expect("bob").id,
        alice.id
    );

    let t = store
        .insert_token(&alice.id, "laptop", "hash-1")
        .await
        .expect("insert token");
    assert_eq!(
        (
            t.principal_id.as_str(),
            t.name.as_str(),
            t.revoked,
            t.last_used_ms
        ),
        (alice.id.as_str(), "laptop", false, None)
    );
    assert!(matches!(
        store.insert_token(&alice.id, "dup", "hash-1").await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store.insert_token("nobody", "x", "hash-2").await,
        Err(StoreError::Conflict(_))
    ));

    let (found, principal) = store
        .token_by_hash("hash-1")
        .await
        .expect("lookup")
        .expect("live token");
    assert_eq!(
        (
            found.id.as_str(),
            principal.id.as_str(),
            principal.name.as_str()
        ),
        (t.id.as_str(), alice.id.as_str(), "alice")
    );
    assert!(found.last_used_ms.is_some(), "lookup marks the token used");
    assert!(
        store
            .token_by_hash("hash-unknown")
            .await
            .expect("lookup")
            .is_none()
    );

    let listed = store.list_tokens().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].last_used_ms.is_some());

    assert!(store.revoke_token(&t.id).await.expect("revoke"));
    assert!(!store.revoke_token(&t.id).await.expect("revoke again"));
    assert!(!store.revoke_token("unknown").await.expect("revoke unknown"));
    assert!(
        store
            .token_by_hash("hash-1")
            .await
            .expect("lookup")
            .is_none()
    );
    assert!(store.list_tokens().await.expect("list")[0].revoked);
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
        let now = *rx.borrow_and_update();
        assert!(now > acked, "watermark only grows");
        acked = now;
        let present: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM journal WHERE session_id = 's1' AND seq <= $1",
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
            .all(|(i, e)| e.seq == i as i64 + 1 && e.body == odd_body(e.seq))
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

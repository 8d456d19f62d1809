//! Store checks of sessions, listing, migrations and tokens.

use std::collections::HashSet;

use acpd_store::{ListQuery, SessionPatch, SessionRow, Store, StoreError, StoreKind, StoreOptions};

use super::{on_postgres, open, raw, raw_per_backend, session};

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
both!(sqlite_tokens, postgres_tokens, check_tokens);

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
        "UPDATE meta SET value = '4' WHERE key = 'journal_format'",
    )
    .await;
    assert!(matches!(
        Store::open(&url, StoreOptions::default()).await,
        Err(StoreError::SchemaTooNew { found: 4, known: 3 })
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
        agent: None,
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
        agent: None,
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
        agent: None,
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
        agent: None,
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
            agent: None,
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

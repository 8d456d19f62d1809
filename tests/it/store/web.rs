//! Store checks of the web console's rows: one-time codes (single use, expiry), cookie
//! credentials (expiry, the token they came from, revocation, sign-out), and the journal read
//! backwards that its pages use.

use std::sync::Arc;

use acpd_store::WebSessionRow;

use super::{new_entry, odd_body, on_postgres, open, session, wait_durable, watermark};

both!(sqlite_web_logins, postgres_web_logins, check_web_logins);
both!(
    sqlite_web_sessions,
    postgres_web_sessions,
    check_web_sessions
);
both!(
    sqlite_journal_before,
    postgres_journal_before,
    check_journal_before
);

fn now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn check_web_logins(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("alice");
    store
        .insert_web_login("h1", &p.id, now() + 60_000)
        .await
        .expect("insert");
    store
        .insert_web_login("h2", &p.id, now() - 1)
        .await
        .expect("insert an expired one");
    assert_eq!(
        store.take_web_login("h1").await.expect("take"),
        Some(p.id.clone())
    );
    assert_eq!(
        store.take_web_login("h1").await.expect("again"),
        None,
        "single use"
    );
    assert_eq!(store.take_web_login("h2").await.expect("expired"), None);
    assert_eq!(store.take_web_login("nope").await.expect("unknown"), None);
    assert!(
        store
            .insert_web_login("h3", "no-such-principal", now() + 1)
            .await
            .is_err()
    );
    store.close().await;
}

fn web(hash: &str, principal: &str, token: Option<&str>, expires_at_ms: i64) -> WebSessionRow {
    WebSessionRow {
        hash: hash.into(),
        principal_id: principal.into(),
        token_id: token.map(str::to_owned),
        created_at_ms: now(),
        expires_at_ms,
    }
}

async fn check_web_sessions(url: String) {
    let store = open(&url).await;
    let alice = store.ensure_principal("alice").await.expect("alice");
    let bob = store.ensure_principal("bob").await.expect("bob");
    let a_token = store
        .insert_token(&alice.id, "alice", "ta")
        .await
        .expect("token");
    let b_token = store
        .insert_token(&bob.id, "bob", "tb")
        .await
        .expect("token");
    let later = now() + 60_000;
    for row in [
        web("from-token", &alice.id, Some(&a_token.id), later),
        web("from-code", &alice.id, None, later),
        web("expired", &alice.id, None, now() - 1),
        web("bobs", &bob.id, Some(&b_token.id), later),
        web("bobs-code", &bob.id, None, later),
    ] {
        store.insert_web_session(&row).await.expect("insert");
    }
    let live = |h: &'static str| {
        let store = store.clone();
        async move {
            store
                .web_session(h)
                .await
                .expect("lookup")
                .map(|(w, p)| (w.token_id, p.name))
        }
    };
    assert_eq!(
        live("from-token").await,
        Some((Some(a_token.id.clone()), "alice".into()))
    );
    assert_eq!(live("from-code").await, Some((None, "alice".into())));
    assert_eq!(live("expired").await, None);
    // A revoked token ends the sessions made from it at their next lookup…
    assert!(store.revoke_token(&a_token.id).await.expect("revoke"));
    assert_eq!(live("from-token").await, None);
    // …and revoking it through the web sessions removes its principal's code-made ones too.
    assert_eq!(
        store
            .revoke_web_sessions(&a_token.id)
            .await
            .expect("revoke web"),
        2
    );
    assert_eq!(live("from-code").await, None);
    assert!(live("bobs").await.is_some() && live("bobs-code").await.is_some());
    assert!(store.delete_web_session("bobs").await.expect("sign out"));
    assert!(!store.delete_web_session("bobs").await.expect("twice"));
    assert_eq!(live("bobs").await, None);
    store.close().await;
}

async fn check_journal_before(url: String) {
    let store = open(&url).await;
    store
        .insert_session(&session("s", "alice", "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = Arc::from("s");
    let (durable, mut rx) = watermark();
    for seq in 1..=25 {
        let entry = new_entry(&sid, seq, "agent_message_chunk", odd_body(seq));
        store.append(entry, durable.clone()).await.expect("append");
    }
    wait_durable(&mut rx, 25).await;
    let seqs = |v: Vec<acpd_store::JournalEntry>| v.into_iter().map(|e| e.seq).collect::<Vec<_>>();
    let newest = store
        .journal_before("s", i64::MAX, 10)
        .await
        .expect("newest");
    assert_eq!(seqs(newest), (16..=25).collect::<Vec<_>>());
    let before = store.journal_before("s", 16, 10).await.expect("before");
    assert_eq!(seqs(before), (6..=15).collect::<Vec<_>>());
    let first = store.journal_before("s", 6, 10).await.expect("the start");
    assert_eq!(seqs(first), (1..=5).collect::<Vec<_>>());
    let body = store.journal_before("s", 2, 1).await.expect("one")[0]
        .body
        .clone();
    assert_eq!(*body, odd_body(1), "bodies come back byte for byte");
    assert!(
        store
            .journal_before("s", 1, 10)
            .await
            .expect("none")
            .is_empty()
    );
    store.close().await;
}

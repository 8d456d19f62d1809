//! Store checks of session leases (several replicas): one owner at a time, a new epoch per
//! acquisition, renewal and release by the owner only, and fencing: an append under a stale
//! epoch is refused in its own transaction and nothing of it is stored.

use std::sync::Arc;

use acpd_store::Acquired;

use super::{
    new_entry, on_postgres, open, session, wait_durable, wait_stopped, watermark, whole_journal,
};

both!(
    sqlite_a_lease_has_one_owner_and_a_new_epoch_per_acquisition,
    postgres_a_lease_has_one_owner_and_a_new_epoch_per_acquisition,
    check_one_owner
);
both!(
    sqlite_an_append_under_a_stale_epoch_is_fenced,
    postgres_an_append_under_a_stale_epoch_is_fenced,
    check_fencing
);

async fn check_one_owner(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    assert_eq!(
        store.acquire_lease("nope", "a", 60_000).await.unwrap(),
        Acquired::Missing
    );
    store
        .replica_heartbeat("a", Some("ws://a:7420"))
        .await
        .unwrap();
    assert_eq!(
        store.acquire_lease("s1", "a", 60_000).await.unwrap(),
        Acquired::Owned { epoch: 1 }
    );
    // B is refused while A's lease lives, and told where A is.
    match store.acquire_lease("s1", "b", 60_000).await.unwrap() {
        Acquired::Held {
            owner,
            advertise_url,
            expires_in_ms,
        } => {
            assert_eq!(owner, "a");
            assert_eq!(advertise_url.as_deref(), Some("ws://a:7420"));
            assert!(
                expires_in_ms > 0 && expires_in_ms <= 60_000,
                "{expires_in_ms}"
            );
        }
        other => panic!("expected Held, got {other:?}"),
    }
    // Renewal keeps it; B's renewal of a lease it does not hold loses it.
    let held = [("s1".to_owned(), 1)];
    assert!(
        store
            .renew_leases("a", &held, 60_000)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.renew_leases("b", &held, 60_000).await.unwrap(),
        vec!["s1".to_owned()]
    );
    // Only the owner under its epoch gives it back; then B takes it under a new epoch.
    assert!(!store.release_lease("s1", "b", 1).await.unwrap());
    assert!(!store.release_lease("s1", "a", 7).await.unwrap());
    assert!(store.release_lease("s1", "a", 1).await.unwrap());
    assert_eq!(
        store.acquire_lease("s1", "b", 60_000).await.unwrap(),
        Acquired::Owned { epoch: 2 }
    );
    // An expired lease is anybody's.
    assert!(store.release_lease("s1", "b", 2).await.unwrap());
    assert_eq!(
        store.acquire_lease("s1", "b", 1).await.unwrap(),
        Acquired::Owned { epoch: 3 }
    );
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        store.acquire_lease("s1", "a", 60_000).await.unwrap(),
        Acquired::Owned { epoch: 4 }
    );
    // B, which lost it, renews nothing.
    assert_eq!(
        store
            .renew_leases("b", &[("s1".to_owned(), 3)], 60_000)
            .await
            .unwrap(),
        vec!["s1".to_owned()]
    );
    store.close().await;
}

async fn check_fencing(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let Acquired::Owned { epoch: old } = store.acquire_lease("s1", "a", 1).await.unwrap() else {
        panic!("a owns the fresh session");
    };
    let (durable_a, mut rx_a) = watermark();
    let entry = |seq: i64, body: &str, epoch: i64| {
        let mut e = new_entry(&sid, seq, "k", body.to_owned());
        e.epoch = Some(epoch);
        e
    };
    store
        .append(entry(1, "{\"by\":\"a\"}", old), durable_a.clone())
        .await
        .unwrap();
    wait_durable(&mut rx_a, 1).await;
    // A's lease expires; B takes the session over.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let Acquired::Owned { epoch: new } = store.acquire_lease("s1", "b", 60_000).await.unwrap()
    else {
        panic!("b takes the expired lease");
    };
    assert!(new > old);
    // A, unaware, appends under its old epoch: refused, marked fenced, nothing stored.
    store
        .append(entry(2, "{\"by\":\"a-late\"}", old), durable_a.clone())
        .await
        .unwrap();
    let stopped = wait_stopped(&mut rx_a).await;
    assert_eq!(stopped.durable, 1);
    assert_eq!(stopped.rejected, Some(2));
    assert!(stopped.fenced, "{stopped:?}");
    // B writes seq 2 under its epoch.
    let (durable_b, mut rx_b) = watermark();
    store
        .append(entry(2, "{\"by\":\"b\"}", new), durable_b)
        .await
        .unwrap();
    wait_durable(&mut rx_b, 2).await;
    let bodies: Vec<String> = whole_journal(&store, "s1")
        .await
        .into_iter()
        .map(|e| e.body.to_string())
        .collect();
    assert_eq!(bodies, ["{\"by\":\"a\"}", "{\"by\":\"b\"}"]);
    store.close().await;
}

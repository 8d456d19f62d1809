//! Store checks of session grants (shared sessions): grant, renew, revoke, the revocation
//! poll, principals by name.

use super::{on_postgres, open, session};

both!(sqlite_grants, postgres_grants, check_grants);

async fn check_grants(url: String) {
    let store = open(&url).await;
    let alice = store.ensure_principal("alice").await.expect("alice");
    let bob = store.ensure_principal("bob").await.expect("bob");
    store
        .insert_session(&session("s1", &alice.id, "/w", 1))
        .await
        .expect("insert");
    assert_eq!(
        store
            .principal_by_name("bob")
            .await
            .expect("by name")
            .map(|p| p.id),
        Some(bob.id.clone())
    );
    assert!(
        store
            .principal_by_name("carol")
            .await
            .expect("by name")
            .is_none()
    );
    assert!(
        store
            .live_grant("s1", &bob.id)
            .await
            .expect("read")
            .is_none()
    );

    store
        .grant("s1", &bob.id, "observer", &alice.id)
        .await
        .expect("grant");
    let g = store
        .live_grant("s1", &bob.id)
        .await
        .expect("read")
        .expect("live");
    assert_eq!(
        (g.role.as_str(), g.granted_by.as_str()),
        ("observer", alice.id.as_str())
    );
    // Granting again renews it with the new role.
    store
        .grant("s1", &bob.id, "controller", &alice.id)
        .await
        .expect("grant again");
    let g = store
        .live_grant("s1", &bob.id)
        .await
        .expect("read")
        .expect("live");
    assert_eq!(g.role, "controller");

    let before = g.created_at_ms - 1;
    assert!(store.revoke_grant("s1", &bob.id).await.expect("revoke"));
    assert!(
        !store
            .revoke_grant("s1", &bob.id)
            .await
            .expect("revoke twice")
    );
    assert!(
        store
            .live_grant("s1", &bob.id)
            .await
            .expect("read")
            .is_none()
    );
    let revoked = store.grants_revoked_after(before).await.expect("poll");
    assert_eq!(revoked.len(), 1);
    assert_eq!(revoked[0].principal_id, bob.id);
    let at = revoked[0].revoked_at_ms.expect("revoked_at_ms");
    assert!(
        store
            .grants_revoked_after(at)
            .await
            .expect("poll")
            .is_empty()
    );
    // The row stays (audit); a new grant revives it.
    assert_eq!(store.grants_of("s1").await.expect("all").len(), 1);
    store
        .grant("s1", &bob.id, "observer", &alice.id)
        .await
        .expect("grant after revoke");
    assert!(
        store
            .live_grant("s1", &bob.id)
            .await
            .expect("read")
            .is_some()
    );
    store.close().await;
}

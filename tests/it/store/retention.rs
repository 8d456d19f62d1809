//! Store checks of `trim_journal`: the oldest entries go until both caps hold, counted and
//! summed in the database.

use std::sync::Arc;

use super::{new_entry, on_postgres, open, session, wait_durable, watermark, whole_journal};

both!(
    sqlite_trim_keeps_the_newest_within_both_caps,
    postgres_trim_keeps_the_newest_within_both_caps,
    check_trim
);

async fn check_trim(url: String) {
    const N: i64 = 300;
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    for id in ["s1", "s2"] {
        store
            .insert_session(&session(id, &p.id, "/w", 1))
            .await
            .expect("insert");
    }
    // Bodies of growing length, so the byte cap cuts somewhere else than the count cap.
    let body = |seq: i64| format!("{{\"n\":\"{}\"}}", "x".repeat(seq as usize % 50));
    let (s1, s2): (Arc<str>, Arc<str>) = ("s1".into(), "s2".into());
    let (d1, mut rx1) = watermark();
    let (d2, mut rx2) = watermark();
    for seq in 1..=N {
        store
            .append(new_entry(&s1, seq, "k", body(seq)), d1.clone())
            .await
            .expect("append");
        store
            .append(new_entry(&s2, seq, "k", body(seq)), d2.clone())
            .await
            .expect("append");
    }
    wait_durable(&mut rx1, N).await;
    wait_durable(&mut rx2, N).await;
    let seqs = |j: Vec<acpd_store::JournalEntry>| j.iter().map(|e| e.seq).collect::<Vec<_>>();

    // No cap, or caps already met: nothing goes.
    assert_eq!(store.trim_journal("s1", 0, 0).await.expect("trim"), 0);
    assert_eq!(
        store.trim_journal("s1", 1000, 1 << 30).await.expect("trim"),
        0
    );
    assert_eq!(store.trim_journal("ghost", 1, 1).await.expect("trim"), 0);

    // The count cap alone.
    assert_eq!(store.trim_journal("s1", 250, 0).await.expect("trim"), 50);
    assert_eq!(
        seqs(whole_journal(&store, "s1").await),
        (51..=N).collect::<Vec<_>>()
    );

    // The byte cap alone: the newest entries whose bodies sum to at most the cap remain.
    let cap: u64 = (201..=N).map(|s| body(s).len() as u64).sum::<u64>() + 3;
    assert_eq!(store.trim_journal("s1", 0, cap).await.expect("trim"), 150);
    assert_eq!(
        seqs(whole_journal(&store, "s1").await),
        (201..=N).collect::<Vec<_>>()
    );
    assert!(store.journal_size("s1").await.expect("size").1 as u64 <= cap);

    // Both caps: whichever cuts deeper wins.
    assert_eq!(store.trim_journal("s1", 40, cap).await.expect("trim"), 60);
    assert_eq!(
        seqs(whole_journal(&store, "s1").await),
        (261..=N).collect::<Vec<_>>()
    );

    // An entry alone over the byte cap goes too; the other session is untouched.
    assert_eq!(store.trim_journal("s1", 0, 1).await.expect("trim"), 40);
    assert!(whole_journal(&store, "s1").await.is_empty());
    assert_eq!(whole_journal(&store, "s2").await.len() as i64, N);
    assert_eq!(
        store
            .session("s1")
            .await
            .expect("get")
            .expect("exists")
            .last_seq,
        N,
        "last_seq never goes down, so no seq is handed out twice"
    );
    store.close().await;
}

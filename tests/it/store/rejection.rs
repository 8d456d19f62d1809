//! Store checks of entries the database rejects: the session's watermark stops below the
//! rejected entry and says so, nothing after it goes in, and other sessions go on.

use std::sync::Arc;

use acpd_store::Watermark;

use super::{
    new_entry, on_postgres, open, raw_per_backend, session, wait_durable, wait_stopped, watermark,
    whole_journal,
};

both!(
    sqlite_unknown_session_append_stops_its_watermark,
    postgres_unknown_session_append_stops_its_watermark,
    check_unknown_session_append
);
both!(
    sqlite_second_writer_at_a_taken_seq_is_refused_not_dropped,
    postgres_second_writer_at_a_taken_seq_is_refused_not_dropped,
    check_second_writer
);
both!(
    sqlite_rejected_entry_stops_its_sessions_watermark,
    postgres_rejected_entry_stops_its_sessions_watermark,
    check_rejected_entry
);

async fn check_unknown_session_append(url: String) {
    let store = open(&url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    store
        .insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let (ghost_durable, mut ghost_rx) = watermark();
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
    // Rejected and reported, without holding back its neighbours.
    wait_durable(&mut rx, 10).await;
    assert_eq!(
        wait_stopped(&mut ghost_rx).await,
        Watermark {
            durable: 0,
            rejected: Some(1),
            fenced: false
        }
    );
    assert_eq!(*rx.borrow(), Watermark::at(10));
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

/// A constraint of the test's own refuses one entry of s1 in the middle of a stream that
/// interleaves s1 and s2: s1's watermark stops right below it and nothing of s1 after it is
/// stored, while s2 is stored whole. s1 opened again (a fresh watch) goes on from there.
async fn check_rejected_entry(url: String) {
    const N: i64 = 200;
    const BAD: i64 = 77;
    let store = open(&url).await;
    raw_per_backend(
        &url,
        "CREATE TRIGGER test_reject BEFORE INSERT ON journal WHEN NEW.body LIKE '%REJECT-ME%' \
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
        "ALTER TABLE journal ADD CONSTRAINT test_reject CHECK (body NOT LIKE '%REJECT-ME%')",
    )
    .await;
    let p = store.ensure_principal("alice").await.expect("principal");
    for id in ["s1", "s2"] {
        store
            .insert_session(&session(id, &p.id, "/w", 1))
            .await
            .expect("insert");
    }
    let (s1, s2): (Arc<str>, Arc<str>) = ("s1".into(), "s2".into());
    let (d1, mut rx1) = watermark();
    let (d2, mut rx2) = watermark();
    for seq in 1..=N {
        let body = if seq == BAD {
            "{\"t\":\"REJECT-ME\"}".to_owned()
        } else {
            format!("{{\"n\":{seq}}}")
        };
        store
            .append(new_entry(&s1, seq, "k", body), d1.clone())
            .await
            .expect("append s1");
        store
            .append(
                new_entry(&s2, seq, "k", format!("{{\"n\":{seq}}}")),
                d2.clone(),
            )
            .await
            .expect("append s2");
    }
    wait_durable(&mut rx2, N).await;
    let stopped = wait_stopped(&mut rx1).await;
    assert_eq!(
        stopped,
        Watermark {
            durable: BAD - 1,
            rejected: Some(BAD),
            fenced: false
        }
    );
    let seqs = |j: Vec<acpd_store::JournalEntry>| j.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(whole_journal(&store, "s1").await),
        (1..BAD).collect::<Vec<_>>(),
        "s1 is stored up to the rejected entry and not past it"
    );
    assert_eq!(
        seqs(whole_journal(&store, "s2").await),
        (1..=N).collect::<Vec<_>>()
    );
    let last_seq = |row: Option<acpd_store::SessionRow>| row.expect("exists").last_seq;
    assert_eq!(last_seq(store.session("s1").await.expect("get")), BAD - 1);

    // Appends through the stopped watch are not written, and never acknowledged.
    store
        .append(new_entry(&s1, N + 1, "k", "{}".into()), d1.clone())
        .await
        .expect("append");
    store
        .append(new_entry(&s2, N + 1, "k", "{}".into()), d2.clone())
        .await
        .expect("append");
    wait_durable(&mut rx2, N + 1).await;
    assert_eq!(*rx1.borrow(), stopped);
    assert_eq!(whole_journal(&store, "s1").await.len() as i64, BAD - 1);

    // The session opened again: a fresh watch from its row's last_seq takes the next seq.
    let (d1, mut rx1) = acpd_store::watermark(BAD - 1);
    store
        .append(new_entry(&s1, BAD, "k", "{\"ok\":true}".into()), d1)
        .await
        .expect("append");
    wait_durable(&mut rx1, BAD).await;
    assert_eq!(
        seqs(whole_journal(&store, "s1").await),
        (1..=BAD).collect::<Vec<_>>()
    );
    store.close().await;
}

/// Two stores on one database (two acpd on one store): the second writes a session the first
/// already wrote. The same entries again are a retried batch and go through; a different entry
/// at a taken seq is refused (its watermark stops there) instead of skipped and called
/// durable, and the first writer's entry stays as it was.
async fn check_second_writer(url: String) {
    let a = open(&url).await;
    let b = open(&url).await;
    let p = a.ensure_principal("alice").await.expect("principal");
    a.insert_session(&session("s1", &p.id, "/w", 1))
        .await
        .expect("insert");
    let sid: Arc<str> = "s1".into();
    let body = |seq: i64| format!("{{\"n\":{seq}}}");
    let (da, mut rxa) = watermark();
    for seq in 1..=5 {
        a.append(new_entry(&sid, seq, "k", body(seq)), da.clone())
            .await
            .expect("append a");
    }
    wait_durable(&mut rxa, 5).await;
    let (db, mut rxb) = watermark();
    for seq in 1..=3 {
        b.append(new_entry(&sid, seq, "k", body(seq)), db.clone())
            .await
            .expect("append b");
    }
    wait_durable(&mut rxb, 3).await;
    for seq in 4..=6 {
        b.append(
            new_entry(&sid, seq, "k", format!("{{\"from\":\"b\",\"n\":{seq}}}")),
            db.clone(),
        )
        .await
        .expect("append b");
    }
    assert_eq!(
        wait_stopped(&mut rxb).await,
        Watermark {
            durable: 3,
            rejected: Some(4),
            fenced: false
        }
    );
    let journal = whole_journal(&a, "s1").await;
    let bodies: Vec<&str> = journal.iter().map(|e| &*e.body).collect();
    assert_eq!(
        bodies,
        (1..=5).map(body).collect::<Vec<_>>(),
        "the first writer's entries stay, and b's seq 6 never went in"
    );
    b.close().await;
    a.close().await;
}

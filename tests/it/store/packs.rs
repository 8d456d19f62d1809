//! Store checks of journal packs: a fast stream is stored a run per row, and every read,
//! trim, range replacement and neighbour scan still sees exactly the entries appended.

use std::sync::Arc;

use acpd_store::{JournalEntry, NewEntry, Store};
use sqlx::{Connection, PgConnection, SqliteConnection};

use super::{on_postgres, open_with_sessions, wait_durable, watermark, whole_journal};

both!(
    sqlite_a_stream_is_stored_in_packs_and_read_back_entry_by_entry,
    postgres_a_stream_is_stored_in_packs_and_read_back_entry_by_entry,
    check_read_back
);
both!(
    sqlite_trim_and_replace_split_a_pack_at_the_cut,
    postgres_trim_and_replace_split_a_pack_at_the_cut,
    check_split
);

const N: i64 = 1000;

/// Entry `seq` of the stream: a run of chunks, broken by a tool call every 300 entries and one
/// body holding a raw newline; all at one time, as a fast agent's burst.
fn entry(sid: &Arc<str>, seq: i64) -> NewEntry {
    let (kind, body) = match seq {
        s if s % 300 == 0 => ("tool_call", format!("{{\"tool\":{s}}}")),
        777 => ("agent_message_chunk", "{\"pretty\":\n777}".to_owned()),
        s => ("agent_message_chunk", format!("{{\"n\":{s},\"t\":\"é✓\"}}")),
    };
    NewEntry {
        session_id: sid.clone(),
        seq,
        kind: kind.into(),
        body: body.into(),
        at_ms: 5_000,
        epoch: None,
    }
}

async fn stream(store: &Store, id: &str, n: i64) -> Vec<NewEntry> {
    let sid: Arc<str> = id.into();
    let (durable, mut rx) = watermark();
    let mut sent = Vec::new();
    for seq in 1..=n {
        let e = entry(&sid, seq);
        sent.push(e.clone());
        store.append(e, durable.clone()).await.expect("append");
    }
    wait_durable(&mut rx, n).await;
    sent
}

fn same(got: &[JournalEntry], want: &[NewEntry]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(
            (g.seq, &*g.kind, &*g.body, g.at_ms),
            (w.seq, &*w.kind, &*w.body, w.at_ms)
        );
    }
}

/// Rows the journal table holds for a session, read outside the store.
async fn rows(url: &str, id: &str) -> i64 {
    const SQL: &str = "SELECT COUNT(*) FROM journal WHERE session_id = $1";
    if url.starts_with("sqlite:") {
        let mut c = SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(SQL).bind(id).fetch_one(&mut c).await
    } else {
        let mut c = PgConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(SQL).bind(id).fetch_one(&mut c).await
    }
    .expect("count rows")
}

async fn check_read_back(url: String) {
    let store = open_with_sessions(&url, &["s1"]).await;
    let sent = stream(&store, "s1", N).await;

    let stored = rows(&url, "s1").await;
    assert!(
        stored < N / 10,
        "{N} entries of one burst took {stored} rows"
    );
    same(&whole_journal(&store, "s1").await, &sent);
    // Every start and length, including starts and ends inside a pack.
    for after in [
        0, 1, 2, 255, 256, 257, 299, 300, 511, 776, 777, 998, 999, 1000,
    ] {
        for limit in [1, 7, 256, 2000] {
            let page = store
                .journal_after("s1", after, limit)
                .await
                .expect("after");
            let from = after as usize;
            let to = (from + limit as usize).min(N as usize);
            same(&page, &sent[from..to]);
            let before = store
                .journal_before("s1", after + 1, limit)
                .await
                .expect("before");
            let to = after as usize;
            let from = to.saturating_sub(limit as usize);
            same(&before, &sent[from..to]);
        }
    }
    let bytes: i64 = sent.iter().map(|e| e.body.len() as i64).sum();
    assert_eq!(store.journal_size("s1").await.expect("size"), (N, bytes));

    // Neighbours of one mergeable kind, inside packs and across rows, never across a tool call.
    let pairs = store
        .journal_neighbours("s1", 250, &["agent_message_chunk"], 100)
        .await
        .expect("neighbours");
    let want: Vec<(i64, i64)> = (251..)
        .map(|s| (s, s + 1))
        .filter(|&(a, b)| a % 300 != 0 && b % 300 != 0)
        .take(100)
        .collect();
    assert_eq!(pairs, want);
    store.close().await;
}

async fn check_split(url: String) {
    let store = open_with_sessions(&url, &["s1", "s2"]).await;
    let sent = stream(&store, "s1", N).await;
    let seqs = |j: Vec<JournalEntry>| j.iter().map(|e| e.seq).collect::<Vec<_>>();

    // A count cut inside a pack keeps exactly the newest entries.
    assert_eq!(store.trim_journal("s1", 950, 0).await.expect("trim"), 50);
    same(&whole_journal(&store, "s1").await, &sent[50..]);
    // A byte cut inside a pack: the newest entries whose bodies fit.
    let cap: u64 = sent[100..].iter().map(|e| e.body.len() as u64).sum::<u64>() + 1;
    assert_eq!(store.trim_journal("s1", 0, cap).await.expect("trim"), 50);
    same(&whole_journal(&store, "s1").await, &sent[100..]);

    // Replacing a range whose ends lie inside packs keeps what lies outside it.
    let merged = JournalEntry {
        session_id: "s1".into(),
        seq: 420,
        kind: "agent_message_chunk".into(),
        body: "{\"merged\":true}".into(),
        at_ms: 5_000,
    };
    store
        .replace_journal_range("s1", 410, 420, std::slice::from_ref(&merged))
        .await
        .expect("replace");
    let journal = whole_journal(&store, "s1").await;
    let want: Vec<i64> = (101..410).chain(420..=N).collect();
    assert_eq!(seqs(journal.clone()), want);
    assert_eq!(journal[409 - 101 + 1], merged);
    same(&journal[..309], &sent[100..409]);
    same(&journal[310..], &sent[420..]);

    // Pages across the gaps compaction leaves, narrower and wider than the page.
    let page = |r: Result<Vec<JournalEntry>, _>| seqs(r.expect("page"));
    let want: Vec<i64> = (401..410).chain(420..426).collect();
    assert_eq!(page(store.journal_after("s1", 400, 15).await), want);
    let want: Vec<i64> = (400..410).chain(420..425).collect();
    assert_eq!(page(store.journal_before("s1", 425, 15).await), want);
    let wide = JournalEntry {
        seq: 900,
        ..merged.clone()
    };
    store
        .replace_journal_range("s1", 500, 900, std::slice::from_ref(&wide))
        .await
        .expect("replace");
    let want: Vec<i64> = (451..500).chain(900..951).collect();
    assert_eq!(page(store.journal_after("s1", 450, 100).await), want);
    let want: Vec<i64> = (391..410).chain(420..500).chain([900]).collect();
    assert_eq!(page(store.journal_before("s1", 901, 100).await), want);
    assert_eq!(
        page(store.journal_after("s1", N, 10).await),
        Vec::<i64>::new()
    );
    assert_eq!(
        page(store.journal_before("s1", 101, 10).await),
        Vec::<i64>::new()
    );

    // Another session's stream is stored beside it, untouched.
    let other = stream(&store, "s2", 300).await;
    same(&whole_journal(&store, "s2").await, &other);
    store.close().await;
}

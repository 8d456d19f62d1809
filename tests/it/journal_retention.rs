//! Journal retention: over the per-session cap, message chunks are merged (load still shows
//! the whole message); when merging is not enough the oldest entries go, also from a
//! 1 000 000-entry journal, in bounded memory.

use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, PgConnection, SqliteConnection};

use crate::support::{Daemon, DaemonOptions};

fn chunk_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// Loads the session (on a fresh connection) until `done` holds for the replay.
async fn load_until(daemon: &Daemon, sid: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = daemon.client().await;
        let (updates, result) = client.load(sid, &daemon.work_dir()).await;
        result.expect("load");
        if done(&updates) {
            return updates;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never happened: {} entries",
            updates.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn over_the_cap_chunks_are_merged_and_load_still_shows_the_message() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--journal-max-entries", 50)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (live, result) = client.prompt(&sid, "stream 200 8").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let live_text: String = chunk_texts(&live).concat();

    let replay = load_until(&daemon, &sid, |u| u.len() <= 50).await;
    let texts = chunk_texts(&replay);
    assert_eq!(texts.len(), 1, "the 200 chunks are one entry now");
    assert_eq!(
        texts[0], live_text,
        "the merged message is the whole message"
    );
    // The session's state (its commands) is replayed after the history, with its own seq.
    let seqs: Vec<i64> = replay
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] != "available_commands_update")
        .map(|u| u["_meta"]["acpd"]["seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs still ascend: {seqs:?}"
    );
    assert_eq!(
        *seqs.last().unwrap(),
        live.last().unwrap()["_meta"]["acpd"]["seq"]
            .as_i64()
            .unwrap()
    );

    // The session goes on: new updates continue the seq.
    let (more, result) = client.prompt(&sid, "echo after").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert!(more[0]["_meta"]["acpd"]["seq"].as_i64().unwrap() > *seqs.last().unwrap());
}

#[tokio::test]
async fn when_merging_is_not_enough_the_oldest_entries_go() {
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--journal-max-entries", 6)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    for i in 0..5 {
        let (_, result) = client.prompt(&sid, &format!("echo turn {i}")).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
    }
    let replay = load_until(&daemon, &sid, |u| u.len() <= 6).await;
    assert_eq!(replay.len(), 6);
    assert_eq!(
        chunk_texts(&replay).last().map(String::as_str),
        Some("turn 4"),
        "the newest are kept"
    );
}

/// `acpd_journal_retention_passes_total` as /metrics shows it now.
async fn retention_passes(daemon: &Daemon) -> u64 {
    let (_, metrics) = crate::operations::http_get(daemon.addr, "/metrics").await;
    crate::operations::sample(&metrics, "acpd_journal_retention_passes_total") as u64
}

/// Turns that leave the journal under its caps do not each measure it in the database: the
/// session measures once, then counts what it appends, and looks again only when a cap may
/// have been crossed.
#[tokio::test]
async fn turns_under_the_cap_do_not_each_measure_the_journal() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--journal-max-entries", 100)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    for i in 0..6 {
        let (_, result) = client.prompt(&sid, &format!("echo turn {i}")).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
    }
    assert_eq!(
        retention_passes(&daemon).await,
        1,
        "one measure for six turns of two entries each"
    );
    // This turn crosses the cap: a pass merges its chunks.
    let (_, result) = client.prompt(&sid, "stream 200 8").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let replay = load_until(&daemon, &sid, |u| u.len() <= 100).await;
    assert!(chunk_texts(&replay).len() < 20, "the chunks were merged");
    assert_eq!(retention_passes(&daemon).await, 2);
    // Under the cap again after the merge: the next turns need no pass.
    for i in 0..3 {
        let (_, result) = client.prompt(&sid, &format!("echo again {i}")).await;
        assert_eq!(result.unwrap()["stopReason"], "end_turn");
    }
    assert_eq!(retention_passes(&daemon).await, 2);
}

/// The journal rows of one session in bulk, as the daemon would have written them: one
/// statement generating `n` `tool_call_update` entries after seq `after`.
async fn bulk_journal(url: &str, sid: &str, after: i64, n: i64) {
    const BODY: &str = "'{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"' || $1 || '\",\"update\":{\"sessionUpdate\":\"tool_call_update\",\"toolCallId\":\"t' || i || '\",\"status\":\"completed\"},\"_meta\":{\"acpd\":{\"seq\":' || ($2 + i) || '}}}}'";
    let (insert, bump) = (
        format!(
            "INSERT INTO journal (session_id, seq, kind, body, at_ms) \
             SELECT $1, $2 + i, 'tool_call_update', {BODY}, 0 FROM ROWS"
        ),
        "UPDATE sessions SET last_seq = $2 + $3 WHERE id = $1",
    );
    if url.starts_with("sqlite:") {
        let mut db = SqliteConnection::connect(url)
            .await
            .expect("connect sqlite");
        let insert = format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $3) {}",
            insert.replace("FROM ROWS", "FROM n")
        );
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(sid)
            .bind(after)
            .bind(n)
            .execute(&mut db)
            .await
            .expect("bulk insert");
        sqlx::query(bump)
            .bind(sid)
            .bind(after)
            .bind(n)
            .execute(&mut db)
            .await
            .expect("raise last_seq");
        db.close().await.ok();
    } else {
        let mut db = PgConnection::connect(url).await.expect("connect postgres");
        let insert = insert.replace("FROM ROWS", "FROM generate_series(1, $3::int8) AS i");
        sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(sid)
            .bind(after)
            .bind(n)
            .execute(&mut db)
            .await
            .expect("bulk insert");
        sqlx::query(bump)
            .bind(sid)
            .bind(after)
            .bind(n)
            .execute(&mut db)
            .await
            .expect("raise last_seq");
        db.close().await.ok();
    }
}

/// `(entries, min seq, max seq, body of the newest row)` of a session's journal.
async fn journal_stats(url: &str, sid: &str) -> (i64, i64, i64, String) {
    // A row holds `n_entries` entries from `seq` on (a pack); the newest row's body holds the
    // newest entry last.
    const STATS: &str = "SELECT COALESCE(SUM(n_entries), 0), COALESCE(MIN(seq), 0), \
         COALESCE(MAX(seq + n_entries - 1), 0), \
         COALESCE((SELECT body FROM journal WHERE session_id = $1 ORDER BY seq DESC LIMIT 1), '') \
         FROM journal WHERE session_id = $1";
    if url.starts_with("sqlite:") {
        let mut db = SqliteConnection::connect(url)
            .await
            .expect("connect sqlite");
        let stats = sqlx::query_as(STATS).bind(sid).fetch_one(&mut db).await;
        db.close().await.ok();
        stats.expect("journal stats")
    } else {
        let mut db = PgConnection::connect(url).await.expect("connect postgres");
        let stats = sqlx::query_as(STATS).bind(sid).fetch_one(&mut db).await;
        db.close().await.ok();
        stats.expect("journal stats")
    }
}

/// Peak resident memory of a process, in KiB (`VmHWM`).
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Entries in the big journal: its bodies alone are ~170 MB, far more than the memory bound.
const BIG: i64 = 1_000_000;
/// The daemon's peak RSS bound while it trims the big journal. Holding the journal (as a
/// retention that reads it whole would) takes several hundred MiB.
const PEAK_RSS_BOUND_KIB: u64 = 160 * 1024;

#[tokio::test]
async fn a_million_entry_journal_is_trimmed_to_the_cap_in_bounded_memory() {
    million_entries(DaemonOptions::default()).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn on_postgres_a_million_entry_journal_is_trimmed_to_the_cap_in_bounded_memory() {
    million_entries(DaemonOptions::default().postgres()).await;
}

async fn million_entries(opts: DaemonOptions) {
    const CAP: i64 = 1000;
    let mut daemon = Daemon::start_with(opts.arg("--journal-max-entries", CAP)).await;
    let url = daemon.store_url();
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "echo first").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    drop(client);
    daemon.sigterm().await;
    let (count, _, base, _) = journal_stats(&url, &sid).await;
    assert!(count > 0 && count < CAP);
    let t = std::time::Instant::now();
    bulk_journal(&url, &sid, base, BIG).await;
    eprintln!("bulk insert {:?}", t.elapsed());
    assert_eq!(journal_stats(&url, &sid).await.0, count + BIG);

    // A turn on the restarted daemon ends, and retention runs on the whole journal.
    daemon.restart().await;
    let t = std::time::Instant::now();
    let mut client = daemon.client().await.with_timeout(Duration::from_secs(120));
    let (_, result) = client.prompt(&sid, "echo newest").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let (count, first, last, newest) = loop {
        let stats = journal_stats(&url, &sid).await;
        if stats.0 <= CAP {
            break stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never trimmed the journal: {} entries",
            stats.0
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let peak = peak_rss_kib(daemon.pid());
    eprintln!("turn + retention {:?}", t.elapsed());
    // The cap holds exactly, with the newest entries: nothing older than the cut, no gap.
    assert_eq!((count, last - first + 1), (CAP, CAP));
    assert!(last > base + BIG, "the new turn's entries are kept");
    assert!(
        newest.contains("newest"),
        "the newest entry is the last chunk: {newest}"
    );
    assert!(
        peak < PEAK_RSS_BOUND_KIB,
        "acpd peaked at {peak} KiB trimming a {BIG}-entry journal"
    );
    eprintln!("acpd peak RSS while trimming {BIG} entries: {peak} KiB");

    // And load replays exactly what is kept.
    let (replay, result) = client.load(&sid, &daemon.work_dir()).await;
    result.expect("load");
    assert_eq!(replay.len() as i64, CAP);
    assert_eq!(
        chunk_texts(&replay).last().map(String::as_str),
        Some("newest")
    );
}

//! Store benchmark: journal append throughput through group commit, and journal read-back time.
//!
//! `cargo bench --bench store` runs SQLite always, and Postgres too when
//! `ACPD_TEST_DATABASE_URL` names a server (a throwaway database is created and dropped).

use std::sync::Arc;
use std::time::{Duration, Instant};

use acpd::store::{NewEntry, SessionRow, Store, StoreOptions};
use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::watch;

const APPENDS: i64 = 100_000;
const READ_BACK: i64 = 10_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    run("sqlite", &url).await?;

    if let Some(admin) = std::env::var("ACPD_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        let name = format!("acpd_bench_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin).await?;
        conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        let outcome = run("postgres", &with_database(&admin, &name)).await;
        conn.execute(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .await?;
        outcome?;
    } else {
        println!("postgres: skipped (set ACPD_TEST_DATABASE_URL)");
    }
    Ok(())
}

async fn run(label: &str, url: &str) -> anyhow::Result<()> {
    let store = Store::open(url, StoreOptions::default()).await?;
    let principal = store.ensure_principal("bench").await?;
    store
        .insert_session(&session("stream", &principal.id))
        .await?;
    store
        .insert_session(&session("replay", &principal.id))
        .await?;

    let elapsed = append_all(&store, "stream", APPENDS).await?;
    println!(
        "{label}: {APPENDS} appends of {}-byte bodies in {:.0} ms = {:.0} appends/s",
        body(1).len(),
        elapsed.as_secs_f64() * 1e3,
        APPENDS as f64 / elapsed.as_secs_f64()
    );

    append_all(&store, "replay", READ_BACK).await?;
    // Best of five: the first read also warms the page cache and the prepared statement.
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let entries = store.journal_after("replay", 0, READ_BACK).await?;
        best = best.min(start.elapsed());
        anyhow::ensure!(
            entries.len() as i64 == READ_BACK,
            "read back {} entries",
            entries.len()
        );
    }
    println!(
        "{label}: journal_after read back {READ_BACK} entries in {:.1} ms (best of 5)",
        best.as_secs_f64() * 1e3
    );
    store.close().await;
    Ok(())
}

/// Appends `n` entries and returns the time until the last one is durable.
async fn append_all(store: &Store, session_id: &str, n: i64) -> anyhow::Result<Duration> {
    let sid: Arc<str> = session_id.into();
    let kind: Arc<str> = "agent_message_chunk".into();
    let (durable, mut rx) = watch::channel(0);
    let durable = Arc::new(durable);
    let start = Instant::now();
    for seq in 1..=n {
        let entry = NewEntry {
            session_id: sid.clone(),
            seq,
            kind: kind.clone(),
            body: body(seq).into(),
            at_ms: seq,
        };
        store.append(entry, durable.clone()).await?;
    }
    tokio::time::timeout(Duration::from_secs(600), rx.wait_for(|v| *v >= n)).await??;
    Ok(start.elapsed())
}

/// About 64 bytes, like a short streamed text chunk.
fn body(seq: i64) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{{\"t\":\"chunk {seq:08}\"}}}}")
}

fn session(id: &str, principal_id: &str) -> SessionRow {
    SessionRow {
        id: id.to_owned(),
        principal_id: principal_id.to_owned(),
        agent: "builtin".into(),
        agent_session_id: None,
        cwd: "/bench".into(),
        additional_dirs: "[]".into(),
        title: None,
        mode_id: None,
        config_values: "{}".into(),
        meta: "{}".into(),
        created_at_ms: 1,
        updated_at_ms: 1,
        closed: false,
        last_seq: 0,
        owner_instance: None,
        lease_until_ms: None,
    }
}

/// Replaces the database name in a `postgres://user@host:port/db?params` URL.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

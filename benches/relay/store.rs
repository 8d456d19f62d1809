//! The store alone, without the daemon around it: group-commit journal appends per second and
//! the read-back of a 10 000-entry journal, and one session row's insert (the durable write on
//! `session/new`'s path). The ceilings for streaming, `session/load` and `session/new`.
//! Also the throwaway Postgres databases of the benchmark.

use std::sync::Arc;
use std::time::{Duration, Instant};

use acpd_protocol::update_form;
use acpd_store::{NewEntry, SessionRow, Store};
use anyhow::{Result, ensure};
use sqlx::{Connection, Executor, PgConnection};

pub struct StoreRef {
    pub appends_per_s: f64,
    pub read_ms: f64,
    /// One session row's insert, sequential: p50 and p99, µs.
    pub insert_us: Vec<f64>,
}

/// Session rows inserted one after another for `StoreRef::insert_us` (after as many untimed).
const INSERTS: usize = 1000;

/// Appends `appends` entries to a fresh session and reads `read_back` entries back (best of 5).
pub async fn measure(url: &str, tag: &str, appends: i64, read_back: i64) -> Result<StoreRef> {
    // The daemon's journal form: the store stores updates as acpd does.
    let store = Store::open(url, acpd::store_options()).await?;
    let principal = store.ensure_principal("bench").await?;
    let (stream, replay) = (format!("stream-{tag}"), format!("replay-{tag}"));
    store
        .insert_session(&session(&stream, &principal.id))
        .await?;
    store
        .insert_session(&session(&replay, &principal.id))
        .await?;
    let elapsed = append_all(&store, &stream, appends).await?;
    append_all(&store, &replay, read_back).await?;
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let entries = store.journal_after(&replay, 0, read_back).await?;
        best = best.min(start.elapsed());
        ensure!(
            entries.len() as i64 == read_back,
            "read back {}",
            entries.len()
        );
    }
    let mut inserts = Vec::with_capacity(INSERTS);
    for i in 0..2 * INSERTS {
        let row = session(&format!("new-{tag}-{i}"), &principal.id);
        let start = Instant::now();
        store.insert_session(&row).await?;
        if i >= INSERTS {
            inserts.push(start.elapsed());
        }
    }
    store.close().await;
    Ok(StoreRef {
        appends_per_s: appends as f64 / elapsed.as_secs_f64(),
        read_ms: best.as_secs_f64() * 1e3,
        insert_us: crate::percentiles(inserts),
    })
}

/// Appends `n` entries and returns the time until the last one is durable.
async fn append_all(store: &Store, session_id: &str, n: i64) -> Result<Duration> {
    let sid: Arc<str> = session_id.into();
    let kind: Arc<str> = "agent_message_chunk".into();
    let (durable, mut rx) = acpd_store::watermark(0);
    let start = Instant::now();
    for seq in 1..=n {
        // What acpd journals for a 64-byte text chunk of the streaming rows (~300 bytes, of
        // which its form stores ~150): the store's cost goes by the bytes, so a shorter
        // stand-in would flatter it.
        let mut body = format!(
            r#"{}"{session_id}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{:064}"}}}}"#,
            update_form::UPDATE_HEAD,
            seq
        );
        update_form::push_seq_tail(&mut body, seq);
        let entry = NewEntry {
            session_id: sid.clone(),
            seq,
            kind: kind.clone(),
            body: body.into(),
            // The clock, as acpd stamps entries: a burst shares its millisecond and packs.
            at_ms: now_ms(),
            epoch: None,
        };
        store.append(entry, durable.clone()).await?;
    }
    let mark =
        *tokio::time::timeout(Duration::from_secs(600), rx.wait_for(|v| v.settled(n))).await??;
    ensure!(
        mark.rejected.is_none(),
        "the store rejected entry {:?}",
        mark.rejected
    );
    Ok(start.elapsed())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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

/// A throwaway database on the server named by `admin`; dropped by `drop_database`.
pub async fn create_database(admin: &str) -> Result<(String, String)> {
    let name = format!("acpd_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(admin).await?;
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .await?;
    Ok((name.clone(), with_database(admin, &name)))
}

pub async fn drop_database(admin: &str, name: &str) -> Result<()> {
    let mut conn = PgConnection::connect(admin).await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .await?;
    Ok(())
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

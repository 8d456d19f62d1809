//! Store tests: one suite of checks, each run against SQLite and (when a server is named)
//! Postgres. This file holds the shared helpers; the checks are in the files beside it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use acpd_store::{DurableSeq, JournalEntry, NewEntry, SessionRow, Store, StoreOptions, Watermark};
use sqlx::{Connection, PgConnection, SqliteConnection};
use tokio::sync::watch;
use tokio::time::timeout;

use crate::pgtest::TestDb;

/// Generous: the machine running the suite may be busy with other builds.
pub(super) const WAIT: Duration = Duration::from_secs(60);

/// Declares the SQLite and the Postgres test of one `check_*(url)`.
macro_rules! both {
    ($sqlite:ident, $postgres:ident, $check:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("data/acpd.db").display());
            $check(url).await;
        }

        #[tokio::test]
        #[cfg_attr(
            not(acpd_pg),
            ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
        )]
        async fn $postgres() {
            on_postgres($check).await;
        }
    };
}

/// Runs a check on a fresh Postgres database and drops it afterwards, also when the check fails.
pub(super) async fn on_postgres<F, Fut>(check: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDb::create().await;
    let outcome = tokio::spawn(check(db.url().to_owned())).await;
    db.drop_db().await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

mod grants;
mod journal;
mod leases;
mod packs;
mod rejection;
mod retention;
mod sessions;
mod usage;
mod web;

pub(super) async fn open(url: &str) -> Store {
    Store::open(url, StoreOptions::default())
        .await
        .expect("open store")
}

/// A store holding a session of principal "alice" for each id.
pub(super) async fn open_with_sessions(url: &str, ids: &[&str]) -> Store {
    let store = open(url).await;
    let p = store.ensure_principal("alice").await.expect("principal");
    for id in ids {
        store
            .insert_session(&session(id, &p.id, "/w", 1))
            .await
            .expect("insert session");
    }
    store
}

pub(super) fn session(id: &str, principal: &str, cwd: &str, created_at_ms: i64) -> SessionRow {
    SessionRow {
        id: id.to_owned(),
        principal_id: principal.to_owned(),
        agent: "builtin".into(),
        agent_session_id: None,
        cwd: cwd.to_owned(),
        additional_dirs: "[]".into(),
        title: None,
        mode_id: None,
        config_values: "{}".into(),
        meta: "{}".into(),
        created_at_ms,
        updated_at_ms: created_at_ms,
        closed: false,
        last_seq: 0,
        owner_instance: None,
        lease_until_ms: None,
    }
}

pub(super) fn new_entry(session_id: &Arc<str>, seq: i64, kind: &str, body: String) -> NewEntry {
    NewEntry {
        session_id: session_id.clone(),
        seq,
        kind: kind.into(),
        body: body.into(),
        at_ms: 1_000 + seq,
        epoch: None,
    }
}

/// A body that must come back byte for byte: odd spacing, escapes, non-ASCII.
pub(super) fn odd_body(seq: i64) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\", \"method\":\"session/update\",\"params\":{{\"n\": {seq}, \"t\":\"é\\u00e9 \\\"q\\\" ✓\\n\"}} }}"
    )
}

pub(super) fn watermark() -> (Arc<DurableSeq>, watch::Receiver<Watermark>) {
    acpd_store::watermark(0)
}

pub(super) async fn wait_durable(rx: &mut watch::Receiver<Watermark>, seq: i64) {
    timeout(WAIT, rx.wait_for(|v| v.durable >= seq))
        .await
        .expect("watermark reached in time")
        .expect("watermark sender alive");
}

/// Waits until the watermark reports a rejection; returns where it stopped.
pub(super) async fn wait_stopped(rx: &mut watch::Receiver<Watermark>) -> Watermark {
    *timeout(WAIT, rx.wait_for(|w| w.rejected.is_some()))
        .await
        .expect("rejection reported in time")
        .expect("watermark sender alive")
}

/// All of a session's journal, read in pages.
pub(super) async fn whole_journal(store: &Store, session_id: &str) -> Vec<JournalEntry> {
    let mut all: Vec<JournalEntry> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.seq);
        let page = store
            .journal_after(session_id, after, 1000)
            .await
            .expect("journal_after");
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// Runs one statement on the store's database, outside the store.
pub(super) async fn raw(url: &str, sql: &'static str) {
    raw_per_backend(url, sql, sql).await;
}

pub(super) async fn raw_per_backend(url: &str, sqlite: &'static str, postgres: &'static str) {
    if url.starts_with("sqlite:") {
        let mut conn = SqliteConnection::connect(url)
            .await
            .expect("connect sqlite");
        sqlx::query(sqlite)
            .execute(&mut conn)
            .await
            .expect("raw sql");
    } else {
        let mut conn = PgConnection::connect(url).await.expect("connect postgres");
        sqlx::query(postgres)
            .execute(&mut conn)
            .await
            .expect("raw sql");
    }
}

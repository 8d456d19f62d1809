//! A throwaway Postgres database per test, on the server named by `ACPD_TEST_DATABASE_URL`.

use sqlx::{Connection, Executor, PgConnection};

/// A database created for one test and dropped by `drop_db`.
pub struct TestDb {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDb {
    /// Creates a fresh database. Panics when `ACPD_TEST_DATABASE_URL` is unset: callers are
    /// compiled with `#[cfg_attr(not(acpd_pg), ignore)]`, so they only run when it is set.
    pub async fn create() -> TestDb {
        let admin_url = std::env::var("ACPD_TEST_DATABASE_URL")
            .expect("ACPD_TEST_DATABASE_URL names a Postgres server for the Postgres tests");
        let name = format!("acpd_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin_url)
            .await
            .expect("connect to ACPD_TEST_DATABASE_URL");
        let sql = format!("CREATE DATABASE {name}");
        conn.execute(sqlx::AssertSqlSafe(sql))
            .await
            .expect("create test database");
        conn.close().await.ok();
        let url = with_database(&admin_url, &name);
        TestDb {
            admin_url,
            name,
            url,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server URL the database was created from (for admin statements).
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// Drops the database, terminating leftover connections first.
    pub async fn drop_db(self) {
        if let Ok(mut conn) = PgConnection::connect(&self.admin_url).await {
            let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            let _ = conn.execute(sqlx::AssertSqlSafe(sql)).await;
            conn.close().await.ok();
        }
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

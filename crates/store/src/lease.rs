//! Session leases and the replicas table: which replica owns a live session, under which
//! epoch, until when; and where each replica can be reached.
//!
//! A lease is three columns of the session row (`owner_instance`, `lease_until_ms`,
//! `lease_epoch`), not a table of its own: the journal writer's transaction already row-locks
//! the session (`raise_last_seq`), so its fencing check reads the lease under the same lock
//! that an acquisition has to take, and nothing can move the lease between the check and the
//! insert. Every time is the database's clock, so replicas' clocks need not agree.

use super::backend::{Pool, db, on_write};
use super::{Store, StoreError};

/// `StoreOptions::replica`.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// The replica's id: the owner of the leases it takes.
    pub id: String,
    /// The lease TTL. Also the server-side `idle_in_transaction_session_timeout` of the
    /// replica's connections: a replica paused in the middle of a transaction would otherwise
    /// hold its session rows locked, and no peer could take them over until it resumed.
    pub lease_ttl: std::time::Duration,
}

/// What `Store::acquire_lease` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller owns the session now, under this (new) epoch.
    Owned { epoch: i64 },
    /// Another replica holds a live lease on it.
    Held {
        owner: String,
        /// Where that replica's peers reach it, if it said.
        advertise_url: Option<String>,
        expires_in_ms: i64,
    },
    /// No such live session.
    Missing,
}

/// "Now" in epoch milliseconds, by the database's clock.
fn now_sql(pool: &Pool) -> &'static str {
    match pool {
        Pool::Postgres(_) => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        Pool::Sqlite(..) => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
    }
}

/// Runs one statement built around `now_sql` against whichever pool is in use.
macro_rules! with_now {
    ($pool:expr, $sql:expr, |$p:ident, $q:ident| $body:expr) => {{
        let text = format!($sql, now = now_sql($pool));
        match $pool {
            Pool::Sqlite(_, $p) => {
                let $q = sqlx::AssertSqlSafe(text);
                $body
            }
            Pool::Postgres($p) => {
                let $q = sqlx::AssertSqlSafe(text);
                $body
            }
        }
    }};
}

/// Who holds a lease: owner, expiry, the owner's `advertise_url`, milliseconds left.
type Holder = (Option<String>, Option<i64>, Option<String>, i64);

/// Takes the session's lease for `replica` when nobody holds a live one (free, expired, or
/// already `replica`'s), raising the epoch; else says who holds it.
pub(super) async fn acquire(
    pool: &Pool,
    session_id: &str,
    replica: &str,
    ttl_ms: i64,
) -> Result<Acquired, StoreError> {
    // A lease given back between the two statements is tried again, a few times.
    for _ in 0..3 {
        let epoch: Option<i64> = with_now!(
            pool,
            "UPDATE sessions SET owner_instance = $2, lease_until_ms = {now} + $3, \
             lease_epoch = lease_epoch + 1 \
             WHERE id = $1 AND deleted_at_ms IS NULL AND (owner_instance IS NULL \
               OR owner_instance = $2 OR lease_until_ms IS NULL OR lease_until_ms < {now}) \
             RETURNING lease_epoch",
            |p, q| sqlx::query_scalar(q)
                .bind(session_id)
                .bind(replica)
                .bind(ttl_ms)
                .fetch_optional(p)
                .await
                .map_err(db)?
        );
        if let Some(epoch) = epoch {
            return Ok(Acquired::Owned { epoch });
        }
        let holder: Option<Holder> = with_now!(
            pool,
            "SELECT s.owner_instance, s.lease_until_ms, r.advertise_url, \
             COALESCE(s.lease_until_ms, 0) - {now} \
             FROM sessions s LEFT JOIN replicas r ON r.id = s.owner_instance \
             WHERE s.id = $1 AND s.deleted_at_ms IS NULL",
            |p, q| sqlx::query_as(q)
                .bind(session_id)
                .fetch_optional(p)
                .await
                .map_err(db)?
        );
        match holder {
            None => return Ok(Acquired::Missing),
            Some((Some(owner), Some(_), advertise_url, left)) if left >= 0 => {
                return Ok(Acquired::Held {
                    owner,
                    advertise_url,
                    expires_in_ms: left,
                });
            }
            Some(_) => continue,
        }
    }
    Err(StoreError::Conflict(format!(
        "the lease of session {session_id} keeps changing hands"
    )))
}

/// Extends the leases `replica` holds (`(session, epoch)`) by `ttl_ms` from now; returns the
/// sessions whose lease it no longer holds (taken over, deleted).
pub(super) async fn renew(
    pool: &Pool,
    replica: &str,
    held: &[(String, i64)],
    ttl_ms: i64,
) -> Result<Vec<String>, StoreError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let kept: Vec<String> = match pool {
        Pool::Postgres(p) => {
            let ids: Vec<&str> = held.iter().map(|h| h.0.as_str()).collect();
            let epochs: Vec<i64> = held.iter().map(|h| h.1).collect();
            let sql = format!(
                "UPDATE sessions AS s SET lease_until_ms = {now} + $2 \
                 FROM UNNEST($3::text[], $4::int8[]) AS v (id, epoch) \
                 WHERE s.id = v.id AND s.owner_instance = $1 AND s.lease_epoch = v.epoch \
                   AND s.deleted_at_ms IS NULL \
                 RETURNING s.id",
                now = now_sql(pool)
            );
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .bind(replica)
                .bind(ttl_ms)
                .bind(ids)
                .bind(epochs)
                .fetch_all(p)
                .await
                .map_err(db)?
        }
        Pool::Sqlite(_, p) => {
            let sql = format!(
                "UPDATE sessions SET lease_until_ms = {now} + $2 \
                 WHERE id = $3 AND owner_instance = $1 AND lease_epoch = $4 \
                   AND deleted_at_ms IS NULL",
                now = now_sql(pool)
            );
            let mut kept = Vec::new();
            for (id, epoch) in held {
                let n = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                    .bind(replica)
                    .bind(ttl_ms)
                    .bind(id)
                    .bind(epoch)
                    .execute(p)
                    .await
                    .map_err(db)?
                    .rows_affected();
                if n > 0 {
                    kept.push(id.clone());
                }
            }
            kept
        }
    };
    Ok(held
        .iter()
        .filter(|(id, _)| !kept.contains(id))
        .map(|(id, _)| id.clone())
        .collect())
}

/// Gives back one lease, if `replica` still holds it under `epoch`; a peer may take it at
/// once. The epoch stays: the next owner raises it.
pub(super) async fn release(
    pool: &Pool,
    session_id: &str,
    replica: &str,
    epoch: i64,
) -> Result<bool, StoreError> {
    on_write!(pool, |p| sqlx::query(
        "UPDATE sessions SET owner_instance = NULL, lease_until_ms = NULL \
         WHERE id = $1 AND owner_instance = $2 AND lease_epoch = $3"
    )
    .bind(session_id)
    .bind(replica)
    .bind(epoch)
    .execute(p)
    .await
    .map(|r| r.rows_affected() > 0)
    .map_err(db))
}

/// Gives back every lease of `replica` and removes it from the replicas table (a drain).
pub(super) async fn release_all(pool: &Pool, replica: &str) -> Result<u64, StoreError> {
    on_write!(pool, |p| {
        let released = sqlx::query(
            "UPDATE sessions SET owner_instance = NULL, lease_until_ms = NULL \
             WHERE owner_instance = $1",
        )
        .bind(replica)
        .execute(p)
        .await
        .map_err(db)?
        .rows_affected();
        sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(replica)
            .execute(p)
            .await
            .map_err(db)?;
        Ok(released)
    })
}

/// Records `replica` (and where peers reach it) as alive now.
pub(super) async fn heartbeat(
    pool: &Pool,
    replica: &str,
    advertise_url: Option<&str>,
) -> Result<(), StoreError> {
    with_now!(
        pool,
        "INSERT INTO replicas (id, advertise_url, started_at_ms, heartbeat_ms) \
         VALUES ($1, $2, {now}, {now}) \
         ON CONFLICT (id) DO UPDATE SET advertise_url = excluded.advertise_url, \
           heartbeat_ms = excluded.heartbeat_ms",
        |p, q| sqlx::query(q)
            .bind(replica)
            .bind(advertise_url)
            .execute(p)
            .await
            .map(drop)
            .map_err(db)
    )
}

impl Store {
    /// Takes the lease of a live session for `replica` unless another replica holds a live
    /// one; a new epoch every time (the journal appends of older ones are refused from then
    /// on). `ttl_ms` from now by the database's clock.
    pub async fn acquire_lease(
        &self,
        session_id: &str,
        replica: &str,
        ttl_ms: i64,
    ) -> Result<Acquired, StoreError> {
        acquire(&self.inner.pool, session_id, replica, ttl_ms).await
    }

    /// Extends the leases `replica` holds, `(session, epoch)`; returns the sessions it lost.
    pub async fn renew_leases(
        &self,
        replica: &str,
        held: &[(String, i64)],
        ttl_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        renew(&self.inner.pool, replica, held, ttl_ms).await
    }

    /// Gives back one lease `replica` holds under `epoch`; `false` if it held none.
    pub async fn release_lease(
        &self,
        session_id: &str,
        replica: &str,
        epoch: i64,
    ) -> Result<bool, StoreError> {
        release(&self.inner.pool, session_id, replica, epoch).await
    }

    /// Records `replica` as alive now, reachable at `advertise_url`.
    pub async fn replica_heartbeat(
        &self,
        replica: &str,
        advertise_url: Option<&str>,
    ) -> Result<(), StoreError> {
        heartbeat(&self.inner.pool, replica, advertise_url).await
    }
}

//! Session grants (shared sessions): which other principals may attach to a session, and in
//! which role. Roles are opaque text here; the session layer gives them meaning.

use super::backend::{Pool, db, now_ms, on_pool, on_write};
use super::{GrantRow, PrincipalRow, Store, StoreError, signals};

/// Granting again renews the grant (new role, not revoked).
const UPSERT: &str = "INSERT INTO session_grants \
     (session_id, principal_id, role, granted_by, created_at_ms, revoked_at_ms) \
     VALUES ($1, $2, $3, $4, $5, NULL) \
     ON CONFLICT (session_id, principal_id) DO UPDATE SET role = $3, granted_by = $4, \
     created_at_ms = $5, revoked_at_ms = NULL";

/// Every grant query selects exactly the columns `grant_row` reads.
macro_rules! select {
    ($rest:literal) => {
        concat!(
            "SELECT session_id, principal_id, role, granted_by, created_at_ms, revoked_at_ms \
             FROM session_grants ",
            $rest
        )
    };
}

fn grant_row(r: &impl super::rows::Columns) -> Result<GrantRow, sqlx::Error> {
    Ok(GrantRow {
        session_id: r.text("session_id")?,
        principal_id: r.text("principal_id")?,
        role: r.text("role")?,
        granted_by: r.text("granted_by")?,
        created_at_ms: r.int("created_at_ms")?,
        revoked_at_ms: r.opt_int("revoked_at_ms")?,
    })
}

pub(super) async fn grant(
    pool: &Pool,
    session_id: &str,
    principal_id: &str,
    role: &str,
    granted_by: &str,
) -> Result<(), StoreError> {
    on_write!(pool, |p| {
        sqlx::query(UPSERT)
            .bind(session_id)
            .bind(principal_id)
            .bind(role)
            .bind(granted_by)
            .bind(now_ms())
            .execute(p)
            .await
            .map(drop)
            .map_err(db)
    })
}

pub(super) async fn revoke(
    pool: &Pool,
    session_id: &str,
    principal_id: &str,
) -> Result<bool, StoreError> {
    let n = on_write!(pool, |p| {
        sqlx::query(
            "UPDATE session_grants SET revoked_at_ms = $3 \
             WHERE session_id = $1 AND principal_id = $2 AND revoked_at_ms IS NULL",
        )
        .bind(session_id)
        .bind(principal_id)
        .bind(now_ms())
        .execute(p)
        .await
        .map_err(db)?
        .rows_affected()
    });
    Ok(n > 0)
}

pub(super) async fn live(
    pool: &Pool,
    session_id: &str,
    principal_id: &str,
) -> Result<Option<GrantRow>, StoreError> {
    on_pool!(pool, |p| {
        let q = select!("WHERE session_id = $1 AND principal_id = $2 AND revoked_at_ms IS NULL");
        let row = sqlx::query(q)
            .bind(session_id)
            .bind(principal_id)
            .fetch_optional(p)
            .await
            .map_err(db)?;
        row.as_ref().map(grant_row).transpose().map_err(db)
    })
}

pub(super) async fn of_session(pool: &Pool, session_id: &str) -> Result<Vec<GrantRow>, StoreError> {
    on_pool!(pool, |p| {
        let q = select!("WHERE session_id = $1 ORDER BY created_at_ms, principal_id");
        let rows = sqlx::query(q)
            .bind(session_id)
            .fetch_all(p)
            .await
            .map_err(db)?;
        rows.iter()
            .map(grant_row)
            .collect::<Result<_, _>>()
            .map_err(db)
    })
}

pub(super) async fn revoked_after(pool: &Pool, after_ms: i64) -> Result<Vec<GrantRow>, StoreError> {
    on_pool!(pool, |p| {
        let q = select!("WHERE revoked_at_ms > $1 ORDER BY revoked_at_ms");
        let rows = sqlx::query(q)
            .bind(after_ms)
            .fetch_all(p)
            .await
            .map_err(db)?;
        rows.iter()
            .map(grant_row)
            .collect::<Result<_, _>>()
            .map_err(db)
    })
}

pub(super) async fn principal_by_name(
    pool: &Pool,
    name: &str,
) -> Result<Option<super::PrincipalRow>, StoreError> {
    principal_where(
        pool,
        "SELECT id, name, created_at_ms FROM principals WHERE name = $1",
        name,
    )
    .await
}

pub(super) async fn principal(
    pool: &Pool,
    id: &str,
) -> Result<Option<super::PrincipalRow>, StoreError> {
    principal_where(
        pool,
        "SELECT id, name, created_at_ms FROM principals WHERE id = $1",
        id,
    )
    .await
}

async fn principal_where(
    pool: &Pool,
    sql: &'static str,
    key: &str,
) -> Result<Option<super::PrincipalRow>, StoreError> {
    on_pool!(pool, |p| {
        let row = sqlx::query(sql)
            .bind(key)
            .fetch_optional(p)
            .await
            .map_err(db)?;
        row.as_ref()
            .map(super::rows::principal_row)
            .transpose()
            .map_err(db)
    })
}

// The grant calls of the store's contract (`lib.rs`), beside their SQL.
impl Store {
    /// Grants `principal_id` `role` on a session (again: the new role, not revoked).
    pub async fn grant(
        &self,
        session_id: &str,
        principal_id: &str,
        role: &str,
        granted_by: &str,
    ) -> Result<(), StoreError> {
        self.row_settled(session_id).await;
        grant(&self.inner.pool, session_id, principal_id, role, granted_by).await
    }

    /// `false` when that principal had no live grant on the session.
    pub async fn revoke_grant(
        &self,
        session_id: &str,
        principal_id: &str,
    ) -> Result<bool, StoreError> {
        self.row_settled(session_id).await;
        let revoked = revoke(&self.inner.pool, session_id, principal_id).await?;
        if revoked {
            signals::announce(&self.inner.pool, "grant").await;
        }
        Ok(revoked)
    }

    /// The live grant of `principal_id` on a session.
    pub async fn live_grant(
        &self,
        session_id: &str,
        principal_id: &str,
    ) -> Result<Option<GrantRow>, StoreError> {
        self.row_settled(session_id).await;
        live(&self.inner.pool, session_id, principal_id).await
    }

    /// Every grant of a session, revoked ones included, oldest first.
    pub async fn grants_of(&self, session_id: &str) -> Result<Vec<GrantRow>, StoreError> {
        self.row_settled(session_id).await;
        of_session(&self.inner.pool, session_id).await
    }

    /// Grants revoked after `after_ms` (epoch ms), in revocation order.
    pub async fn grants_revoked_after(&self, after_ms: i64) -> Result<Vec<GrantRow>, StoreError> {
        revoked_after(&self.inner.pool, after_ms).await
    }

    /// The principal with that name, if any.
    pub async fn principal_by_name(&self, name: &str) -> Result<Option<PrincipalRow>, StoreError> {
        principal_by_name(&self.inner.pool, name).await
    }

    /// The principal with that id, if any.
    pub async fn principal(&self, id: &str) -> Result<Option<PrincipalRow>, StoreError> {
        principal(&self.inner.pool, id).await
    }
}

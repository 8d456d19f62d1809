//! Principals and their API tokens (only token hashes are stored).

use super::backend::{Pool, conflict_or_db, db, now_ms, on_pool, on_write};
use super::{PrincipalRow, StoreError, TokenRow, rows};

/// Idempotent: concurrent first logins of one name end up with one principal.
const INSERT_PRINCIPAL: &str = "INSERT INTO principals (id, name, created_at_ms) \
     VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";

const INSERT_TOKEN: &str = "INSERT INTO tokens \
     (id, principal_id, name, hash, created_at_ms, last_used_ms, revoked) \
     VALUES ($1, $2, $3, $4, $5, NULL, FALSE)";

pub(super) async fn ensure_principal(pool: &Pool, name: &str) -> Result<PrincipalRow, StoreError> {
    on_write!(pool, |p| {
        sqlx::query(INSERT_PRINCIPAL)
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(name)
            .bind(now_ms())
            .execute(p)
            .await
            .map_err(db)?;
        let row = sqlx::query("SELECT id, name, created_at_ms FROM principals WHERE name = $1")
            .bind(name)
            .fetch_one(p)
            .await
            .map_err(db)?;
        rows::principal_row(&row).map_err(db)
    })
}

pub(super) async fn insert_token(
    pool: &Pool,
    principal_id: &str,
    name: &str,
    hash: &str,
) -> Result<TokenRow, StoreError> {
    let token = TokenRow {
        id: uuid::Uuid::new_v4().to_string(),
        principal_id: principal_id.to_owned(),
        name: name.to_owned(),
        created_at_ms: now_ms(),
        last_used_ms: None,
        revoked: false,
    };
    on_write!(pool, |p| {
        sqlx::query(INSERT_TOKEN)
            .bind(&token.id)
            .bind(&token.principal_id)
            .bind(&token.name)
            .bind(hash)
            .bind(token.created_at_ms)
            .execute(p)
            .await
            .map(drop)
            .map_err(conflict_or_db(|| {
                format!("token not stored: unknown principal {principal_id} or hash in use")
            }))
    })?;
    Ok(token)
}

pub(super) async fn token_by_hash(
    pool: &Pool,
    hash: &str,
) -> Result<Option<(TokenRow, PrincipalRow)>, StoreError> {
    on_write!(pool, |p| {
        let Some(token) = sqlx::query(
            "UPDATE tokens SET last_used_ms = $2 WHERE hash = $1 AND NOT revoked \
             RETURNING id, principal_id, name, created_at_ms, last_used_ms, revoked",
        )
        .bind(hash)
        .bind(now_ms())
        .fetch_optional(p)
        .await
        .map_err(db)?
        else {
            return Ok(None);
        };
        let token = rows::token_row(&token).map_err(db)?;
        let principal = sqlx::query("SELECT id, name, created_at_ms FROM principals WHERE id = $1")
            .bind(&token.principal_id)
            .fetch_optional(p)
            .await
            .map_err(db)?;
        match principal {
            Some(principal) => Ok(Some((token, rows::principal_row(&principal).map_err(db)?))),
            None => Ok(None),
        }
    })
}

pub(super) async fn list_tokens(pool: &Pool) -> Result<Vec<TokenRow>, StoreError> {
    on_pool!(pool, |p| {
        let found = sqlx::query(
            "SELECT id, principal_id, name, created_at_ms, last_used_ms, revoked FROM tokens \
             ORDER BY created_at_ms, id",
        )
        .fetch_all(p)
        .await
        .map_err(db)?;
        found
            .iter()
            .map(rows::token_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(db)
    })
}

pub(super) async fn revoke_token(pool: &Pool, id: &str) -> Result<bool, StoreError> {
    let revoked = on_write!(pool, |p| {
        sqlx::query("UPDATE tokens SET revoked = TRUE WHERE id = $1 AND NOT revoked")
            .bind(id)
            .execute(p)
            .await
            .map_err(db)?
            .rows_affected()
    });
    Ok(revoked > 0)
}

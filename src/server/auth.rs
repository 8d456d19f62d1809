//! Who a connection belongs to: bearer tokens checked before the WebSocket upgrade.
//!
//! Only a token's SHA-256 is stored. On the first start with no token, acpd creates one for
//! the local user and writes the secret to a 0600 file in the data directory.
//!
//! The audit lines here (`acpd::audit`: a token used or refused) name the client's address
//! through the connection's span (`conn{peer=…}`), which every listener opens around what a
//! connection does (`transport::listen::serve_connection`, `server::tcp`).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::ServeError;
use crate::config::Config;
use acpd_store::Store;

/// The principal of the machine's own user (and of every client under `--no-auth`).
pub const LOCAL_PRINCIPAL: &str = "local";

pub use acpd_wire::local::TOKEN_FILE;

/// Who a connection speaks for, and with which token (none under `--no-auth`).
#[derive(Debug, Clone)]
pub struct Identity {
    pub principal: String,
    /// The principal's name: what `roots` in the config is keyed by.
    pub name: String,
    pub token_id: Option<String>,
}

/// Why a token secret was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Unknown or revoked.
    Invalid,
    /// The store could not be asked.
    Unavailable,
}

/// The secret of an `Authorization` value: the scheme `Bearer` is case-insensitive
/// (RFC 9110 11.1), blanks around the secret are dropped.
fn bearer_secret(value: &str) -> Option<&str> {
    let (scheme, secret) = value.trim_start().split_once([' ', '\t'])?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

#[derive(Clone)]
pub struct Auth {
    required: bool,
    store: Store,
    local_id: String,
}

impl Auth {
    pub async fn setup(config: &Config, store: Store) -> Result<Auth, ServeError> {
        let local = store.ensure_principal(LOCAL_PRINCIPAL).await?;
        let auth = Auth {
            required: !config.no_auth,
            store: store.clone(),
            local_id: local.id.clone(),
        };
        if config.no_auth {
            tracing::warn!(
                "authentication is OFF (--no-auth): any local process can drive the agents"
            );
            return Ok(auth);
        }
        let live = store.list_tokens().await?.into_iter().any(|t| !t.revoked);
        let path = config.data_dir.join(TOKEN_FILE);
        if !live {
            let secret = new_secret();
            store
                .insert_token(&local.id, LOCAL_PRINCIPAL, &hash(&secret))
                .await?;
            write_secret(&path, &secret)
                .map_err(|e| ServeError::Auth(format!("cannot write {}: {e}", path.display())))?;
            tracing::info!(path = %path.display(), "created an access token for the local user");
        } else if path.exists() {
            tracing::info!(path = %path.display(), "clients authenticate with the token in this file");
        }
        Ok(auth)
    }

    /// The principal a request speaks for, or the 401 it gets.
    #[allow(clippy::result_large_err)]
    pub async fn check(&self, headers: &HeaderMap) -> Result<Identity, Response> {
        if !self.required {
            return Ok(Identity {
                principal: self.local_id.clone(),
                name: LOCAL_PRINCIPAL.to_owned(),
                token_id: None,
            });
        }
        let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return Err(unauthorized("missing bearer token"));
        };
        let Some(secret) = bearer_secret(value) else {
            return Err(unauthorized("expected Authorization: Bearer <token>"));
        };
        match self.check_secret(secret).await {
            Ok(identity) => Ok(identity),
            Err(Denied::Invalid) => Err(unauthorized("invalid token")),
            Err(Denied::Unavailable) => {
                Err((StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response())
            }
        }
    }

    /// The principal a token secret speaks for (also the TCP listener's `_acpd/auth`).
    pub async fn check_secret(&self, secret: &str) -> Result<Identity, Denied> {
        match self.store.token_by_hash(&hash(secret)).await {
            Ok(Some((token, principal))) => {
                tracing::info!(target: "acpd::audit", token = %token.id, principal = %principal.name, "token used");
                Ok(Identity {
                    principal: principal.id,
                    name: principal.name,
                    token_id: Some(token.id),
                })
            }
            Ok(None) => {
                tracing::warn!(target: "acpd::audit", "rejected an unknown or revoked token");
                Err(Denied::Invalid)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot check a token");
                Err(Denied::Unavailable)
            }
        }
    }

    pub fn local_principal(&self) -> &str {
        &self.local_id
    }
}

fn unauthorized(reason: &'static str) -> Response {
    let mut r = (StatusCode::UNAUTHORIZED, format!("{reason}\n")).into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// A fresh secret: 244 random bits from the OS generator (two v4 UUIDs).
pub fn new_secret() -> String {
    format!(
        "acpd_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// What the store keeps of a token secret (the web console's credentials are hashed alike).
pub fn hash(secret: &str) -> String {
    crate::web::sha256_hex(secret)
}

fn write_secret(path: &PathBuf, secret: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // `mode` applies only when the file is created; one left by an older acpd may be 0644.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{secret}")
}

#[cfg(test)]
mod tests {
    use super::bearer_secret;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer s", "bearer s", "BEARER  s ", "bEaReR\ts"] {
            assert_eq!(bearer_secret(v), Some("s"), "{v:?}");
        }
        for v in ["Basic s", "Bearer", "Bearer  ", "Bearers s", "s"] {
            assert_eq!(bearer_secret(v), None, "{v:?}");
        }
    }
}

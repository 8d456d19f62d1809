//! What `acpd serve` tells a person at start: where it listens, where the token is, a ready
//! console sign-in link, and whether the default agent can answer at all.

use std::net::SocketAddr;

use acpd_store::Store;

use crate::config::{BUILTIN_AGENT, Config};
use crate::server::{self, LOCAL_PRINCIPAL};

/// A single-use console sign-in link for `principal` at `base`, valid within `ttl`
/// (`acpd web-login`, and `serve`'s start message): only the code's hash is stored, and the
/// code is in the fragment, which a browser never sends to a server.
pub(super) async fn sign_in_link(
    store: &Store,
    principal: &str,
    ttl: std::time::Duration,
    base: &str,
) -> Result<Option<String>, acpd_store::StoreError> {
    // Only a principal that exists (a token was made for it; the local one is the daemon's
    // own): a typo must not make a principal whose sign-ins no token revocation reaches.
    let p = if principal == LOCAL_PRINCIPAL {
        store.ensure_principal(principal).await?
    } else {
        match store.principal_by_name(principal).await? {
            Some(p) => p,
            None => return Ok(None),
        }
    };
    let secret = server::auth_secret();
    let expires = chrono::Utc::now().timestamp_millis() + ttl.as_millis() as i64;
    store
        .insert_web_login(&server::auth_hash(&secret), &p.id, expires)
        .await?;
    tracing::info!(target: "acpd::audit", %principal, "web console sign-in link created");
    Ok(Some(format!(
        "{}/login#code={secret}",
        base.trim_end_matches('/')
    )))
}

/// How long the start message's sign-in link stays valid.
const LINK_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// Logs what a person needs next, once `serve` is bound to `addr`: the address, the token
/// file, the console (with a sign-in link when a token is required), and a warning when the
/// default agent cannot answer. A failure here costs the link, never the start.
pub(super) async fn announce(config: &Config, addr: SocketAddr) {
    let mut shown = addr;
    if shown.ip().is_unspecified() {
        shown.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let (ws, http) = if config.tls.is_some() {
        ("wss", "https")
    } else {
        ("ws", "http")
    };
    tracing::info!("editors connect to {ws}://{shown}/acp (acp-shim, or ACP over WebSocket)");
    if !config.no_auth {
        let token = config.data_dir.join(acpd_wire::local::TOKEN_FILE);
        tracing::info!("clients authenticate with the token in {}", token.display());
    }
    if config.web_console {
        let base = format!("{http}://{shown}");
        if config.no_auth {
            tracing::info!("web console: {base}/");
        } else {
            match console_link(config, &base).await {
                Ok(link) => tracing::info!(
                    "web console: sign in within {} min at {link} (single use; \
                     another: acpd web-login)",
                    LINK_TTL.as_secs() / 60
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "web console at {base}/: no sign-in link (run acpd web-login)"
                ),
            }
        }
    }
    if config.default_agent == BUILTIN_AGENT {
        match acpd_builtin::BuiltinConfig::parse(&config.builtin, &config.data_dir) {
            Ok(builtin) => {
                if let Some(problem) = acpd_builtin::model_problem(&builtin) {
                    tracing::warn!("{problem}");
                }
            }
            Err(e) => tracing::warn!("the built-in agent cannot start: {e}"),
        }
    }
}

/// A sign-in link for the local user, made on a store connection of its own (the daemon's
/// own is not open yet; this one is closed before it is).
async fn console_link(config: &Config, base: &str) -> Result<String, String> {
    super::ensure_data_dir(config)?;
    let store = Store::open(
        &config.store_url,
        crate::session::journal_form::store_options(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let link = sign_in_link(&store, LOCAL_PRINCIPAL, LINK_TTL, base).await;
    store.close().await;
    link.map_err(|e| e.to_string())?
        .ok_or_else(|| "the local principal has no sign-in".to_owned())
}

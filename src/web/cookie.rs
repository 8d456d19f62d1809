//! The console's sign-in: a one-time code (from `acpd web-login`) or a pasted bearer token is
//! exchanged once for a random cookie credential, stored hashed like tokens and bound to the
//! principal (and to the token, when it came from one). The cookie is HttpOnly,
//! SameSite=Strict, Secure (and `__Host-`) under TLS.
//!
//! CSRF: SameSite=Strict keeps the cookie off cross-site requests, and every state-changing
//! request and the WebSocket upgrade must carry the console's own `Origin` as well
//! (`is_own_origin`), so a page elsewhere can neither post with it nor open `/acp` with it.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{WebIdentity, WebState};
use crate::config::normalize_origin;
use acpd_store::{WebSessionRow, WebStore};

/// The cookie's name over plain HTTP (loopback, an ssh forward).
const COOKIE: &str = "acpd_web";
/// Under TLS: the `__Host-` prefix makes the browser insist on Secure, `Path=/`, no Domain.
const COOKIE_TLS: &str = "__Host-acpd_web";

fn cookie_name(tls: bool) -> &'static str {
    if tls { COOKIE_TLS } else { COOKIE }
}

/// Lowercase hex SHA-256: what the store keeps of every secret.
pub fn sha256_hex(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The console cookie's value in a request, if it has one.
pub fn secret(headers: &HeaderMap, tls: bool) -> Option<String> {
    let name = cookie_name(tls);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| v.to_owned())
}

/// Whether the request's `Origin` is the console's own: the scheme acpd serves and the host
/// the request was sent to. A request without `Origin` is not.
pub fn is_own_origin(headers: &HeaderMap, uri: &Uri, tls: bool) -> bool {
    let Some(origin) = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .and_then(normalize_origin)
    else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.to_string()));
    let scheme = if tls { "https" } else { "http" };
    host.and_then(|h| normalize_origin(&format!("{scheme}://{h}")))
        .is_some_and(|own| own == origin)
}

/// Whether the request was addressed to this machine by a loopback name (`localhost`,
/// `127.x.x.x`, `[::1]`). Under `--no-auth` the console answers only such requests: a page
/// whose DNS name was rebound to 127.0.0.1 names its own host, and is refused.
pub fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The identity of the request's cookie; `Ok(None)` without a valid one.
pub async fn identity(
    store: &WebStore,
    headers: &HeaderMap,
    tls: bool,
) -> Result<Option<WebIdentity>, Response> {
    let Some(secret) = secret(headers, tls) else {
        return Ok(None);
    };
    match store.web_session(&sha256_hex(&secret)).await {
        Ok(Some((row, principal))) => Ok(Some(WebIdentity {
            principal: principal.id,
            name: principal.name,
            token_id: row.token_id,
        })),
        Ok(None) => Ok(None),
        Err(e) => {
            tracing::error!(error = %e, "web console: cannot check a cookie");
            Err((StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response())
        }
    }
}

#[derive(Deserialize)]
pub struct LoginBody {
    code: Option<String>,
    token: Option<String>,
}

fn refused(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// `POST /web/api/login {code} | {token}`: sets the cookie.
pub async fn login(State(st): State<WebState>, Json(body): Json<LoginBody>) -> Response {
    let store = &st.store;
    let found = match (body.code.as_deref(), body.token.as_deref()) {
        (Some(code), _) => match store.take_web_login(&sha256_hex(code.trim())).await {
            Ok(Some(principal)) => store
                .principal(&principal)
                .await
                .map(|p| p.map(|p| (p, None))),
            Ok(None) => {
                tracing::warn!(target: "acpd::audit", "web console: refused a used, expired or unknown sign-in code");
                return refused(
                    StatusCode::GONE,
                    "This sign-in link was already used or has expired. Run `acpd web-login` for a new one.",
                );
            }
            Err(e) => Err(e),
        },
        (None, Some(token)) => store
            .token_by_hash(&sha256_hex(token.trim()))
            .await
            .map(|found| found.map(|(t, p)| (p, Some(t.id)))),
        (None, None) => {
            return refused(StatusCode::BAD_REQUEST, "send a code or a token");
        }
    };
    let (principal, token_id) = match found {
        Ok(Some(found)) => found,
        Ok(None) => {
            tracing::warn!(target: "acpd::audit", "web console: refused an unknown or revoked token");
            return refused(StatusCode::UNAUTHORIZED, "That token is not valid.");
        }
        Err(e) => {
            tracing::error!(error = %e, "web console: sign-in failed");
            return refused(StatusCode::SERVICE_UNAVAILABLE, "The store is unavailable.");
        }
    };
    let secret = new_secret();
    let now = chrono::Utc::now().timestamp_millis();
    let ttl = st.config.web_session_ttl;
    let row = WebSessionRow {
        hash: sha256_hex(&secret),
        principal_id: principal.id.clone(),
        token_id: token_id.clone(),
        created_at_ms: now,
        expires_at_ms: now.saturating_add(ttl.as_millis() as i64),
    };
    if let Err(e) = store.insert_web_session(&row).await {
        tracing::error!(error = %e, "web console: cannot store a web session");
        return refused(StatusCode::SERVICE_UNAVAILABLE, "The store is unavailable.");
    }
    let how = if token_id.is_some() { "token" } else { "code" };
    tracing::info!(target: "acpd::audit", principal = %principal.name, how, "web console: signed in");
    let cookie = set_cookie(st.tls(), &secret, ttl.as_secs());
    let mut resp = Json(json!({ "principal": principal.name })).into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

/// `POST /web/api/logout`: the credential is deleted and the cookie cleared.
pub async fn logout(State(st): State<WebState>, headers: HeaderMap) -> Response {
    if let Some(secret) = secret(&headers, st.tls())
        && let Err(e) = st.store.delete_web_session(&sha256_hex(&secret)).await
    {
        tracing::error!(error = %e, "web console: cannot delete a web session");
        return refused(StatusCode::SERVICE_UNAVAILABLE, "The store is unavailable.");
    }
    let mut resp = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&set_cookie(st.tls(), "", 0)) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

fn set_cookie(tls: bool, value: &str, max_age_secs: u64) -> String {
    let secure = if tls { "; Secure" } else { "" };
    format!(
        "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{secure}",
        cookie_name(tls)
    )
}

/// A fresh credential: 244 random bits from the OS generator, like tokens.
fn new_secret() -> String {
    format!(
        "acpdw_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let h = headers(&[("cookie", "a=1; acpd_web=s3cret; b=2")]);
        assert_eq!(secret(&h, false).as_deref(), Some("s3cret"));
        assert_eq!(secret(&h, true), None);
        let h = headers(&[("cookie", "x=1"), ("cookie", "__Host-acpd_web=t")]);
        assert_eq!(secret(&h, true).as_deref(), Some("t"));
        assert_eq!(secret(&headers(&[("cookie", "acpd_web=")]), false), None);
    }

    #[test]
    fn only_the_consoles_own_origin_is_own() {
        let uri: Uri = "/web/api/login".parse().unwrap();
        let own = |origin: &str, host: &str, tls| {
            is_own_origin(&headers(&[("origin", origin), ("host", host)]), &uri, tls)
        };
        assert!(own("http://127.0.0.1:7420", "127.0.0.1:7420", false));
        assert!(own("https://box.example", "box.example:443", true));
        assert!(!own("http://box.example", "box.example", true));
        assert!(!own("http://evil.test", "127.0.0.1:7420", false));
        assert!(!own("null", "127.0.0.1:7420", false));
        assert!(!is_own_origin(
            &headers(&[("host", "127.0.0.1:7420")]),
            &uri,
            false
        ));
    }

    #[test]
    fn loopback_hosts_are_named_by_loopback_names_only() {
        for h in [
            "127.0.0.1:7420",
            "localhost:1",
            "[::1]:7420",
            "127.1.2.3",
            "LOCALHOST",
        ] {
            assert!(loopback_host(&headers(&[("host", h)])), "{h}");
        }
        for h in [
            "evil.test:7420",
            "10.0.0.1:7420",
            "localhost.evil.test",
            "[::2]:1",
        ] {
            assert!(!loopback_host(&headers(&[("host", h)])), "{h}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn cookies_are_strict_and_http_only() {
        let c = set_cookie(true, "v", 60);
        assert!(c.starts_with("__Host-acpd_web=v; Path=/; HttpOnly; SameSite=Strict"));
        assert!(c.ends_with("; Secure"));
        assert!(!set_cookie(false, "v", 60).contains("Secure"));
    }
}

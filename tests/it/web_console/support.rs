//! What the web console tests share: sign-in links from `acpd web-login`, the exchange for a
//! cookie over HTTP, and requests that carry it.

use crate::support::http::{Resp, request_path};
use crate::support::security_support::{acpd, local_token};
use crate::support::{Daemon, DaemonOptions};

/// A daemon with auth on and `config` (a file), and the local principal's token.
pub async fn daemon_with_config(config: &std::path::Path) -> (Daemon, String) {
    let d = Daemon::start_with(
        DaemonOptions::default()
            .auth()
            .arg("--config", config.display()),
    )
    .await;
    let token = local_token(&d).await;
    (d, token)
}

/// The console's own origin as the browser (and these requests) name it.
pub fn origin(daemon: &Daemon) -> String {
    format!("http://{}", daemon.addr)
}

/// `acpd web-login --principal NAME` against the daemon's store: the link it prints.
pub async fn sign_in_link(daemon: &Daemon, principal: &str, ttl: &str) -> String {
    // The daemon migrates the store first (its first-start token is written after that).
    local_token(daemon).await;
    let data = daemon.dir().join("data").display().to_string();
    let store = daemon.store_url();
    let url = origin(daemon);
    let run = acpd(&[
        "web-login",
        "--principal",
        principal,
        "--ttl",
        ttl,
        "--url",
        &url,
        "--data-dir",
        &data,
        "--store",
        &store,
    ])
    .await;
    assert_eq!(run.code, Some(0), "web-login failed: {}", run.stderr);
    let link = run.stdout.trim().to_string();
    assert!(
        link.starts_with(&format!("{url}/login#code=")),
        "web-login printed {link:?}"
    );
    link
}

/// The one-time code of a sign-in link (its fragment).
pub fn code_of(link: &str) -> &str {
    link.split_once("#code=").expect("a code in the fragment").1
}

/// `POST /web/api/login` with `body`, from `origin` (`None`: no Origin header).
pub async fn login(daemon: &Daemon, body: &str, origin: Option<&str>) -> Resp {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(o) = origin {
        headers.push(("Origin", o));
    }
    request_path(daemon.addr, "POST", "/web/api/login", &headers, body).await
}

/// Signs in with a fresh link for `principal`; returns the `name=value` cookie pair.
pub async fn cookie_for(daemon: &Daemon, principal: &str) -> String {
    let link = sign_in_link(daemon, principal, "5m").await;
    let body = serde_json::json!({ "code": code_of(&link) }).to_string();
    let resp = login(daemon, &body, Some(&origin(daemon))).await;
    assert_eq!(resp.status, 200, "login: {}", resp.body);
    set_cookie_pair(&resp)
}

/// The `name=value` part of a response's `Set-Cookie`.
pub fn set_cookie_pair(resp: &Resp) -> String {
    let set = resp.header("set-cookie").expect("a Set-Cookie header");
    set.split(';').next().unwrap_or_default().to_string()
}

/// A GET with the cookie.
pub async fn get(daemon: &Daemon, path: &str, cookie: &str) -> Resp {
    request_path(daemon.addr, "GET", path, &[("Cookie", cookie)], "").await
}

/// `acpd_web_csp_violations_total` from `/metrics` (read with a bearer token).
pub async fn csp_violations(daemon: &Daemon, token: &str) -> u64 {
    let (k, v) = crate::support::security_support::bearer(token);
    let m = request_path(daemon.addr, "GET", "/metrics", &[(k, &v)], "").await;
    m.body
        .lines()
        .find_map(|l| l.strip_prefix("acpd_web_csp_violations_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no CSP counter in /metrics:\n{}", m.body))
}

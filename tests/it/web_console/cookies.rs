//! The console's cookie rules over real HTTP: no cookie, the one-time code, Origin checks on
//! state-changing requests and on the `/acp` upgrade, expiry, revocation, sign-out, and
//! another principal's session.

use serde_json::json;

use super::support::{code_of, cookie_for, get, login, origin, set_cookie_pair, sign_in_link};
use crate::support::http::request_path;
use crate::support::security_support::{
    acpd, bearer, client, local_token, token_create, upgrade_status,
};
use crate::support::{Daemon, DaemonOptions};

async fn daemon() -> Daemon {
    Daemon::start_with(DaemonOptions::default().auth()).await
}

#[tokio::test]
async fn without_a_cookie_the_api_is_401_and_pages_send_to_sign_in() {
    let d = daemon().await;
    local_token(&d).await;
    for path in [
        "/web/api/sessions",
        "/web/api/me",
        "/web/api/sessions/x/entries",
    ] {
        let r = request_path(d.addr, "GET", path, &[], "").await;
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    let r = request_path(d.addr, "GET", "/", &[], "").await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/login"));
    let r = request_path(d.addr, "GET", "/login", &[], "").await;
    assert_eq!(r.status, 200);
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.starts_with("default-src 'self'; script-src 'self';"),
        "{csp}"
    );
    assert!(!r.body.contains("<script>"), "no inline script: {}", r.body);
    let js = request_path(d.addr, "GET", "/web/session.js", &[], "").await;
    assert_eq!(js.status, 200);
    assert!(
        js.header("content-type")
            .unwrap_or_default()
            .starts_with("text/javascript")
    );
}

#[tokio::test]
async fn a_sign_in_code_works_once_and_sets_a_strict_http_only_cookie() {
    let d = daemon().await;
    let link = sign_in_link(&d, "local", "90s").await;
    let body = json!({ "code": code_of(&link) }).to_string();
    let first = login(&d, &body, Some(&origin(&d))).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let set = first.header("set-cookie").unwrap_or_default();
    for part in ["acpd_web=", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(part), "{part} in {set}");
    }
    assert!(!set.contains("Secure"), "no Secure over plain HTTP: {set}");
    let cookie = set_cookie_pair(&first);
    let me = get(&d, "/web/api/me", &cookie).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.json()["principal"], "local");
    let second = login(&d, &body, Some(&origin(&d))).await;
    assert_eq!(second.status, 410, "{}", second.body);
    assert!(
        second.json()["error"]
            .as_str()
            .unwrap_or_default()
            .contains("already used")
    );
    let wrong = login(
        &d,
        &json!({ "code": "acpd_nope" }).to_string(),
        Some(&origin(&d)),
    )
    .await;
    assert_eq!(wrong.status, 410);
}

#[tokio::test]
async fn state_changing_requests_and_upgrades_need_the_consoles_origin() {
    let d = daemon().await;
    let link = sign_in_link(&d, "local", "5m").await;
    let body = json!({ "code": code_of(&link) }).to_string();
    assert_eq!(login(&d, &body, Some("http://evil.test")).await.status, 403);
    assert_eq!(login(&d, &body, None).await.status, 403);
    // Refused before the code was looked at: it still works from the console.
    let ok = login(&d, &body, Some(&origin(&d))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let cookie = set_cookie_pair(&ok);
    let logout = request_path(
        d.addr,
        "POST",
        "/web/api/logout",
        &[("Cookie", &cookie), ("Origin", "http://evil.test")],
        "",
    )
    .await;
    assert_eq!(logout.status, 403);
    assert_eq!(get(&d, "/web/api/me", &cookie).await.status, 200);

    let url = d.ws_url();
    let own = origin(&d);
    let (status, _) = upgrade_status(
        &url,
        &[("Cookie", &cookie), ("Origin", "http://evil.test")],
        None,
    )
    .await;
    assert_eq!(status, 403, "a foreign origin riding on the cookie");
    let (status, _) = upgrade_status(&url, &[("Cookie", &cookie)], None).await;
    assert_eq!(status, 403, "the cookie without the console's origin");
    let (status, _) = upgrade_status(&url, &[("Origin", &own)], None).await;
    assert_eq!(status, 401, "the console's origin without a credential");
    let mut c = client(&url, &[("Cookie", &cookie), ("Origin", &own)], None).await;
    let sid = c.new_session(&d.work_dir()).await;
    assert!(!sid.is_empty());
}

#[tokio::test]
async fn expired_revoked_and_signed_out_cookies_are_refused() {
    let d = daemon().await;
    local_token(&d).await;
    // Expiry: rows written straight into the store, one past its end and one not.
    let store = acpd_store::Store::open(&d.store_url(), acpd_store::StoreOptions::default())
        .await
        .expect("open the daemon's store");
    let local = store.ensure_principal("local").await.expect("principal");
    let now = chrono::Utc::now().timestamp_millis();
    for (secret, expires) in [("acpdw_expired", now - 1000), ("acpdw_fresh", now + 60_000)] {
        let row = acpd_store::WebSessionRow {
            hash: sha256_hex(secret),
            principal_id: local.id.clone(),
            token_id: None,
            created_at_ms: now - 2000,
            expires_at_ms: expires,
        };
        store.insert_web_session(&row).await.expect("insert");
    }
    store.close().await;
    assert_eq!(
        get(&d, "/web/api/me", "acpd_web=acpdw_expired")
            .await
            .status,
        401
    );
    assert_eq!(
        get(&d, "/web/api/me", "acpd_web=acpdw_fresh").await.status,
        200
    );

    // Revocation: a cookie from bob's token and one from a link for bob both end with it.
    let secret = token_create(&d, "bob").await;
    let from_token = login(
        &d,
        &json!({ "token": secret }).to_string(),
        Some(&origin(&d)),
    )
    .await;
    assert_eq!(from_token.status, 200, "{}", from_token.body);
    let by_token = set_cookie_pair(&from_token);
    let by_link = cookie_for(&d, "bob").await;
    assert_eq!(
        get(&d, "/web/api/me", &by_token).await.json()["principal"],
        "bob"
    );
    assert_eq!(get(&d, "/web/api/me", &by_link).await.status, 200);
    let args = [
        "--data-dir".to_string(),
        d.dir().join("data").display().to_string(),
        "--store".into(),
        d.store_url(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let list = acpd(&[&["token", "list"], args.as_slice()].concat()).await;
    let id = list
        .stdout
        .lines()
        .find(|l| l.split('\t').nth(1) == Some("bob"))
        .and_then(|l| l.split('\t').next())
        .expect("bob's token in the list")
        .to_string();
    let revoke = acpd(&[&["token", "revoke", &id], args.as_slice()].concat()).await;
    assert_eq!(revoke.code, Some(0), "{}", revoke.stderr);
    assert_eq!(get(&d, "/web/api/me", &by_token).await.status, 401);
    assert_eq!(get(&d, "/web/api/me", &by_link).await.status, 401);

    // Sign-out deletes the credential and clears the cookie.
    let cookie = cookie_for(&d, "local").await;
    let out = request_path(
        d.addr,
        "POST",
        "/web/api/logout",
        &[("Cookie", &cookie), ("Origin", &origin(&d))],
        "",
    )
    .await;
    assert_eq!(out.status, 204);
    assert!(
        out.header("set-cookie")
            .unwrap_or_default()
            .contains("Max-Age=0")
    );
    assert_eq!(get(&d, "/web/api/me", &cookie).await.status, 401);
}

fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn another_principals_session_is_not_reachable_by_url() {
    let d = daemon().await;
    let bob_secret = token_create(&d, "bob").await;
    let (k, v) = bearer(&bob_secret);
    let mut bob = client(&d.ws_url(), &[(k, &v)], None).await;
    let sid = bob.new_session(&d.work_dir()).await;
    let mine = cookie_for(&d, "local").await;
    let theirs = cookie_for(&d, "bob").await;
    let paths = [
        format!("/s/{sid}"),
        format!("/web/api/sessions/{sid}"),
        format!("/web/api/sessions/{sid}/entries"),
    ];
    for path in &paths {
        let r = get(&d, path, &mine).await;
        assert_eq!(r.status, 404, "{path} as another principal");
        let unknown = get(
            &d,
            &path.replace(&sid, "00000000-0000-0000-0000-000000000000"),
            &mine,
        )
        .await;
        assert_eq!(
            (unknown.status, unknown.body),
            (r.status, r.body),
            "{path}: like an unknown id"
        );
        assert_eq!(
            get(&d, path, &theirs).await.status,
            200,
            "{path} as its owner"
        );
    }
    let list = get(&d, "/web/api/sessions", &mine).await.json();
    assert!(!list.to_string().contains(&sid), "{list}");
}

#[tokio::test]
async fn no_web_console_turns_it_off() {
    let mut opts = DaemonOptions::default().auth();
    opts.args.push("--no-web-console".into());
    let d = Daemon::start_with(opts).await;
    local_token(&d).await;
    for path in ["/", "/login", "/web/session.js"] {
        let r = request_path(d.addr, "GET", path, &[], "").await;
        assert_eq!(r.status, 404, "{path}");
    }
}

/// One raw request with the given `Host` (the harness's client always sends the real one).
async fn with_host(d: &Daemon, path: &str, host: &str, extra: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(d.addr)
        .await
        .expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(crate::support::DEFAULT_TIMEOUT, s.read_to_end(&mut out));
    read.await.expect("an answer in time").expect("read");
    let text = String::from_utf8_lossy(&out);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn without_auth_the_console_answers_loopback_names_only() {
    let d = Daemon::start().await;
    let port = d.addr.port();
    let own = format!("127.0.0.1:{port}");
    assert_eq!(with_host(&d, "/web/api/sessions", &own, "").await, 200);
    assert_eq!(
        with_host(&d, "/web/api/sessions", &format!("localhost:{port}"), "").await,
        200
    );
    // A rebound DNS name: the page's own origin, but not a name of this machine.
    let evil = format!("evil.test:{port}");
    assert_eq!(with_host(&d, "/web/api/sessions", &evil, "").await, 401);
    let upgrade = format!(
        "Origin: http://{evil}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    assert_eq!(with_host(&d, "/acp", &evil, &upgrade).await, 403);
}

#[tokio::test]
async fn a_too_short_sign_in_lifetime_is_a_config_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().display().to_string();
    let run = acpd(&[
        "check-config",
        "--web-session-ttl-secs",
        "5",
        "--data-dir",
        &data,
    ])
    .await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    assert!(
        run.stderr.contains("web_session_ttl_secs"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "{}", run.stderr);
}

#[tokio::test]
async fn an_allowed_origin_is_trusted_like_the_consoles_own() {
    // The public origin of a proxy that terminates TLS in front of acpd.
    let d = Daemon::start_with(
        DaemonOptions::default()
            .auth()
            .arg("--allowed-origin", "https://console.example"),
    )
    .await;
    let link = sign_in_link(&d, "local", "5m").await;
    let body = json!({ "code": code_of(&link) }).to_string();
    assert_eq!(
        login(&d, &body, Some("https://other.example")).await.status,
        403
    );
    let ok = login(&d, &body, Some("https://console.example")).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let cookie = set_cookie_pair(&ok);
    let headers = [
        ("Cookie", cookie.as_str()),
        ("Origin", "https://console.example"),
    ];
    let (status, _) = upgrade_status(&d.ws_url(), &headers, None).await;
    assert_eq!(status, 101);
}

//! The console's low-severity holes (issue 40, item 8), over a real daemon: `web-login`
//! refuses a principal nobody created, `POST /web/csp` is rate-limited and logged as a count,
//! a `Content-Length` past the body limit is `413` before any body is read, and agent-made
//! Markdown keeps no `file:` or protocol-relative link.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::{cookie_for, csp_violations, get, origin, sign_in_link};
use crate::support::security_support::{acpd, bearer, client, local_token, token_create};
use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn web_login_refuses_a_principal_nobody_created() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    local_token(&d).await;
    let data = d.dir().join("data").display().to_string();
    let store = d.store_url();
    let url = origin(&d);
    let login = |name: &'static str| {
        let (data, store, url) = (data.clone(), store.clone(), url.clone());
        async move {
            acpd(&[
                "web-login",
                "--principal",
                name,
                "--url",
                &url,
                "--data-dir",
                &data,
                "--store",
                &store,
            ])
            .await
        }
    };
    let typo = login("bbo").await;
    assert_eq!(typo.code, Some(64), "{}", typo.stderr);
    assert!(
        typo.stderr.contains("no principal named"),
        "{}",
        typo.stderr
    );
    assert!(typo.stdout.is_empty(), "no link: {}", typo.stdout);
    // Refused again: the first try created nothing.
    assert_eq!(login("bbo").await.code, Some(64));
    // A principal with a token signs in as before.
    token_create(&d, "bob").await;
    sign_in_link(&d, "bob", "5m").await;
}

#[tokio::test]
async fn a_csp_report_flood_is_rate_limited_and_logged_as_a_count() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    let report = json!({ "csp-report": { "violated-directive": "script-src" } }).to_string();
    let mut taken = 0;
    let mut refused = 0;
    for _ in 0..100 {
        let r = crate::support::http::request_path(
            d.addr,
            "POST",
            "/web/csp",
            &[("Content-Type", "application/csp-report")],
            &report,
        )
        .await;
        match r.status {
            204 => taken += 1,
            429 => refused += 1,
            s => panic!("status {s}"),
        }
    }
    assert!(refused > 0, "no report refused ({taken} taken)");
    assert_eq!(csp_violations(&d, &token).await, taken);
    let log = std::fs::read_to_string(d.log_path()).unwrap_or_default();
    let lines = log.matches("Content-Security-Policy violation").count();
    assert_eq!(lines, 1, "one line for the lot, not one per report");
}

/// The status line acpd answers `head` with (without sending a body), within a second.
async fn status_without_body(d: &Daemon, head: &str) -> String {
    let mut s = TcpStream::connect(d.addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    let read = async {
        while !got.windows(2).any(|w| w == b"\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(1), read)
        .await
        .expect("an answer within a second, with the body never sent");
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn an_oversize_content_length_is_413_before_the_body() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    let gib = 1u64 << 30;
    let acp = format!(
        "POST /acp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {gib}\r\n\r\n",
        d.addr
    );
    assert!(
        status_without_body(&d, &acp)
            .await
            .starts_with("HTTP/1.1 413")
    );
    let web = format!(
        "POST /web/api/login HTTP/1.1\r\nHost: {}\r\nOrigin: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {gib}\r\n\r\n",
        d.addr,
        origin(&d)
    );
    assert!(
        status_without_body(&d, &web)
            .await
            .starts_with("HTTP/1.1 413")
    );
}

#[tokio::test]
async fn agent_markdown_keeps_no_file_or_protocol_relative_link() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    let (k, v) = bearer(&token);
    let mut editor = client(&d.ws_url(), &[(k, &v)], None).await;
    let sid = editor.open_session(&d.work_dir()).await;
    let text = "echo [p](file:///etc/passwd) [h](//evil.test/x) [ok](https://ok.test/)";
    let (_, r) = editor.prompt(&sid, text).await;
    r.expect("turn");
    let cookie = cookie_for(&d, "local").await;
    let page = get(&d, &format!("/web/api/sessions/{sid}/entries"), &cookie)
        .await
        .json();
    let html: String = page["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["html"].as_str())
        .collect();
    assert!(html.contains("href=\"https://ok.test/\""), "{html}");
    for bad in ["file:", "//evil.test"] {
        assert!(!html.contains(&format!("href=\"{bad}")), "{bad} in {html}");
    }
}

//! The console's JSON pages over real HTTP: a long conversation is read a page at a time,
//! backwards (never the whole journal), and under TLS the cookie is `Secure` and `__Host-`.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::support::{code_of, cookie_for, csp_violations, get, sign_in_link};
use crate::support::security_support::{bearer, client, local_token, make_cert, trusting};
use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn a_long_conversation_is_read_a_page_at_a_time_backwards() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    let (k, v) = bearer(&token);
    let mut editor = client(&d.ws_url(), &[(k, &v)], None).await;
    let sid = editor.open_session(&d.work_dir()).await;
    let (_, r) = editor
        .prompt(&sid, "echo first\nstream 300 8\necho last")
        .await;
    assert_eq!(r.expect("turn")["stopReason"], "end_turn");
    let cookie = cookie_for(&d, "local").await;
    let url = format!("/web/api/sessions/{sid}/entries");

    let newest = get(&d, &format!("{url}?limit=50"), &cookie).await.json();
    let (first, last) = (seq(&newest["firstSeq"]), seq(&newest["lastSeq"]));
    assert_eq!(last - first, 49, "{newest}");
    assert_eq!(newest["more"], true);
    let html = blocks_html(&newest);
    assert!(html.contains("last") && !html.contains("first"), "{html}");

    let older = get(&d, &format!("{url}?before={first}&limit=50"), &cookie)
        .await
        .json();
    assert_eq!(seq(&older["lastSeq"]), first - 1, "the page just before");
    assert_eq!(older["more"], true);

    // All the way back: the oldest page holds the prompt and the first reply.
    let mut before = first;
    let mut pages = 1;
    let oldest = loop {
        let page = get(&d, &format!("{url}?before={before}&limit=100"), &cookie)
            .await
            .json();
        pages += 1;
        if page["more"] == false {
            break page;
        }
        before = seq(&page["firstSeq"]);
        assert!(pages < 10, "paging back ends");
    };
    let html = blocks_html(&oldest);
    assert!(html.contains("first"), "{html}");
    assert_eq!(oldest["blocks"][0]["kind"], "user");

    // Live catch-up reads after a seq.
    let after = get(&d, &format!("{url}?after={}&limit=10", last - 3), &cookie)
        .await
        .json();
    assert_eq!(seq(&after["firstSeq"]), last - 2);
    assert_eq!(seq(&after["lastSeq"]), last);
    assert_eq!(after["more"], false);
}

fn seq(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("a seq, not {v}"))
}

fn blocks_html(page: &Value) -> String {
    page["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["html"].as_str())
        .collect()
}

#[tokio::test]
async fn under_tls_the_cookie_is_secure_and_host_prefixed() {
    let certs = tempfile::tempdir().expect("temp dir");
    let cert = make_cert(certs.path()).await;
    let d = Daemon::start_with(DaemonOptions {
        args: cert.args(),
        auth: true,
        ..DaemonOptions::default()
    })
    .await;
    let link = sign_in_link(&d, "local", "5m").await;
    let body = json!({ "code": code_of(&link) }).to_string();
    let tcp = tokio::net::TcpStream::connect(d.addr)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let connecting = tokio_rustls::TlsConnector::from(trusting(&cert.cert)).connect(name, tcp);
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .expect("handshake in time")
        .expect("handshake");
    let host = format!("localhost:{}", d.addr.port());
    let head = format!(
        "POST /web/api/login HTTP/1.1\r\nHost: {host}\r\nOrigin: https://{host}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
    // A close without TLS close_notify is fine here: the whole answer has been read.
    let _ = read.expect("an answer in time");
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let set = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no Set-Cookie: {text}"));
    assert!(set.contains("__Host-acpd_web="), "{set}");
    for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
        assert!(set.contains(part), "{part} in {set}");
    }
}

#[tokio::test]
async fn csp_reports_are_counted() {
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    assert_eq!(csp_violations(&d, &token).await, 0, "registered at zero");
    let report =
        json!({ "csp-report": { "violated-directive": "script-src", "blocked-uri": "inline" } });
    let r = crate::support::http::request_path(
        d.addr,
        "POST",
        "/web/csp",
        &[("Content-Type", "application/csp-report")],
        &report.to_string(),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(csp_violations(&d, &token).await, 1);
}

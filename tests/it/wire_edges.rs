//! Small security edges: the bearer scheme is case-insensitive, request ids beyond 2^53
//! come back exactly (or are refused clearly), `/metrics` needs a token.

use serde_json::{Value, json};

use crate::support::security_support::{local_token, upgrade_status};
use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&daemon).await;
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let value = format!("{scheme} {token}");
        let (status, body) =
            upgrade_status(&daemon.ws_url(), &[("authorization", &value)], None).await;
        assert_eq!(status, 101, "{scheme}: {body}");
    }
    let (status, _) = upgrade_status(
        &daemon.ws_url(),
        &[("authorization", &format!("Basic {token}"))],
        None,
    )
    .await;
    assert_eq!(status, 401);
}

/// One line in, the next line out, over raw TCP (the raw text is the point).
async fn exchange(
    r: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    line: &str,
) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    w.write_all(format!("{line}\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    tokio::time::timeout(crate::support::DEFAULT_TIMEOUT, r.read_line(&mut out))
        .await
        .expect("no answer")
        .expect("read");
    out
}

#[tokio::test]
async fn integer_ids_beyond_2_pow_53_are_echoed_exactly_or_refused() {
    let daemon = Daemon::start_with(DaemonOptions::default().tcp()).await;
    let stream = tokio::net::TcpStream::connect(daemon.tcp_addr.expect("tcp"))
        .await
        .expect("connect");
    let (r, mut w) = stream.into_split();
    let mut r = tokio::io::BufReader::new(r);
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;
    assert!(exchange(&mut r, &mut w, init).await.contains("\"result\""));
    for id in [
        "9007199254740993",
        "18446744073709551615",
        "-9223372036854775808",
        "18446744073709551616",
        "-9223372036854775809",
        "123456789012345678901234567890",
    ] {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session/list","params":{{}}}}"#);
        let raw = exchange(&mut r, &mut w, &line).await;
        let reply: Value = serde_json::from_str(&raw).expect("JSON");
        let echoed = reply.get("result").is_some()
            && (raw.contains(&format!("\"id\":{id},")) || raw.contains(&format!("\"id\":{id}}}")));
        let refused = reply["id"] == Value::Null
            && reply["error"]["code"] == json!(-32600)
            && reply["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("id");
        let within_64_bits = id.parse::<i64>().is_ok() || id.parse::<u64>().is_ok();
        assert!(if within_64_bits { echoed } else { refused }, "{id}: {raw}");
    }
}

/// `GET PATH` with extra header lines; the status code and the body.
async fn get(addr: std::net::SocketAddr, path: &str, headers: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(crate::support::DEFAULT_TIMEOUT, s.read_to_end(&mut out))
        .await
        .expect("no answer")
        .expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn metrics_need_a_token_or_their_own_listener() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&daemon).await;
    assert_eq!(get(daemon.addr, "/metrics", "").await.0, 401);
    let auth = format!("Authorization: Bearer {token}\r\n");
    let (status, body) = get(daemon.addr, "/metrics", &auth).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("acpd_"), "{body}");
    // Health checks stay open.
    assert_eq!(get(daemon.addr, "/healthz", "").await.0, 200);

    // Port 0, and the port read from the log: a port found free and let go first can be
    // taken by another test's listener before acpd binds it (failed once that way).
    let opts = DaemonOptions::default()
        .auth()
        .arg("--metrics-listen", "127.0.0.1:0");
    let daemon = Daemon::start_with(opts).await;
    let metrics = {
        let log = std::fs::read_to_string(daemon.log_path()).expect("log");
        crate::support::listening_addr(&log, "metrics listener (no token): ")
            .expect("the metrics listener's address in the log")
    };
    let token = local_token(&daemon).await;
    let auth = format!("Authorization: Bearer {token}\r\n");
    assert_eq!(get(daemon.addr, "/metrics", &auth).await.0, 404);
    let (status, body) = get(metrics, "/metrics", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(metrics, "/acp", "").await.0, 404);
}

//! The authentication audit lines (`acpd::audit`) name the client's address, so an operator
//! can tell who is guessing tokens: a bearer token refused or accepted over HTTP, a web
//! console sign-in code refused, a token refused on the raw TCP listener.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::logging::{sigterm, spawn_piped};
use crate::support::listening_addr;
use crate::support::security_support::read_token;

/// The daemon's stderr, line by line, as the test reads it.
struct Log {
    lines: mpsc::UnboundedReceiver<String>,
    seen: String,
}

impl Log {
    /// The first line from here on that contains `what` (10 s at most).
    async fn line_with(&mut self, what: &str) -> String {
        let wait = async {
            loop {
                let line = self.lines.recv().await.expect("acpd closed its stderr");
                self.seen.push_str(&line);
                if line.contains(what) {
                    return line;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("no log line with {what:?} within 10 s:\n{}", self.seen))
    }
}

/// One HTTP/1.1 request on a socket of our own; its local address and the raw answer.
async fn http(addr: SocketAddr, head: &str, body: &str) -> (SocketAddr, String) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let local = s.local_addr().expect("local address");
    let req = format!(
        "{head}\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    (local, answer)
}

#[tokio::test]
async fn auth_audit_lines_name_the_client_address() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = spawn_piped(dir.path(), &["--tcp-listen", "127.0.0.1:0"], &[]);
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut r = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = r.next_line().await {
            if tx.send(line + "\n").is_err() {
                break;
            }
        }
    });
    let mut log = Log {
        lines,
        seen: String::new(),
    };
    log.line_with("acpd listening: ").await;
    let addr = listening_addr(&log.seen, "acpd listening: ").expect("the listener's address");
    let tcp = match listening_addr(&log.seen, "newline-delimited TCP listener: ") {
        Some(a) => a,
        None => {
            log.line_with("newline-delimited TCP listener: ").await;
            listening_addr(&log.seen, "newline-delimited TCP listener: ").expect("tcp address")
        }
    };

    let (local, answer) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nAuthorization: Bearer acpd_not_a_token",
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let line = log.line_with("rejected an unknown or revoked token").await;
    assert!(line.contains(&format!("peer={local}")), "{line}");

    let token = read_token(&dir.path().join("data")).await;
    let (local, answer) = http(
        addr,
        &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {token}"),
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let line = log.line_with("token used").await;
    assert!(line.contains(&format!("peer={local}")), "{line}");

    let head = format!(
        "POST /web/api/login HTTP/1.1\r\nContent-Type: application/json\r\nOrigin: http://{addr}"
    );
    let (local, answer) = http(addr, &head, r#"{"code":"not-a-code"}"#).await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    let line = log
        .line_with("refused a used, expired or unknown sign-in code")
        .await;
    assert!(line.contains(&format!("peer={local}")), "{line}");

    let mut s = TcpStream::connect(tcp).await.expect("connect tcp");
    let local = s.local_addr().expect("local address");
    let auth = r#"{"jsonrpc":"2.0","id":1,"method":"_acpd/auth","params":{"token":"acpd_nope"}}"#;
    s.write_all(format!("{auth}\n").as_bytes())
        .await
        .expect("send");
    let line = log.line_with("rejected an unknown or revoked token").await;
    assert!(line.contains(&format!("peer={local}")), "{line}");
    drop(s);

    // The log goes on being read until the end, so it never fills the pipe.
    let rest = tokio::spawn(async move { while log.lines.recv().await.is_some() {} });
    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
    let _ = rest.await;
}

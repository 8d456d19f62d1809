//! Connection-level limits at accept: half-open HTTP connections (half a request line) do
//! not stop a real client's session round trip, and each is closed after the header read
//! timeout (`header_read_timeout_ms`, short here so the test is fast), on the plain and the
//! newline TCP listener alike; over `max_pending_connections` the oldest pending one is
//! closed to make room (`listener_starvation.rs` for the floods).

use std::time::Duration;

use futures_util::future::join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{DEFAULT_TIMEOUT, Daemon, DaemonOptions, agent_texts};

/// Half-open connections per listener: more than the 1024 descriptors of a default soft
/// limit, which is what made `accept` fail before acpd raised its own.
const HALF_OPEN: usize = 1100;

async fn half_open(addr: std::net::SocketAddr, bytes: &'static [u8]) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(HALF_OPEN);
    for _ in 0..HALF_OPEN {
        let mut s = tokio::time::timeout(DEFAULT_TIMEOUT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        s.write_all(bytes).await.expect("write");
        conns.push(s);
    }
    conns
}

/// Waits until the daemon closes `s` (EOF or reset); false if it is still open after the
/// deadline.
async fn closed_by_daemon(mut s: TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(DEFAULT_TIMEOUT, s.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[tokio::test]
async fn half_open_connections_neither_stop_real_clients_nor_stay_open() {
    // More sockets than a default soft limit allows.
    crate::listener_starvation::raise_own_nofile(2 * HALF_OPEN + 200);
    let opts = DaemonOptions::default()
        .tcp()
        .arg("--header-read-timeout-ms", 1500);
    let daemon = Daemon::start_with(opts).await;
    let http = half_open(daemon.addr, b"GET /acp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgr").await;
    let tcp = half_open(
        daemon.tcp_addr.expect("tcp"),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,",
    )
    .await;

    // A real client, over the WebSocket listener, while all of them hang on.
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (updates, result) = client.prompt(&sid, "echo still here").await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["still here"]);
    let health = raw_get(daemon.addr, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");

    // Every half-open connection is closed by the daemon, well within the wait (10 s).
    let closed = join_all(http.into_iter().chain(tcp).map(closed_by_daemon)).await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} half-open connections still open");
    // The real client's WebSocket is not a pending connection: it is still served.
    let (_, result) = client.prompt(&sid, "echo after").await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    assert!(
        std::fs::read_to_string(daemon.log_path())
            .unwrap_or_default()
            .contains("open-file limit"),
        "the limit is logged"
    );
}

/// `GET PATH` over a fresh connection; the raw response (empty if the daemon closed or
/// reset the connection instead).
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut out = Vec::new();
    let exchange = async {
        s.write_all(req.as_bytes()).await?;
        s.read_to_end(&mut out).await
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(Ok(_)) => String::from_utf8_lossy(&out).into_owned(),
        Ok(Err(_)) => String::new(),
        Err(_) => panic!("GET {path} timed out"),
    }
}

#[tokio::test]
async fn over_max_pending_connections_the_oldest_pending_one_makes_room() {
    let opts = DaemonOptions::default().arg("--max-pending-connections", 3);
    let daemon = Daemon::start_with(opts).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(daemon.addr).await.expect("connect");
        s.write_all(b"GET / HT").await.expect("write");
        held.push(s);
        // In order: the gate numbers connections as it accepts them.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A fourth (a real request) is served, and the oldest half-open one is closed for it,
    // long before its header read timeout (10 s).
    let got = raw_get(daemon.addr, "/healthz").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    let oldest = held.remove(0);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), closed_by_daemon(oldest))
            .await
            .unwrap_or(false),
        "the oldest pending connection is still open"
    );
}

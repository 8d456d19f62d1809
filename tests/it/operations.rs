//! Operations: config layering and rejection, health and readiness, metrics that move with
//! traffic, and the drain on SIGTERM during a running turn.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{Daemon, DaemonOptions, acpd_bin};

/// A plain HTTP/1.1 GET; returns the status code and the body.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("read");
        let text = String::from_utf8_lossy(&buf).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("http get timed out")
}

/// The value of one sample line of a Prometheus text body (0 when absent).
pub(crate) fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

async fn check_config(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(acpd_bin());
    cmd.arg("check-config")
        .args(args)
        .env_remove("ACPD_LISTEN")
        .env_remove("ACPD_LIST_PAGE_SIZE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("check-config timed out")
        .expect("run acpd")
}

#[tokio::test]
async fn config_layers_file_then_env_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("acpd.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:7001\"\nlist_page_size = 7\n[agents.a]\ncommand = \"/bin/cat\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let data = dir.path().to_str().unwrap();

    let out = check_config(&["--config", f, "--data-dir", data], &[]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:7001"),
        "{out:?}"
    );

    let out = check_config(
        &["--config", f, "--data-dir", data],
        &[("ACPD_LISTEN", "127.0.0.1:7002")],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:7002"),
        "env beats the file: {out:?}"
    );

    let out = check_config(
        &[
            "--config",
            f,
            "--data-dir",
            data,
            "--listen",
            "127.0.0.1:7003",
        ],
        &[("ACPD_LISTEN", "127.0.0.1:7002")],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:7003"),
        "flags beat env: {out:?}"
    );
}

#[tokio::test]
async fn bad_config_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "listen = 5\n").unwrap();
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "list_page_size = 5\nlist_page_sise = 6\n").unwrap();
    let bad_builtin = dir.path().join("bad-builtin.toml");
    std::fs::write(&bad_builtin, "[builtin]\nmax_turn_requests = \"many\"\n").unwrap();
    let data = dir.path().to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["--config", file.to_str().unwrap()],
        vec!["--config", "/nonexistent/acpd.toml"],
        vec!["--config", unknown.to_str().unwrap()],
        vec!["--config", bad_builtin.to_str().unwrap()],
        vec!["--agent", "no-equals-sign"],
        vec!["--default-agent", "ghost"],
        vec!["--no-auth", "--listen", "0.0.0.0:7420"],
        vec!["--store", "mysql://x"],
        vec!["--list-page-size", "0"],
        vec!["--worker-threads", "0"],
    ];
    for args in cases {
        let mut all = args.clone();
        all.extend(["--data-dir", data]);
        let out = check_config(&all, &[]).await;
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line expected, got {stderr:?}"
        );
        assert!(stderr.starts_with("acpd: "), "{stderr:?}");
    }
    // A file key that does not exist says which.
    let out = check_config(&["--config", unknown.to_str().unwrap()], &[]).await;
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("list_page_sise"),
        "{out:?}"
    );
    // A value from the environment is checked like the flag's.
    let out = check_config(&["--data-dir", data], &[("ACPD_LIST_PAGE_SIZE", "0")]).await;
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(stderr.contains("list_page_size"), "{stderr:?}");
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let daemon = Daemon::start().await;
    assert_eq!(http_get(daemon.addr, "/healthz").await.0, 200);
    assert_eq!(http_get(daemon.addr, "/readyz").await.0, 200);
}

#[tokio::test]
async fn metrics_move_with_traffic() {
    let daemon = Daemon::start().await;
    let (status, before) = http_get(daemon.addr, "/metrics").await;
    assert_eq!(status, 200);
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "stream 20 16").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let (_, after) = http_get(daemon.addr, "/metrics").await;

    let prompts = "acpd_prompts_total{stop_reason=\"end_turn\"}";
    assert_eq!(
        sample(&after, prompts) - sample(&before, prompts),
        1.0,
        "{after}"
    );
    assert!(
        sample(&after, "acpd_journal_entries_total")
            - sample(&before, "acpd_journal_entries_total")
            >= 21.0
    );
    assert!(sample(&after, "acpd_connections_total") > sample(&before, "acpd_connections_total"));
    assert!(sample(&after, "acpd_connections_live") >= 1.0);
    assert!(sample(&after, "acpd_sessions_live") >= 1.0);
    assert!(sample(&after, "acpd_agent_processes") >= 1.0);
    assert!(sample(&after, "acpd_bytes_out_total") > sample(&before, "acpd_bytes_out_total"));
    assert!(
        after.contains("acpd_journal_commit_seconds_bucket"),
        "{after}"
    );
    // Batch sizes are counted in entries, not on the seconds' buckets (where every batch of
    // more than five entries fell into +Inf).
    assert!(
        after.contains("acpd_journal_batch_size_bucket{le=\"512\"}"),
        "{after}"
    );
}

#[tokio::test]
async fn sigterm_mid_turn_tells_the_client_finishes_the_turn_and_exits_0() {
    let mut daemon =
        Daemon::start_with(DaemonOptions::default().arg("--shutdown-grace-secs", 20)).await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client
        .send_prompt(&sid, "echo started; sleep 600; stream 50 8; echo last")
        .await;
    // The signal must come while the turn runs, not before acpd has taken the prompt.
    loop {
        let u = client.next_update().await;
        if u["update"]["content"]["text"] == "started" {
            break;
        }
    }

    // A second, raw socket: it sees the close frame the drain sends.
    let (mut raw, _) = tokio_tungstenite::connect_async(daemon.ws_url())
        .await
        .expect("connect");
    let status = daemon.sigterm().await;
    assert_eq!(status.code(), Some(0), "acpd exit status on SIGTERM");
    let close = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(m) = raw.next().await {
            if let Ok(Message::Close(frame)) = m {
                return frame;
            }
        }
        None
    })
    .await
    .expect("no close frame");
    let frame = close.expect("close frame without a reason");
    assert_eq!(u16::from(frame.code), 1001);
    assert!(frame.reason.contains("reconnect"), "{frame:?}");

    // The turn ran to its end during the drain, and the journal has all of it.
    daemon.restart().await;
    let mut client = daemon.client().await;
    // Every seq, one by one (a load would merge the turn's chunks into one message).
    let (updates, result) = client.attach_after(&sid, 0).await;
    result.expect("attach after the drain");
    let texts: Vec<String> = updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        texts.len(),
        52,
        "every update of the drained turn is journaled"
    );
    assert_eq!(texts.last().map(String::as_str), Some("last"));
}

/// Polls `GET /readyz` until it answers `want` (or panics after `within`).
async fn wait_ready_status(addr: SocketAddr, want: u16, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (status, body) = http_get(addr, "/readyz").await;
        if status == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {status} ({body:?}), wanted {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn readiness_follows_the_store() {
    use sqlx::{Connection, Executor};
    let db = crate::pgtest::TestDb::create().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = tokio::process::Command::new(acpd_bin())
        .args([
            "serve",
            "--no-auth",
            "--listen",
            &addr.to_string(),
            "--store",
            db.url(),
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn acpd");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "acpd did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_ready_status(addr, 200, Duration::from_secs(5)).await;

    // Take the database away: no new connections, existing ones terminated.
    let mut admin = sqlx::PgConnection::connect(db.admin_url()).await.unwrap();
    let name = db.name().to_owned();
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS false"
        )))
        .await
        .unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        )))
        .await
        .unwrap();
    wait_ready_status(addr, 503, Duration::from_secs(15)).await;
    assert_eq!(
        http_get(addr, "/healthz").await.0,
        200,
        "alive while the store is down"
    );

    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS true"
        )))
        .await
        .unwrap();
    wait_ready_status(addr, 200, Duration::from_secs(15)).await;

    let _ = child.kill().await;
    admin.close().await.ok();
    db.drop_db().await;
}

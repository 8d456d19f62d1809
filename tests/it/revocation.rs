//! Token revocation (`acpd token revoke`, another process) closes every link of that token —
//! a plain WebSocket and a resumable one with 1008, a TCP connection — cancels the
//! principal's running turns and, when it has no other valid token connected, stops its
//! agent processes; a principal with another valid token keeps its connection and agent.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::support::daemon::{process_alive, wait_all_dead};
use crate::support::security_support::{self as sec, acpd, bearer};
use crate::support::{Daemon, DaemonOptions};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(daemon: &Daemon, secret: &str, resumable: bool) -> Ws {
    let mut req = daemon.ws_url().into_client_request().unwrap();
    let (h, v) = bearer(secret);
    req.headers_mut()
        .insert(h, HeaderValue::from_str(&v).unwrap());
    if resumable {
        let p = HeaderValue::from_static("acpd.resume.v1");
        req.headers_mut().insert("sec-websocket-protocol", p);
    }
    tokio_tungstenite::connect_async(req)
        .await
        .expect("connect")
        .0
}

/// Reads until the close frame (its code) or the end (`None`), at most `within`.
async fn close_code(ws: &mut Ws, within: Duration) -> Option<u16> {
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(Message::Close(f))) => return f.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .expect("the link was not closed")
}

/// Sends `msg` and reads until the answer to `id`.
async fn call(ws: &mut Ws, id: i64, method: &str, params: Value) -> Value {
    let m = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    ws.send(Message::text(m.to_string())).await.unwrap();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("answer")
            .expect("open")
            .expect("read");
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    }
}

/// The ids of the tokens of principal `name`, from `acpd token list`.
async fn token_ids(daemon: &Daemon, name: &str) -> Vec<String> {
    let run = acpd(&[
        "token",
        "list",
        "--data-dir",
        &data(daemon),
        "--store",
        &daemon.store_url(),
    ])
    .await;
    run.stdout
        .lines()
        .filter(|l| l.split('\t').nth(1) == Some(name))
        .filter_map(|l| l.split('\t').next())
        .map(str::to_owned)
        .collect()
}

async fn revoke(daemon: &Daemon, id: &str) {
    let run = acpd(&[
        "token",
        "revoke",
        id,
        "--data-dir",
        &data(daemon),
        "--store",
        &daemon.store_url(),
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

fn data(daemon: &Daemon) -> String {
    daemon.dir().join("data").display().to_string()
}

#[tokio::test]
async fn revocation_closes_every_link_cancels_turns_and_stops_agents() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth().tcp()).await;
    let secret = sec::token_create(&daemon, "mallory").await;
    // A plain WebSocket with a running turn.
    let mut plain = ws(&daemon, &secret, false).await;
    call(
        &mut plain,
        1,
        "initialize",
        json!({ "protocolVersion": 1, "clientCapabilities": {} }),
    )
    .await;
    let r = call(
        &mut plain,
        2,
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
    )
    .await;
    let sid = r["result"]["sessionId"]
        .as_str()
        .expect("session")
        .to_owned();
    let prompt = json!({ "jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
        "sessionId": sid, "prompt": [{ "type": "text", "text": "sleep 4000\necho too late" }] } });
    plain.send(Message::text(prompt.to_string())).await.unwrap();
    // A resumable link (acp-shim's kind) and a TCP connection.
    let mut resumable = ws(&daemon, &secret, true).await;
    let mut tcp = tokio::net::TcpStream::connect(daemon.tcp_addr.unwrap())
        .await
        .unwrap();
    let auth =
        json!({ "jsonrpc": "2.0", "id": 0, "method": "_acpd/auth", "params": { "token": secret } });
    tcp.write_all(format!("{auth}\n").as_bytes()).await.unwrap();
    let mut tcp = BufReader::new(tcp);
    let mut line = String::new();
    tcp.read_line(&mut line).await.unwrap();
    assert!(line.contains("\"result\""), "{line}");
    let agents = daemon.agent_pids();
    assert_eq!(agents.len(), 1, "{agents:?}");

    let ids = token_ids(&daemon, "mallory").await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    revoke(&daemon, &ids[0]).await;
    let wait = Duration::from_secs(8);
    assert_eq!(
        close_code(&mut plain, wait).await,
        Some(1008),
        "plain WebSocket"
    );
    assert_eq!(
        close_code(&mut resumable, wait).await,
        Some(1008),
        "resumable link"
    );
    let eof = tokio::time::timeout(wait, async {
        loop {
            line.clear();
            if tcp.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
        }
    })
    .await;
    assert!(eof.is_ok(), "the TCP connection stayed open");
    let left = wait_all_dead(&agents, Duration::from_secs(8)).await;
    assert!(left.is_empty(), "agent processes still running: {left:?}");
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(
        log.contains("token revoked: cancelling the principal's turns"),
        "no cancel"
    );
    assert!(log.contains("agent process stopped"), "no stop");
}

#[tokio::test]
async fn another_valid_token_keeps_its_link_and_agent_and_turns_are_cancelled() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let lost = sec::token_create(&daemon, "alice").await;
    let lost_id = token_ids(&daemon, "alice").await.remove(0);
    // A second token of the same principal.
    let kept = sec::token_create(&daemon, "alice").await;
    let mut stolen = ws(&daemon, &lost, false).await;
    call(
        &mut stolen,
        1,
        "initialize",
        json!({ "protocolVersion": 1, "clientCapabilities": {} }),
    )
    .await;
    let (h, v) = bearer(&kept);
    let mut laptop = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    let sid = laptop.open_session(&daemon.work_dir()).await;
    let agents = daemon.agent_pids();
    // A running turn of the principal (a turn is not tied to a token: it is cancelled).
    let turn = laptop.send_prompt(&sid, "sleep 20000\necho too late").await;

    revoke(&daemon, &lost_id).await;
    assert_eq!(
        close_code(&mut stolen, Duration::from_secs(8)).await,
        Some(1008)
    );
    let done = laptop.wait_response(&turn).await.expect("prompt answer");
    assert_eq!(done["stopReason"], "cancelled", "{done}");
    // The principal still has a valid token connected: its agent and session go on.
    let (_, r) = laptop.prompt(&sid, "echo still here").await;
    assert_eq!(r.expect("prompt")["stopReason"], "end_turn");
    assert!(
        agents.iter().all(|p| process_alive(*p)),
        "an agent was stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_shim_with_a_revoked_token_exits_77_instead_of_reconnecting() -> anyhow::Result<()> {
    use crate::shim_support::{Daemon as ShimDaemon, Shim};
    let d = ShimDaemon::start(true).await?;
    let token = d.token_file().display().to_string();
    let mut shim = Shim::spawn(&d.url(), &["--token-file", &token], d.dir.path())?;
    shim.open_session().await?;
    let dir = d.dir.path().display().to_string();
    let store = format!("sqlite://{}/acpd.db", dir);
    let run = acpd(&["token", "list", "--data-dir", &dir, "--store", &store]).await;
    let ids: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert_eq!(ids.len(), 1, "{}", run.stdout);
    let run = acpd(&[
        "token",
        "revoke",
        ids[0],
        "--data-dir",
        &dir,
        "--store",
        &store,
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Cut off with 1008, the shim tries again, is refused (401) and says so.
    assert_eq!(shim.wait_exit().await?, 77, "{}", shim.stderr());
    Ok(())
}

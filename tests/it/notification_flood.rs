//! Notifications count against the per-connection rate limit: a flood of them from one
//! principal closes that connection (an error with `id: null`, then close code 1008), while
//! another principal's round trips stay fast and acpd's memory stays bounded.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use crate::support::security_support::{self as sec, bearer};
use crate::support::{Daemon, DaemonOptions};

/// VmRSS of a process, in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// What the flooding client saw: the messages it was sent and the close code, if any.
struct Flooded {
    messages: Vec<Value>,
    close_code: Option<u16>,
    sent: usize,
}

/// Sends `n` `session/cancel` notifications (random session ids) as fast as the socket
/// takes them, after `initialize`; stops at the first failed send.
async fn flood(url: &str, secret: &str, n: usize) -> Flooded {
    let mut req = url.into_client_request().unwrap();
    let (h, v) = bearer(secret);
    req.headers_mut()
        .insert(h, HeaderValue::from_str(&v).unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    let (mut sink, mut stream) = ws.split();
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} } });
    sink.send(Message::text(init.to_string())).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("initialize answer")
        .expect("open")
        .expect("read");
    assert!(
        first.to_text().unwrap().contains("protocolVersion"),
        "{first:?}"
    );
    let reader = tokio::spawn(async move {
        let mut messages = Vec::new();
        let mut close_code = None;
        while let Some(Ok(m)) = stream.next().await {
            match m {
                Message::Text(t) => messages.push(serde_json::from_str(&t).unwrap()),
                Message::Close(f) => {
                    close_code = f.map(|f| u16::from(f.code));
                    break;
                }
                _ => {}
            }
        }
        (messages, close_code)
    });
    let mut sent = 0;
    'outer: while sent < n {
        for _ in 0..256 {
            let sid = format!("s-{}", uuid::Uuid::new_v4().simple());
            let m = json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": sid } });
            if sink.feed(Message::text(m.to_string())).await.is_err() {
                break 'outer;
            }
            sent += 1;
        }
        if sink.flush().await.is_err() {
            break;
        }
    }
    let (messages, close_code) = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("the flooding connection is closed")
        .unwrap();
    Flooded {
        messages,
        close_code,
        sent,
    }
}

#[tokio::test]
async fn a_notification_flood_is_cut_off_and_others_are_served_meanwhile() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let a = sec::token_create(&daemon, "flooder").await;
    let b = sec::token_create(&daemon, "bystander").await;
    let (h, v) = bearer(&b);
    let mut bob = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    bob.request("_scripted/echo", json!({ "warm": 1 }))
        .await
        .expect("echo");
    let pid = daemon.pid();
    let before = rss_kib(pid);

    let url = daemon.ws_url();
    let flooding = tokio::spawn(async move { flood(&url, &a, 200_000).await });
    // Round trips of the other principal while the flood runs, and acpd's memory.
    let mut rtts = Vec::new();
    let mut peak = before;
    while !flooding.is_finished() || rtts.len() < 20 {
        let t = Instant::now();
        bob.request("_scripted/echo", json!({ "n": rtts.len() }))
            .await
            .expect("echo during the flood");
        rtts.push(t.elapsed());
        peak = peak.max(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let f = tokio::time::timeout(Duration::from_secs(60), flooding)
        .await
        .expect("the flood ends")
        .unwrap();
    peak = peak.max(rss_kib(pid));

    // The flooder was told why and closed with 1008, long before its 200 000 went through.
    assert!(
        f.messages.iter().any(|m| m["id"].is_null()
            && m["error"]["code"] == -32005
            && m["error"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("notifications"))),
        "{:?}",
        f.messages
    );
    assert_eq!(f.close_code, Some(1008), "sent {}", f.sent);
    // Served all along: every round trip above was answered (within the client's timeout)
    // while the flood ran. How fast is a benchmark's question, not a test's: on a loaded CI
    // machine a single round trip can take a second without anything being wrong.
    assert!(rtts.len() >= 20, "{} round trips", rtts.len());
    // Bound: at most 64 MiB over what acpd held before the flood.
    assert!(
        peak < before + 64 * 1024,
        "acpd grew from {before} KiB to {peak} KiB"
    );
    // The daemon lives on, for both principals.
    bob.request("_scripted/echo", json!({}))
        .await
        .expect("echo after the flood");
    let (h, v) = bearer(&b);
    let mut again = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    again.new_session(&daemon.work_dir()).await;
}

//! Idle WebSocket connections: how many KiB each costs the server and how long it takes to
//! establish them (TCP, upgrade, `initialize` answered).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// How many connections are being set up at once.
const IN_FLIGHT: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain RFD client (one JSON-RPC message per text frame).
    Plain,
    /// acp-shim's kind: `acpd.resume.v1` envelopes.
    Resumable,
    /// websocat's `mirror:`: the first frame echoed counts as the answer.
    Mirror,
}

pub struct Held {
    pub n: usize,
    /// Server RSS before, in KiB.
    pub base_kib: u64,
    pub kib_per_conn: f64,
    pub establish: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

/// Opens `n` connections to `port` (`IN_FLIGHT` at a time), holds them, and measures the
/// server's RSS growth with `rss` (KiB).
pub async fn hold(
    port: u16,
    path: &str,
    kind: Kind,
    n: usize,
    rss: impl Fn() -> Result<u64>,
) -> Result<Held> {
    // One connection first: the agent is started and the allocator warmed before the baseline.
    drop(open(port, path, kind).await?);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base_kib = rss()?;
    let start = Instant::now();
    let opened: Vec<Result<(Socket, Duration)>> = futures_util::stream::iter(0..n)
        .map(|_| open(port, path, kind))
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let establish = start.elapsed();
    let mut sockets = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    for r in opened {
        let (s, t) = r?;
        sockets.push(s);
        times.push(t);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss()?;
    drop(sockets);
    times.sort();
    Ok(Held {
        n,
        base_kib,
        kib_per_conn: after.saturating_sub(base_kib) as f64 / n as f64,
        establish,
        p50: times[times.len() / 2],
        p99: times[(times.len() * 99 / 100).min(times.len() - 1)],
    })
}

pub type Socket = tokio_tungstenite::WebSocketStream<TcpStream>;

pub async fn open(port: u16, path: &str, kind: Kind) -> Result<(Socket, Duration)> {
    let t = Instant::now();
    let stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.set_nodelay(true)?;
    let mut req = format!("ws://127.0.0.1:{port}{path}").into_client_request()?;
    if kind == Kind::Resumable {
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("acpd.resume.v1"),
        );
    }
    let (mut ws, _) = tokio_tungstenite::client_async(req, stream).await?;
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": 1, "clientCapabilities": {} },
    });
    let frame = match kind {
        Kind::Resumable => json!({ "s": 1, "a": 0, "m": init }),
        _ => init,
    };
    ws.send(Message::Text(frame.to_string().into())).await?;
    loop {
        let text = match ws.next().await {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e.into()),
            None => bail!("closed before answering initialize"),
        };
        if kind == Kind::Mirror {
            break;
        }
        let v: Value = serde_json::from_str(&text)?;
        let msg = match kind {
            Kind::Resumable => &v["m"],
            _ => &v,
        };
        if msg["id"] == 1 {
            if msg.get("result").is_none() {
                return Err(anyhow!("initialize failed: {msg}"));
            }
            if kind == Kind::Resumable {
                // acp-shim acks what it received within a second (its keepalive tick), and
                // only then may acpd let the answer go: an idle shim's link holds nothing.
                let s = v["s"].as_u64().ok_or_else(|| anyhow!("no seq: {v}"))?;
                ws.send(Message::Text(json!({ "a": s }).to_string().into()))
                    .await?;
            }
            break;
        }
    }
    Ok((ws, t.elapsed()))
}

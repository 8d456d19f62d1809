//! Resumable links (`acpd.resume.v1`) under a client that stops reading: the daemon's owner
//! writes its socket through one write in flight and keeps reading the client meanwhile; a
//! write the client takes no bytes of for the write deadline detaches the link, and the
//! client's resume gets the rest of the turn exactly once, in order. A raw WebSocket client
//! speaks the envelopes here so the test controls when it reads (acp-shim always reads).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::shim_support::{Daemon, WAIT, prompt};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One client end of a resumable link: what it sent and what it received, by seq.
struct Link {
    ws: Ws,
    sent: u64,
    got: u64,
}

impl Link {
    /// A new link, or (`resume`: id and the last seq received) the resume of one.
    async fn open(url: &str, resume: Option<(&str, u64)>) -> Result<(Ws, String, u64)> {
        let mut req = url.into_client_request()?;
        let h = req.headers_mut();
        h.insert("sec-websocket-protocol", "acpd.resume.v1".parse()?);
        if let Some((id, got)) = resume {
            h.insert("acpd-resume", id.parse()?);
            h.insert("acpd-last-seq", got.to_string().parse()?);
        }
        let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let id = header("acp-connection-id").context("no acp-connection-id")?;
        let theirs = header("acpd-last-seq").map_or(Ok(0), |v| v.parse())?;
        Ok((ws, id, theirs))
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> Result<()> {
        self.sent += 1;
        let m = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let frame = json!({"s": self.sent, "a": self.got, "m": m});
        self.ws.send(Message::text(frame.to_string())).await?;
        Ok(())
    }

    /// The next JSON-RPC message, answering pings; every data frame must be the next seq.
    async fn next(&mut self) -> Result<Value> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .context("no frame from the daemon")?;
            let text = match msg {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(_)) => continue,
                other => bail!("the link ended: {other:?}"),
            };
            let v: Value = serde_json::from_str(text.as_str())?;
            if let Some(n) = v.get("ping") {
                let pong = json!({ "pong": n }).to_string();
                self.ws.send(Message::text(pong)).await?;
                continue;
            }
            let Some(s) = v.get("s").and_then(Value::as_u64) else {
                continue; // an ack
            };
            if s != self.got + 1 {
                bail!("frame {s} after {}: lost or repeated", self.got);
            }
            self.got = s;
            if s % 256 == 0 {
                let ack = json!({ "a": s }).to_string();
                self.ws.send(Message::text(ack)).await?;
            }
            return Ok(v["m"].clone());
        }
    }

    /// Reads until the answer to `id`; the chunks streamed before it are counted in `chunks`.
    async fn until_answer(&mut self, id: u64, chunks: &mut u64) -> Result<Value> {
        loop {
            let m = self.next().await?;
            if m.get("method").is_none() && m["id"] == json!(id) {
                return Ok(m);
            }
            if crate::support::kind(&m["params"]) == "agent_message_chunk" {
                *chunks += 1;
            }
        }
    }
}

#[tokio::test]
async fn a_resumable_client_that_stops_reading_is_detached_and_its_resume_gets_the_rest_once()
-> Result<()> {
    const CHUNKS: u64 = 20_000;
    let d = Daemon::start(false).await?;
    let url = d.url();
    let (ws, link_id, _) = Link::open(&url, None).await?;
    let mut link = Link {
        ws,
        sent: 0,
        got: 0,
    };
    let mut chunks = 0;
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    link.request(1, "initialize", init).await?;
    link.until_answer(1, &mut chunks).await?;
    let new = json!({"cwd": "/usr", "mcpServers": []});
    link.request(2, "session/new", new).await?;
    let sid = link.until_answer(2, &mut chunks).await?["result"]["sessionId"]
        .as_str()
        .context("no session id")?
        .to_owned();

    // 20 MB, more than the loopback socket buffers hold: the daemon's write stalls. The client
    // reads nothing more but keeps acking what it has, so only the write deadline can end
    // the socket (the keepalive hears it all along).
    link.request(3, "session/prompt", prompt(&sid, "stream 20000 1024"))
        .await?;
    let stalled = async {
        loop {
            let ack = json!({ "a": link.got }).to_string();
            link.ws.send(Message::text(ack)).await?;
            if d.log().contains("resumable socket: write deadline passed") {
                return anyhow::Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(WAIT, stalled)
        .await
        .context("the stalled write never passed its deadline")??;
    if d.log().contains("no keepalive answer") {
        bail!("the link was detached by the keepalive, not by the write deadline");
    }
    drop(link.ws);

    // The resume starts where the client's reading stopped: the turn comes whole, once.
    let (ws, resumed_id, theirs) = Link::open(&url, Some((&link_id, link.got))).await?;
    assert_eq!(resumed_id, link_id);
    assert_eq!(theirs, 3, "the daemon received the client's three requests");
    let mut link = Link { ws, ..link };
    let answer = link.until_answer(3, &mut chunks).await?;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(chunks, CHUNKS, "every chunk exactly once");

    // The link still carries requests after its resume.
    link.request(4, "session/list", json!({})).await?;
    let listed = link.until_answer(4, &mut chunks).await?;
    assert!(listed["result"]["sessions"].is_array(), "{listed}");
    Ok(())
}

//! Flow control on the WebSocket transport, over real sockets to a real daemon: a client that
//! floods faster than the daemon reads still gets the server's pings and its close frame, and a
//! client that stops reading is closed after the write deadline (3 keepalives, at least 1 s)
//! while other connections go on. The daemon runs with the shim tests' 300 ms keepalive.

use std::collections::HashSet;

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use crate::shim_support::{Daemon, WAIT, prompt};

type Ws = WebSocketStream<TcpStream>;

/// A plain RFD client of the agent profile `s`.
async fn connect(port: u16) -> Result<Ws> {
    connect_to(port, "s").await
}

async fn connect_to(port: u16, agent: &str) -> Result<Ws> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let url = format!("ws://127.0.0.1:{port}/acp?agent={agent}");
    let (ws, _) = tokio_tungstenite::client_async(url, tcp).await?;
    Ok(ws)
}

async fn send(ws: &mut Ws, id: u64, method: &str, params: Value) -> Result<()> {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(req.to_string())).await?;
    Ok(())
}

/// Reads until the answer to `id`; returns it and the messages before it.
async fn until_answer(ws: &mut Ws, id: u64) -> Result<(Value, Vec<Value>)> {
    let mut before = vec![];
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .context("timed out waiting for an answer")?
            .context("socket closed")??;
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(t.as_str())?;
        if v.get("method").is_none() && v["id"] == json!(id) {
            return Ok((v, before));
        }
        before.push(v);
    }
}

async fn call(ws: &mut Ws, id: u64, method: &str, params: Value) -> Result<Value> {
    send(ws, id, method, params).await?;
    let (answer, _) = until_answer(ws, id).await?;
    answer
        .get("result")
        .cloned()
        .with_context(|| format!("{method} failed: {answer}"))
}

/// initialize + session/new (ids 1 and 2); returns the session id.
async fn open_session(ws: &mut Ws) -> Result<String> {
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    call(ws, 1, "initialize", init).await?;
    let new = call(
        ws,
        2,
        "session/new",
        json!({"cwd": "/usr", "mcpServers": []}),
    )
    .await?;
    new["sessionId"]
        .as_str()
        .map(str::to_owned)
        .context("sessionId")
}

/// A prompt that streams `n` chunks; checks they all arrive and the turn ends.
async fn streams(ws: &mut Ws, id: u64, sid: &str, n: usize) -> Result<()> {
    send(
        ws,
        id,
        "session/prompt",
        prompt(sid, &format!("stream {n} 64")),
    )
    .await?;
    let (done, msgs) = until_answer(ws, id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let chunks = msgs
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert_eq!(chunks, n);
    Ok(())
}

async fn wait_for_log(d: &Daemon, needle: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if d.log().contains(needle) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    bail!("the daemon never logged {needle:?}; log:\n{}", d.log())
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_write_deadline() -> Result<()> {
    // A second agent process for the other client: this test is about sockets, not about a
    // busy agent's sessions sharing its stdout.
    let other_agent = format!("t={}", crate::support::scripted_agent_bin());
    let dir = std::sync::Arc::new(tempfile::tempdir()?);
    let d = Daemon::start_with(dir, 0, false, &["--agent", &other_agent]).await?;
    let mut stuck = connect(d.port).await?;
    let sid = open_session(&mut stuck).await?;
    // A long turn, and from here on this client reads nothing.
    let long = prompt(&sid, "stream 20000 1024");
    send(&mut stuck, 3, "session/prompt", long).await?;

    // Another connection is not held up by it, before or after the cut.
    let mut other = connect_to(d.port, "t").await?;
    let other_sid = open_session(&mut other).await?;
    streams(&mut other, 3, &other_sid, 2000).await?;
    wait_for_log(&d, "websocket write deadline passed").await?;
    streams(&mut other, 4, &other_sid, 500).await?;

    // The stuck socket is gone: what the kernel still holds drains, then it ends, and the
    // long turn's answer never came.
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match stuck.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str())?;
                    if v.get("method").is_none() && v["id"] == json!(3) {
                        bail!("the stuck client got its whole turn: {v}");
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return Ok(()),
            }
        }
    })
    .await;
    ended.context("the stuck client's socket was never closed")??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_flooding_faster_than_the_daemon_reads_still_gets_pings_and_the_close_frame()
-> Result<()> {
    const FLOOD: u64 = 20_000;
    let d = Daemon::start(false).await?;
    let mut flood = connect(d.port).await?;
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    call(&mut flood, 1, "initialize", init).await?;
    let (mut sink, mut stream) = flood.split();
    // Requests the daemon answers from the store, sent as fast as the socket takes them: the
    // daemon's link stays full, so its socket reader keeps pausing.
    let writer = tokio::spawn(async move {
        for id in 100..100 + FLOOD {
            let req = json!({"jsonrpc": "2.0", "id": id, "method": "session/list", "params": {}});
            if sink.send(Message::text(req.to_string())).await.is_err() {
                break;
            }
        }
        sink
    });
    let (pinged_tx, mut pinged) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(async move {
        let (mut answered, mut pings) = (HashSet::new(), 0u32);
        let close = loop {
            match stream.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    if let Some(id) = v["id"].as_u64() {
                        assert!(answered.insert(id), "answered twice: {v}");
                    }
                }
                Some(Ok(Message::Ping(_))) => {
                    pings += 1;
                    pinged_tx.send_replace(true);
                }
                Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break None,
            }
        };
        (answered.len(), pings, close)
    });
    // The server's pings get through the flood...
    tokio::time::timeout(WAIT, pinged.wait_for(|p| *p))
        .await
        .context("no ping during the flood")??;
    // ...and so does the close frame of a drain that starts in the middle of it.
    let (code, _dir) = d.terminate().await?;
    assert_eq!(code, 0);
    let (answered, pings, close) = tokio::time::timeout(WAIT, reader)
        .await
        .context("the flooding client's socket never ended")??;
    writer.abort();
    assert!(answered > 0, "no answers at all");
    assert!(pings >= 1);
    assert_eq!(
        close,
        Some(1001),
        "no shutdown close frame ({answered} answers)"
    );
    Ok(())
}

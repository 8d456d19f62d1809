//! Streamable HTTP over HTTP/2 (issue 16; the RFD requires it): TLS's ALPN offers `h2`
//! beside `http/1.1`, and one HTTP/2 connection carries the POSTs and both SSE streams at
//! once; a WebSocket client (ALPN `http/1.1` or none) still upgrades on HTTP/1.1.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::streamable_http::{initialize, rpc};
use crate::support::http::SseEvent;
use crate::support::security_support::{client, make_cert, trusting, wss_url};
use crate::support::{Daemon, DaemonOptions, agent_texts, session_update_params};

const TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP/2 connection over TLS to the daemon; panics unless ALPN chose `h2`.
async fn h2(daemon: &Daemon, cert: &std::path::Path) -> SendRequest<Full<Bytes>> {
    let mut config = Arc::unwrap_or_clone(trusting(cert));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(daemon.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    send
}

fn req(method: Method, headers: &[(&str, &str)], body: String) -> Request<Full<Bytes>> {
    let mut r = Request::builder()
        .method(method)
        .uri("https://localhost/acp");
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Full::new(Bytes::from(body))).unwrap()
}

async fn post(
    send: &mut SendRequest<Full<Bytes>>,
    headers: &[(&str, &str)],
    msg: &Value,
) -> (StatusCode, hyper::HeaderMap, String) {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    let resp = tokio::time::timeout(
        TIMEOUT,
        send.send_request(req(Method::POST, &h, msg.to_string())),
    )
    .await
    .expect("answer in time")
    .expect("POST");
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// An SSE stream on the HTTP/2 connection, parsed into events by a task.
async fn stream(
    send: &mut SendRequest<Full<Bytes>>,
    headers: &[(&str, &str)],
) -> mpsc::Receiver<SseEvent> {
    let mut h = vec![("accept", "text/event-stream")];
    h.extend_from_slice(headers);
    let resp = send
        .send_request(req(Method::GET, &h, String::new()))
        .await
        .expect("GET");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let (tx, rx) = mpsc::channel(1024);
    let mut body = resp.into_body();
    tokio::spawn(async move {
        let mut buf = String::new();
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.push_str(&String::from_utf8_lossy(&data));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let mut id = None;
                let mut text = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        text.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if text.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&text).expect("SSE data is JSON");
                if tx.send(SseEvent { id, data }).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

async fn until_answer(rx: &mut mpsc::Receiver<SseEvent>, id: i64) -> Vec<SseEvent> {
    let mut out = Vec::new();
    loop {
        let e = tokio::time::timeout(TIMEOUT, rx.recv())
            .await
            .expect("SSE event in time")
            .expect("the stream ended before the answer");
        let done = e.data.get("method").is_none() && e.data["id"] == id;
        out.push(e);
        if done {
            return out;
        }
    }
}

#[tokio::test]
async fn a_session_over_http2_with_tls() {
    let certs = tempfile::tempdir().expect("temp dir");
    let cert = make_cert(certs.path()).await;
    let daemon = Daemon::start_with(DaemonOptions {
        args: cert.args(),
        ..DaemonOptions::default()
    })
    .await;
    let mut send = h2(&daemon, &cert.cert).await;
    let (status, headers, body) = post(&mut send, &[], &initialize(1)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let conn = headers["acp-connection-id"].to_str().unwrap().to_owned();
    let c = ("acp-connection-id", conn.as_str());
    // Streams and POSTs share the one HTTP/2 connection.
    let mut main = stream(&mut send, &[c]).await;
    let new = rpc(
        2,
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
    );
    assert_eq!(post(&mut send, &[c], &new).await.0, StatusCode::ACCEPTED);
    let answer = until_answer(&mut main, 2).await.pop().unwrap();
    let sid = answer.data["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let s = ("acp-session-id", sid.as_str());
    let mut session = stream(&mut send, &[c, s]).await;
    let prompt = rpc(
        3,
        "session/prompt",
        json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo over h2" }] }),
    );
    assert_eq!(
        post(&mut send, &[c, s], &prompt).await.0,
        StatusCode::ACCEPTED
    );
    let events = until_answer(&mut session, 3).await;
    let updates: Vec<Value> = events
        .iter()
        .filter_map(|e| session_update_params(&e.data).cloned())
        .collect();
    assert_eq!(agent_texts(&updates), ["over h2"], "{events:?}");
    assert_eq!(
        events.last().unwrap().data["result"]["stopReason"],
        "end_turn"
    );

    // WebSockets stay on HTTP/1.1 on the same listener.
    let mut ws = client(&wss_url(&daemon), &[], Some(trusting(&cert.cert))).await;
    let sid2 = ws.open_session(&daemon.work_dir()).await;
    let (updates, result) = ws.prompt(&sid2, "echo over wss").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["over wss"]);
    // DELETE over HTTP/2 ends the connection and its streams.
    let del = req(Method::DELETE, &[c], String::new());
    let resp = send.send_request(del).await.expect("DELETE");
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let end = tokio::time::timeout(TIMEOUT, session.recv()).await;
    assert!(matches!(end, Ok(None)), "the session stream ends: {end:?}");
}

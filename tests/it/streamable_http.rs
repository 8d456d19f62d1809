//! Streamable HTTP on `/acp` (issue 16): `POST` + the connection's SSE stream + `DELETE`,
//! over real HTTP/1.1 to a real daemon with the scripted agent; every error status; the
//! same auth and Origin rules as the WebSocket upgrade.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::support::http::{Resp, Sse, post, request};
use crate::support::security_support::{bearer, local_token};
use crate::support::{Daemon, DaemonOptions, agent_texts, session_update_params};

pub(crate) fn initialize(id: i64) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": 1,
            "clientCapabilities": {},
            "clientInfo": { "name": "acpd-http-tests", "version": "0.0.0" },
        },
    })
}

pub(crate) fn rpc(id: i64, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

/// `initialize` over POST: the 200 and its connection id.
pub(crate) async fn open(addr: SocketAddr, extra: &[(&str, &str)]) -> (Resp, String) {
    let resp = post(addr, extra, &initialize(1)).await;
    assert_eq!(resp.status, 200, "{resp:?}");
    let id = resp
        .header("acp-connection-id")
        .expect("Acp-Connection-Id on the initialize answer")
        .to_string();
    (resp, id)
}

pub(crate) const SSE: (&str, &str) = ("accept", "text/event-stream");

#[tokio::test]
async fn a_full_session_over_post_and_the_connection_stream() {
    let daemon = Daemon::start().await;
    let addr = daemon.addr;
    let (init, conn) = open(addr, &[]).await;
    assert!(
        init.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{init:?}"
    );
    let answer = init.json();
    assert_eq!(answer["id"], 1);
    assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");

    let c = ("acp-connection-id", conn.as_str());
    let mut stream = Sse::open(addr, &[c, SSE]).await;
    let cwd = daemon.work_dir();
    let new = rpc(2, "session/new", json!({ "cwd": cwd, "mcpServers": [] }));
    let r = post(addr, &[c], &new).await;
    assert_eq!(r.status, 202, "{r:?}");
    assert!(r.body.is_empty(), "{r:?}");
    let events = stream.until_answer(2).await;
    let sid = events.last().unwrap().data["result"]["sessionId"]
        .as_str()
        .expect("a sessionId")
        .to_string();

    let prompt = rpc(
        3,
        "session/prompt",
        json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo hi" }] }),
    );
    assert_eq!(post(addr, &[c], &prompt).await.status, 202);
    let events = stream.until_answer(3).await;
    let (answer, updates) = events.split_last().unwrap();
    assert_eq!(
        answer.data["result"]["stopReason"], "end_turn",
        "{events:?}"
    );
    let updates: Vec<Value> = updates
        .iter()
        .filter_map(|e| session_update_params(&e.data).cloned())
        .collect();
    assert_eq!(agent_texts(&updates), ["hi"], "{events:?}");
    // Every event is numbered, in order, with no gap.
    let ids: Vec<u64> = events.iter().map(|e| e.num().expect("an SSE id")).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");

    // Another stream with Last-Event-ID replays what came after it (the old one ends).
    let last = ids[ids.len() - 2].to_string();
    let mut again = Sse::open(addr, &[c, SSE, ("last-event-id", &last)]).await;
    let replayed = again.next().await.expect("the replayed answer");
    assert_eq!(replayed.num(), ids.last().copied());
    assert_eq!(replayed.data["id"], 3);
    assert!(stream.next().await.is_none(), "the replaced stream ends");

    let d = request(addr, "DELETE", &[c], "").await;
    assert_eq!(d.status, 202, "{d:?}");
    assert!(again.next().await.is_none(), "DELETE ends the stream");
    let mut gone = 0;
    for _ in 0..100 {
        gone = post(addr, &[c], &rpc(4, "session/list", json!({})))
            .await
            .status;
        if gone == 404 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(gone, 404, "a deleted connection is unknown");
}

#[tokio::test]
async fn every_error_status() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-message-bytes", 4096)).await;
    let addr = daemon.addr;
    let body = initialize(1).to_string();

    // Content-Type checked.
    let r = request(addr, "POST", &[("content-type", "text/plain")], &body).await;
    assert_eq!(r.status, 415, "{r:?}");
    let r = request(addr, "POST", &[], &body).await;
    assert_eq!(r.status, 415, "{r:?}");
    // Body size: max_message_bytes.
    let big = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "pad": "x".repeat(5000) } });
    assert_eq!(post(addr, &[], &big).await.status, 413);
    // Malformed JSON and batches: a JSON-RPC error as the answer.
    let r = request(
        addr,
        "POST",
        &[("content-type", "application/json")],
        "{nope",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.json()["error"]["code"], -32700, "{r:?}");
    let r = post(addr, &[], &json!([initialize(1)])).await;
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.json()["error"]["code"], -32600, "{r:?}");
    assert!(r.json()["id"].is_null(), "{r:?}");
    // Only initialize opens a connection.
    let r = post(addr, &[], &rpc(1, "session/list", json!({}))).await;
    assert_eq!(r.status, 400, "{r:?}");

    // Unknown connection ids: 404 on every method.
    let unknown = ("acp-connection-id", "no-such-connection");
    let r = post(addr, &[unknown], &rpc(2, "session/list", json!({}))).await;
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(request(addr, "GET", &[unknown, SSE], "").await.status, 404);
    assert_eq!(request(addr, "DELETE", &[unknown], "").await.status, 404);

    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    // GET: 406 without the Accept, 400 without the connection header.
    assert_eq!(request(addr, "GET", &[c], "").await.status, 406);
    assert_eq!(request(addr, "GET", &[SSE], "").await.status, 400);
    assert_eq!(request(addr, "DELETE", &[], "").await.status, 400);
    // A session stream of a session that does not exist opens (its requests are answered
    // on it: `streamable_http_sessions.rs`).
    drop(Sse::open(addr, &[c, SSE, ("acp-session-id", "no-such-session")]).await);
    let r = request(addr, "GET", &[c, SSE, ("acp-session-id", "")], "").await;
    assert_eq!(r.status, 400, "{r:?}");
    // Last-Event-ID of events never sent.
    let r = request(addr, "GET", &[c, SSE, ("last-event-id", "99")], "").await;
    assert_eq!(r.status, 410, "{r:?}");
    // Malformed JSON on a connection is answered at once too; the connection goes on.
    let r = request(
        addr,
        "POST",
        &[("content-type", "application/json"), c],
        "[1,",
    )
    .await;
    assert_eq!(r.json()["error"]["code"], -32700, "{r:?}");
    let mut stream = Sse::open(addr, &[c, SSE]).await;
    assert_eq!(
        post(addr, &[c], &rpc(2, "session/list", json!({})))
            .await
            .status,
        202
    );
    let answer = stream.until_answer(2).await.pop().unwrap();
    assert!(answer.data["result"]["sessions"].is_array(), "{answer:?}");
}

#[tokio::test]
async fn tokens_are_required_and_connections_are_their_principals() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let addr = daemon.addr;
    let secret = local_token(&daemon).await;
    let (name, value) = bearer(&secret);
    assert_eq!(post(addr, &[], &initialize(1)).await.status, 401);
    assert_eq!(
        post(
            addr,
            &[("authorization", "Bearer acpd_wrong")],
            &initialize(1)
        )
        .await
        .status,
        401
    );
    let (_, conn) = open(addr, &[(name, &value)]).await;
    let c = ("acp-connection-id", conn.as_str());
    // The connection id is no credential: without the token, nothing.
    let list = rpc(2, "session/list", json!({}));
    assert_eq!(post(addr, &[c], &list).await.status, 401);
    assert_eq!(request(addr, "GET", &[c, SSE], "").await.status, 401);
    assert_eq!(request(addr, "DELETE", &[c], "").await.status, 401);
    // Another principal's token: the connection does not exist for it.
    let other = crate::support::security_support::token_create(&daemon, "other").await;
    let (n2, v2) = bearer(&other);
    assert_eq!(post(addr, &[c, (n2, &v2)], &list).await.status, 404);
    // Tokens are never taken from the URL.
    let body = initialize(1).to_string();
    let s = crate::support::http::request_path(
        addr,
        "POST",
        &format!("/acp?token={secret}"),
        &[("content-type", "application/json")],
        &body,
    )
    .await;
    assert_eq!(s.status, 400, "{s:?}");
    let mut stream = Sse::open(addr, &[c, SSE, (name, &value)]).await;
    assert_eq!(post(addr, &[c, (name, &value)], &list).await.status, 202);
    assert!(stream.until_answer(2).await.pop().unwrap().data["result"].is_object());

    // A session's stream, even resumed from the journal, is its principal's only.
    let new = rpc(
        3,
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
    );
    assert_eq!(post(addr, &[c, (name, &value)], &new).await.status, 202);
    let answer = stream.until_answer(3).await.pop().unwrap();
    let sid = answer.data["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, conn2) = open(addr, &[(n2, &v2)]).await;
    let theirs = [
        ("acp-connection-id", conn2.as_str()),
        ("acp-session-id", sid.as_str()),
        SSE,
        (n2, v2.as_str()),
    ];
    // It opens (a 404 would end an SDK client's whole connection, and is an oracle), but
    // resumed from the journal it ends at once with nothing of the session's
    // (`streamable_http_sessions.rs` for the rest).
    let mut resumed = theirs.to_vec();
    resumed.push(("last-event-id", "0"));
    assert!(Sse::open(addr, &resumed).await.next().await.is_none());
}

#[tokio::test]
async fn browser_origins_must_be_allowed() {
    let allowed = "https://editor.example";
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--allowed-origin", allowed)).await;
    let addr = daemon.addr;
    let r = post(addr, &[("origin", "https://evil.example")], &initialize(1)).await;
    assert_eq!(r.status, 403, "{r:?}");
    let (_, conn) = open(addr, &[("origin", allowed)]).await;
    let c = ("acp-connection-id", conn.as_str());
    let evil = ("origin", "https://evil.example");
    assert_eq!(request(addr, "GET", &[c, SSE, evil], "").await.status, 403);
    assert_eq!(request(addr, "DELETE", &[c, evil], "").await.status, 403);
    assert_eq!(request(addr, "DELETE", &[c], "").await.status, 202);
}

#[tokio::test]
async fn a_connection_nobody_uses_ends_after_the_grace() {
    let daemon = Daemon::start_with(DaemonOptions::default().arg("--resume-grace-secs", 1)).await;
    let addr = daemon.addr;
    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let r = post(addr, &[c], &rpc(2, "session/list", json!({}))).await;
    assert_eq!(r.status, 404, "{r:?}");
}

/// The official npm SDK's http-client (`tests/interop/http-client.mjs`) runs a session and
/// reconnects to it the way the SDK documents (new transport, `session/load`). Needs
/// `ACPD_TEST_SDK_DIR`: a directory with `node_modules/@agentclientprotocol/sdk` (2.4.0:
/// `npm install @agentclientprotocol/sdk@2.4.0` there) and `node` on the PATH; ignored
/// without (`.ci/run` installs it).
#[tokio::test]
#[cfg_attr(
    not(acpd_sdk),
    ignore = "set ACPD_TEST_SDK_DIR to a directory with @agentclientprotocol/sdk installed"
)]
async fn the_official_sdk_http_client_runs_a_session() {
    let dir = std::env::var("ACPD_TEST_SDK_DIR").expect("ACPD_TEST_SDK_DIR");
    let script = std::path::Path::new(&dir).join("acpd-http-client.mjs");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/http-client.mjs");
    std::fs::copy(source, &script).expect("copy the interop script");
    let daemon = Daemon::start().await;
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .env("ACPD_URL", format!("http://{}/acp", daemon.addr))
        .env("ACPD_CWD", daemon.work_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .expect("node in time")
        .expect("run node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("ok: session"), "{stderr}");
    // And the SDK's ACP v1 reconnect: a new transport, initialize, session/load.
    assert!(stderr.contains("reloaded on a new connection"), "{stderr}");
}

#[tokio::test]
async fn two_sessions_each_on_their_own_stream() {
    let daemon = Daemon::start().await;
    let addr = daemon.addr;
    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    let mut main = Sse::open(addr, &[c, SSE]).await;
    let cwd = daemon.work_dir();
    let mut sids = Vec::new();
    let mut streams = Vec::new();
    for id in [2, 3] {
        let new = rpc(id, "session/new", json!({ "cwd": cwd, "mcpServers": [] }));
        assert_eq!(post(addr, &[c], &new).await.status, 202);
        // The answer to session/new is on the connection stream.
        let answer = main.until_answer(id).await.pop().unwrap();
        let sid = answer.data["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        streams.push(Sse::open(addr, &[c, SSE, ("acp-session-id", &sid)]).await);
        sids.push(sid);
    }
    for (i, (sid, stream)) in sids.iter().zip(&mut streams).enumerate() {
        let id = 10 + i as i64;
        let text = format!("echo from-{i}");
        let prompt = rpc(
            id,
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
        );
        let s = ("acp-session-id", sid.as_str());
        assert_eq!(post(addr, &[c, s], &prompt).await.status, 202);
        let events = stream.until_answer(id).await;
        let updates: Vec<Value> = events
            .iter()
            .filter_map(|e| session_update_params(&e.data).cloned())
            .collect();
        assert!(
            updates.iter().all(|u| u["sessionId"] == sid.as_str()),
            "{events:?}"
        );
        assert_eq!(agent_texts(&updates), [format!("from-{i}")], "{events:?}");
        assert_eq!(
            events.last().unwrap().data["result"]["stopReason"],
            "end_turn"
        );
    }
    // The connection stream got nothing of the prompts (only, perhaps, what a session sent
    // before its stream was open).
    assert_eq!(
        post(addr, &[c], &rpc(20, "session/list", json!({})))
            .await
            .status,
        202
    );
    let rest = main.until_answer(20).await;
    let rest: Vec<Value> = rest
        .iter()
        .filter_map(|e| session_update_params(&e.data).cloned())
        .collect();
    assert!(agent_texts(&rest).is_empty(), "{rest:?}");
}

#[tokio::test]
async fn connection_limits_and_the_drain_apply() {
    let mut daemon = Daemon::start_with(DaemonOptions::default().arg("--max-connections", 1)).await;
    let addr = daemon.addr;
    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    // An HTTP connection counts like a WebSocket.
    let r = post(addr, &[], &initialize(1)).await;
    assert_eq!(r.status, 429, "{r:?}");
    let url = daemon.ws_url();
    let ws = crate::support::security_support::upgrade_status(&url, &[], None);
    assert_eq!(ws.await.0, 429);
    let mut stream = Sse::open(addr, &[c, SSE]).await;
    // A drain ends the stream and the daemon exits.
    let status = daemon.sigterm().await;
    assert!(status.success(), "{status:?}");
    assert!(stream.next().await.is_none());
}

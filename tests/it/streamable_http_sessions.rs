//! Streamable HTTP session streams (issue 39, item 2): a `GET /acp` with `Acp-Session-Id` for a
//! session the caller does not have never ends the connection — the official SDK client
//! closes its whole transport on a 401/403/404/410 there — and the request that follows is
//! answered on the stream (`session/load` -32002, `session/delete` `{}`); a grantee of a
//! shared session opens that session's stream and gets its updates.

use serde_json::json;

use crate::streamable_http::{SSE, open, rpc};
use crate::support::http::{Sse, post};
use crate::support::security_support::{self as sec, bearer};
use crate::support::{Daemon, DaemonOptions, agent_texts};

#[tokio::test]
async fn a_stream_for_someone_elses_session_opens_empty_and_answers_on_it() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let addr = daemon.addr;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let (ha, va) = bearer(&alice);
    let mut a = sec::client(&daemon.ws_url(), &[(ha, &va)], None).await;
    let sid = a.open_session(&daemon.work_dir()).await;

    let (hb, vb) = bearer(&bob);
    let (_, conn) = open(addr, &[(hb, &vb)]).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    let mut stream = Sse::open(addr, &[c, s, SSE, (hb, &vb)]).await;
    let load = rpc(
        2,
        "session/load",
        json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [] }),
    );
    assert_eq!(post(addr, &[c, s, (hb, &vb)], &load).await.status, 202);
    let answer = stream.until_answer(2).await;
    assert_eq!(answer.len(), 1, "nothing of alice's session: {answer:?}");
    assert_eq!(answer[0].data["error"]["code"], -32002, "{answer:?}");
    // Alice's turn reaches nobody on bob's stream: the next event there is bob's own answer.
    let (_, r) = a.prompt(&sid, "echo private").await;
    r.expect("alice's prompt");
    let delete = rpc(3, "session/delete", json!({ "sessionId": sid }));
    assert_eq!(post(addr, &[c, s, (hb, &vb)], &delete).await.status, 202);
    let answer = stream.until_answer(3).await;
    assert_eq!(answer.len(), 1, "{answer:?}");
    assert_eq!(answer[0].data["result"], json!({}), "{answer:?}");
    // Bob's delete of a session that is not his changed nothing for alice.
    let (ups, r) = a.prompt(&sid, "echo still mine").await;
    r.expect("alice's session lives on");
    assert_eq!(agent_texts(&ups), ["still mine"]);
}

#[tokio::test]
async fn a_grantee_opens_the_shared_sessions_stream() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let addr = daemon.addr;
    let alice = sec::token_create(&daemon, "alice").await;
    let bob = sec::token_create(&daemon, "bob").await;
    let (ha, va) = bearer(&alice);
    let mut a = sec::client(&daemon.ws_url(), &[(ha, &va)], None).await;
    let sid = a.open_session(&daemon.work_dir()).await;
    a.request(
        "_acpd/session/share",
        json!({ "sessionId": sid, "with": "bob", "role": "observer" }),
    )
    .await
    .expect("share");

    let (hb, vb) = bearer(&bob);
    let (_, conn) = open(addr, &[(hb, &vb)]).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    let mut stream = Sse::open(addr, &[c, s, SSE, (hb, &vb)]).await;
    let attach = rpc(
        2,
        "_acpd/session/attach",
        json!({ "sessionId": sid, "afterSeq": 0, "role": "observer" }),
    );
    assert_eq!(post(addr, &[c, s, (hb, &vb)], &attach).await.status, 202);
    let answer = stream.until_answer(2).await.pop().expect("answer");
    assert_eq!(answer.data["result"]["role"], "observer", "{answer:?}");
    let (_, r) = a.prompt(&sid, "echo for bob").await;
    r.expect("alice's prompt");
    loop {
        let e = stream.next().await.expect("bob's stream ended");
        let text = &e.data["params"]["update"]["content"]["text"];
        if text == "for bob" {
            break;
        }
    }
}

/// The official npm SDK's http-client (`tests/interop/http-client-unknown-session.mjs`): on
/// one connection, a load of a stale id (-32002), a delete of an unknown id (`{}`), then a
/// normal session and prompt. Needs `ACPD_TEST_SDK_DIR` (see `streamable_http.rs`).
#[tokio::test]
#[cfg_attr(
    not(acpd_sdk),
    ignore = "set ACPD_TEST_SDK_DIR to a directory with @agentclientprotocol/sdk installed"
)]
async fn the_official_sdk_http_client_survives_a_stale_load_and_an_unknown_delete() {
    let dir = std::env::var("ACPD_TEST_SDK_DIR").expect("ACPD_TEST_SDK_DIR");
    let script = std::path::Path::new(&dir).join("acpd-http-client-unknown-session.mjs");
    let source = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/http-client-unknown-session.mjs"
    );
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
    assert!(stderr.contains("ok: the connection survived"), "{stderr}");
}

//! Limits and cut-offs: a revoked token's live connection is closed mid-turn, connection and
//! session limits per user, the request rate, a lagging client fed from the journal, a stuck
//! client cut off while a fast one on another session is unaffected, and TLS with a pinned self-signed certificate through
//! `acp-shim`.

use std::time::Duration;

use serde_json::json;

use crate::support::security_support::{self as sec, acpd, bearer};
use crate::support::{Daemon, DaemonOptions};

/// `acpd token list` → the id of the token named `name`.
async fn token_id(daemon: &Daemon, name: &str) -> String {
    let data = daemon.dir().join("data").display().to_string();
    let store = daemon.store_url();
    let run = acpd(&["token", "list", "--data-dir", &data, "--store", &store]).await;
    run.stdout
        .lines()
        .find(|l| l.split('\t').nth(1) == Some(name))
        .and_then(|l| l.split('\t').next())
        .unwrap_or_else(|| panic!("no token {name} in {}", run.stdout))
        .to_owned()
}

#[tokio::test]
async fn a_revoked_token_is_cut_off_mid_turn() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let secret = sec::token_create(&daemon, "mallory").await;
    let (h, v) = bearer(&secret);
    let mut client = sec::client(&daemon.ws_url(), &[(h, &v)], None).await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.send_prompt(&sid, "sleep 8000; echo too late").await;

    let id = token_id(&daemon, "mallory").await;
    let data = daemon.dir().join("data").display().to_string();
    let store = daemon.store_url();
    let run = acpd(&[
        "token",
        "revoke",
        &id,
        "--data-dir",
        &data,
        "--store",
        &store,
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);

    // The live connection ends within a few seconds, long before the turn would.
    let closed = tokio::time::timeout(Duration::from_secs(6), client.wait_closed()).await;
    assert!(closed.is_ok(), "the revoked token's connection stayed open");
    let (status, _) = sec::upgrade_status(&daemon.ws_url(), &[(h, &v)], None).await;
    assert_eq!(status, 401, "a revoked token cannot reconnect");
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(
        log.contains("token revoked: connection cut off"),
        "audit line missing"
    );
}

#[tokio::test]
async fn connections_per_user_are_limited() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-connections-per-principal", 2))
            .await;
    let _a = daemon.client().await;
    let _b = daemon.client().await;
    let (status, body) = sec::upgrade_status(&daemon.ws_url(), &[], None).await;
    assert_eq!(status, 429, "{body}");
    drop(_a);
    // The slot frees once the first connection is gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _) = sec::upgrade_status(&daemon.ws_url(), &[], None).await;
        if status == 101 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection still counts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn live_sessions_per_user_are_limited() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-sessions-per-principal", 2)).await;
    let mut client = daemon.client().await;
    let first = client.new_session(&daemon.work_dir()).await;
    client.new_session(&daemon.work_dir()).await;
    let err = client
        .request(
            "session/new",
            json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
        )
        .await
        .expect_err("a third live session is refused");
    assert!(err.message.contains("too many live sessions"), "{err:?}");
    // Closing one makes room.
    client
        .request("session/close", json!({ "sessionId": first }))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = client
            .request(
                "session/new",
                json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
            )
            .await;
        if r.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "closing a session did not free its slot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_request_rate_is_limited_per_connection() {
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--max-requests-per-second", 5)).await;
    let mut client = daemon.client().await;
    let mut limited = 0;
    for _ in 0..30 {
        if let Err(e) = client.request("session/list", json!({})).await {
            assert_eq!(e.code, -32005, "{e:?}");
            limited += 1;
        }
    }
    assert!(
        limited >= 15,
        "only {limited} of 30 back-to-back requests were limited"
    );
    // The bucket refills (5 a second): a request is admitted again soon.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Err(e) = client.request("session/list", json!({})).await {
        assert_eq!(e.code, -32005, "{e:?}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bucket never refilled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another connection has its own budget.
    let mut other = daemon.client().await;
    other
        .request("session/list", json!({}))
        .await
        .expect("per connection");
}

/// Waits (with a deadline) until the daemon's log has `line`.
async fn wait_for_log(daemon: &Daemon, line: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !std::fs::read_to_string(daemon.log_path())
        .unwrap()
        .contains(line)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no log line {line:?} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stuck_client_is_cut_off_and_a_fast_one_is_unaffected() {
    // A client that takes nothing for a second is cut off.
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--slow-client-cutoff-ms", 1000)).await;
    // The slow client: a raw socket that stops reading after the session is set up.
    let mut slow = daemon.client().await.with_timeout(Duration::from_secs(60));
    let slow_sid = slow.open_session(&daemon.work_dir()).await;
    // A generous deadline: the fast session's updates share the store's writer with the
    // 48 MiB stream, and the machine may be busy.
    let mut fast = daemon.client().await.with_timeout(Duration::from_secs(60));
    let fast_sid = fast.open_session(&daemon.work_dir()).await;

    // 48 MiB for a client that reads nothing.
    slow.send_prompt(&slow_sid, "stream 6000 8192").await;
    for i in 0..5 {
        let (_, r) = fast.prompt(&fast_sid, &format!("echo fast {i}")).await;
        assert_eq!(r.unwrap()["stopReason"], "end_turn");
    }

    // The slow one lags, fed from the journal as it reads; it reads nothing, so it is
    // disconnected, with a log line saying why. (`wait_closed` reads, so it must not start
    // before then.)
    wait_for_log(&daemon, "cannot keep up", Duration::from_secs(60)).await;
    let closed = tokio::time::timeout(Duration::from_secs(30), slow.wait_closed()).await;
    assert!(closed.is_ok(), "the slow client was never cut off");

    // Nothing is lost from the journal: a client attached from the start sees the whole
    // stream, replayed and then live, to its last chunk.
    let mut again = daemon.client().await.with_timeout(Duration::from_secs(60));
    let id = again
        .send_request(
            "_acpd/session/attach",
            json!({ "sessionId": slow_sid, "afterSeq": 0 }),
        )
        .await;
    // One update at a time: the reader must keep up with a one-second cut-off.
    let (mut chunks, mut last) = (0, 0);
    while chunks < 6000 {
        let u = again.next_update().await;
        let seq = crate::support::seq(&u);
        assert!(
            seq > last,
            "seq {seq} after {last}: repeated or out of order"
        );
        last = seq;
        if u["update"]["sessionUpdate"] == "agent_message_chunk" {
            chunks += 1;
        }
    }
    again.wait_response(&id).await.expect("attach");
}

#[tokio::test]
async fn a_client_that_falls_behind_catches_up_from_the_journal_in_order() {
    let daemon = Daemon::start().await;
    let mut c = daemon.client().await.with_timeout(Duration::from_secs(120));
    let sid = c.open_session(&daemon.work_dir()).await;
    // 40 MiB: far more than a client's queue (8 MiB) and the socket buffers hold, so the
    // session must feed this client from the journal for a while.
    let id = c.send_prompt(&sid, "stream 5000 8192").await;
    // Read nothing until the session says the client lags.
    wait_for_log(
        &daemon,
        "feeding it from the journal",
        Duration::from_secs(60),
    )
    .await;
    let (updates, r) = c.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("the turn ends normally")["stopReason"], "end_turn");
    let seqs: Vec<i64> = updates
        .iter()
        .map(|u| u["_meta"]["acpd"]["seq"].as_i64().expect("a journal seq"))
        .collect();
    let chunks = updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert_eq!(chunks, 5000, "every chunk, once");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "seqs arrive in order without gaps or repeats"
    );
    // Still connected: the client was slow, not stuck.
    let (_, r) = c.prompt(&sid, "echo still here").await;
    assert_eq!(r.unwrap()["stopReason"], "end_turn");
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(!log.contains("cannot keep up"), "the client was cut off");
}

#[tokio::test]
async fn tls_with_a_pinned_self_signed_certificate_through_acp_shim() {
    let dir = tempfile::tempdir().unwrap();
    let cert = sec::make_cert(dir.path()).await;
    let mut opts = DaemonOptions::default();
    for a in cert.args() {
        opts.args.push(a);
    }
    let daemon = Daemon::start_with(opts).await;
    let url = format!("wss://{}/acp", daemon.addr);
    let pin = cert.fingerprint.clone();
    let mut shim =
        crate::shim_support::Shim::spawn(&url, &["--pin-sha256", &pin], dir.path()).unwrap();
    let id = shim
        .request(
            "initialize",
            json!({ "protocolVersion": 1, "clientCapabilities": {} }),
        )
        .await
        .unwrap();
    let (init, _) = shim.until_response(id).await.unwrap();
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let sid = shim.open_session().await.unwrap();
    let id = shim
        .request(
            "session/prompt",
            crate::shim_support::prompt(&sid, "echo over tls"),
        )
        .await
        .unwrap();
    let (resp, updates) = shim.until_response(id).await.unwrap();
    assert_eq!(resp["result"]["stopReason"], "end_turn");
    assert!(
        updates
            .iter()
            .any(|u| u["params"]["update"]["content"]["text"] == "over tls"),
        "{updates:?}"
    );

    // A wrong pin is a TLS failure with its own exit code.
    let wrong = "00".repeat(32);
    let mut bad =
        crate::shim_support::Shim::spawn(&url, &["--pin-sha256", &wrong], dir.path()).unwrap();
    let _ = bad
        .request(
            "initialize",
            json!({ "protocolVersion": 1, "clientCapabilities": {} }),
        )
        .await;
    assert_eq!(bad.wait_exit().await.unwrap(), 76, "{}", bad.stderr());
}

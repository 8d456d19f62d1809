//! acp-shim and link resumption end to end: the real daemon and shim binaries, real sockets,
//! a fault-injecting proxy between them. Every wait is bounded (`shim_support::WAIT`).

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::shim_support::{Daemon, Proxy, Shim, WAIT, free_port, prompt};

/// Updates for `sid` among `msgs`: (seq, update).
fn updates<'a>(msgs: &'a [Value], sid: &str) -> Vec<(i64, &'a Value)> {
    msgs.iter()
        .filter(|m| m["method"] == "session/update" && m["params"]["sessionId"] == sid)
        .map(|m| {
            let seq = m["params"]["_meta"]["acpd"]["seq"].as_i64().unwrap_or(-1);
            (seq, &m["params"]["update"])
        })
        .collect()
}

fn chunk_texts(ups: &[(i64, &Value)]) -> Vec<String> {
    ups.iter()
        .filter(|(_, u)| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|(_, u)| u["content"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// `n` chunks of `stream` commands of `per` chunks each arrived once each, in order, and the
/// session's updates (chunks and whatever else the turn produced meanwhile, such as a mode
/// change sent during an outage) carry consecutive journal seqs: nothing lost, nothing twice.
fn assert_stream(ups: &[(i64, &Value)], n: usize, per: usize) -> Result<()> {
    // From the first chunk to the last: the user's own prompt entry, journaled before them,
    // is not echoed to the client that sent it.
    let is_chunk = |(_, u): &&(i64, &Value)| u["sessionUpdate"] == "agent_message_chunk";
    let first = ups.iter().position(|u| is_chunk(&u)).unwrap_or(0);
    let last = ups.iter().rposition(|u| is_chunk(&u)).map_or(0, |l| l + 1);
    let turn = ups.get(first..last).unwrap_or_default();
    for (i, w) in turn.windows(2).enumerate() {
        if w[1].0 != w[0].0 + 1 {
            bail!(
                "seq {} follows {} at update {i} ({} after {})",
                w[1].0,
                w[0].0,
                w[1].1["sessionUpdate"],
                w[0].1["sessionUpdate"]
            );
        }
    }
    let chunks = chunk_texts(ups);
    if chunks.len() != n {
        bail!("expected {n} chunks, got {}", chunks.len());
    }
    for (i, text) in chunks.iter().enumerate() {
        if !text.starts_with(&format!("{}:", i % per)) {
            bail!("chunk {i} is {text:?}");
        }
    }
    Ok(())
}

fn random(lo: u64, hi: u64) -> u64 {
    let r = RandomState::new().hash_one(std::time::Instant::now());
    lo + r % (hi - lo)
}

#[tokio::test]
async fn plain_rfd_client_still_works() -> Result<()> {
    let d = Daemon::start(false).await?;
    let (mut ws, resp) = tokio_tungstenite::connect_async(d.url()).await?;
    assert!(resp.headers().get("sec-websocket-protocol").is_none());
    assert!(resp.headers().get("acp-connection-id").is_some());
    let mut call = async |id: u64, method: &str, params: Value| -> Result<(Value, Vec<Value>)> {
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        ws.send(Message::Text(req.to_string().into())).await?;
        let mut before = vec![];
        loop {
            let msg = tokio::time::timeout(WAIT, ws.next())
                .await?
                .context("socket closed")??;
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(t.as_str())?;
            if v.get("method").is_none() && v["id"] == json!(id) {
                return Ok((v, before));
            }
            before.push(v);
        }
    };
    let (init, _) = call(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    )
    .await?;
    assert_eq!(init["result"]["protocolVersion"], 1);
    let (new, _) = call(2, "session/new", json!({"cwd": "/usr", "mcpServers": []})).await?;
    let sid = new["result"]["sessionId"]
        .as_str()
        .context("sessionId")?
        .to_owned();
    let (done, msgs) = call(3, "session/prompt", prompt(&sid, "echo plain hello")).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let ups = updates(&msgs, &sid);
    assert!(
        chunk_texts(&ups).iter().any(|t| t == "plain hello"),
        "{msgs:?}"
    );
    assert!(
        ups.iter().all(|(seq, _)| *seq > 0),
        "every update carries its seq"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shim_relays_exactly_once_across_cuts() -> Result<()> {
    let d = Daemon::start(false).await?;
    let proxy = Proxy::start(([127, 0, 0, 1], d.port).into()).await?;
    let mut shim = Shim::spawn(&proxy.url(), &["--agent", "s"], d.dir.path())?;
    let sid = shim.open_session().await?;
    let id = shim
        .request("session/prompt", prompt(&sid, "stream 5000 64"))
        .await?;
    // Five cuts at random points of the stream (each after another 20-60 KB reached the
    // shim), timed by the bytes flowing, not by the clock.
    let p = proxy.clone();
    let cutter = tokio::spawn(async move {
        let mut at = 0;
        for _ in 0..5 {
            at += random(20_000, 60_000);
            if p.wait_down_bytes(at).await.is_err() {
                return;
            }
            p.cut();
        }
    });
    let (done, msgs) = shim.until_response(id).await?;
    cutter.abort();
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert_stream(&updates(&msgs, &sid), 5000, 5000)?;
    let log = shim.stderr();
    if std::env::var_os("SHIM_TEST_DUMP").is_some() {
        eprintln!("{log}\n-----\n{}", d.log());
    }
    assert!(log.contains("resumed=true"), "no resume happened:\n{log}");
    assert!(
        !log.contains("re-attaching"),
        "a resume fell back to re-attach:\n{log}"
    );
    // The link still works after all that.
    let id = shim
        .request("session/prompt", prompt(&sid, "echo still here"))
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn");
    assert!(chunk_texts(&updates(&msgs, &sid)).contains(&"still here".to_owned()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_link_is_noticed_and_resumed() -> Result<()> {
    let d = Daemon::start(false).await?;
    let proxy = Proxy::start(([127, 0, 0, 1], d.port).into()).await?;
    let mut shim = Shim::spawn(&proxy.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let script = "stream 300 32\nsleep 1500\nstream 300 32";
    let id = shim.request("session/prompt", prompt(&sid, script)).await?;
    let mut msgs = vec![];
    // Freeze the network as soon as the turn is streaming.
    loop {
        let m = shim.recv().await?;
        let first = m["params"]["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("0:"));
        msgs.push(m);
        if first {
            break;
        }
    }
    proxy.blackhole();
    // Editor -> daemon traffic during the outage is delivered too.
    let mode = json!({"sessionId": sid, "modeId": "plan"});
    let mode_id = shim.request("session/set_mode", mode).await?;
    // The network comes back once the shim has noticed it was gone.
    shim.wait_stderr("keepalive").await?;
    proxy.heal();
    let (done, rest) = shim.until_response(id).await?;
    msgs.extend(rest);
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert_stream(&updates(&msgs, &sid), 600, 300)?;
    let mode_answer = match msgs
        .iter()
        .find(|m| m["id"] == json!(mode_id) && m.get("method").is_none())
    {
        Some(m) => m.clone(),
        None => shim.until_response(mode_id).await?.0,
    };
    assert!(mode_answer.get("result").is_some(), "{mode_answer}");
    let log = shim.stderr();
    if std::env::var_os("SHIM_TEST_DUMP").is_some() {
        eprintln!("{log}\n-----\n{}", d.log());
    }
    assert!(
        log.contains("keepalive"),
        "the keepalive did not notice:\n{log}"
    );
    assert!(log.contains("resumed=true"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_link_falls_back_to_reattach() -> Result<()> {
    let dir = Arc::new(tempfile::tempdir()?);
    let d = Daemon::start_with(dir, 0, false, &["--resume-grace-secs", "1"]).await?;
    let proxy = Proxy::start(([127, 0, 0, 1], d.port).into()).await?;
    let mut shim = Shim::spawn(&proxy.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let id = shim
        .request(
            "session/prompt",
            prompt(&sid, "echo early\nsleep 3000\necho late"),
        )
        .await?;
    let early = loop {
        let m = shim.recv().await?;
        if m["params"]["update"]["content"]["text"] == "early" {
            break m["params"]["_meta"]["acpd"]["seq"]
                .as_i64()
                .context("seq")?;
        }
    };
    // Dead network for longer than keepalive detection plus the grace period: the daemon
    // forgets the link while the turn goes on.
    proxy.blackhole();
    d.wait_log("grace period over").await?;
    proxy.heal();
    // The prompt's own answer went to the forgotten link: the shim answers it...
    let (done, _) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "cancelled", "{done}");
    // ...and the re-attached session still gets the rest of the turn, once.
    let late = loop {
        let m = shim.recv().await?;
        if m["params"]["update"]["content"]["text"] == "late" {
            break m["params"]["_meta"]["acpd"]["seq"]
                .as_i64()
                .context("seq")?;
        }
        assert_ne!(
            m["params"]["update"]["content"]["text"], "early",
            "replayed twice"
        );
    };
    assert!(late > early);
    assert!(shim.stderr().contains("re-attaching"), "{}", shim.stderr());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_restart_mid_turn_is_recovered() -> Result<()> {
    let d = Daemon::start(false).await?;
    let port = d.port;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let id = shim
        .request(
            "session/prompt",
            prompt(&sid, "echo before restart\nsleep 60000"),
        )
        .await?;
    let before_seq = loop {
        let m = shim.recv().await?;
        if m["params"]["update"]["content"]["text"] == "before restart" {
            break m["params"]["_meta"]["acpd"]["seq"]
                .as_i64()
                .context("seq")?;
        }
    };
    let dir = d.kill().await;
    let _d2 = Daemon::start_in(dir.clone(), port, false).await?;
    // The lost turn gets a proper answer, not an error and not silence.
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "cancelled", "{done}");
    let ups = updates(&msgs, &sid);
    assert!(
        ups.iter().all(|(seq, _)| *seq > before_seq),
        "replayed twice: {msgs:?}"
    );
    // The session lives on.
    let id = shim
        .request("session/prompt", prompt(&sid, "echo after restart"))
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let ups = updates(&msgs, &sid);
    let after = ups
        .iter()
        .find(|(_, u)| u["content"]["text"] == "after restart")
        .context("after-restart chunk")?;
    assert!(after.0 > before_seq);
    // And its history replays in order.
    let load = json!({"sessionId": sid, "cwd": "/usr", "mcpServers": []});
    let id = shim.request("session/load", load).await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert!(done.get("result").is_some(), "{done}");
    let texts = chunk_texts(&updates(&msgs, &sid));
    let b = texts.iter().position(|t| t == "before restart");
    let a = texts.iter().position(|t| t == "after restart");
    assert!(matches!((b, a), (Some(b), Some(a)) if b < a), "{texts:?}");
    let log = shim.stderr();
    if std::env::var_os("SHIM_TEST_DUMP").is_some() {
        eprintln!("{log}\n-----\n{}", _d2.log());
    }
    assert!(log.contains("re-attaching"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_daemon_restart_is_recovered() -> Result<()> {
    let d = Daemon::start(false).await?;
    let port = d.port;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let id = shim
        .request("session/prompt", prompt(&sid, "echo one"))
        .await?;
    shim.until_response(id).await?;
    // The drain closes resumable links too: their tasks are tracked, so it ends with every
    // task stopped rather than by giving up on them.
    let log = d.dir.path().join("acpd.log");
    let (code, dir) = d.terminate().await?;
    assert_eq!(code, 0);
    let log = std::fs::read_to_string(log)?;
    assert!(log.contains("shutdown complete"), "{log}");
    assert!(!log.contains("did not stop in time"), "{log}");
    let _d2 = Daemon::start_in(dir, port, false).await?;
    let id = shim
        .request("session/prompt", prompt(&sid, "echo two"))
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert_eq!(chunk_texts(&updates(&msgs, &sid)), vec!["two".to_owned()]);
    let log = shim.stderr();
    assert!(log.contains("acpd is restarting"), "{log}");
    Ok(())
}

/// A resume attempt with raw headers; returns the HTTP status (101 on success).
async fn resume_status(url: &str, auth: &str, link: &str, with_proto: bool) -> Result<u16> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.into_client_request()?;
    let h = req.headers_mut();
    h.insert("authorization", format!("Bearer {auth}").parse()?);
    h.insert("acpd-resume", link.parse()?);
    h.insert("acpd-last-seq", "0".parse()?);
    if with_proto {
        h.insert("sec-websocket-protocol", "acpd.resume.v1".parse()?);
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((_, resp)) => Ok(resp.status().as_u16()),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Ok(resp.status().as_u16()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn resume_is_refused_for_unknown_links_and_other_principals() -> Result<()> {
    let d = Daemon::start(true).await?;
    let token = std::fs::read_to_string(d.token_file())?.trim().to_owned();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_acpd"))
        .args(["token", "create", "--name", "mallory", "--data-dir"])
        .arg(d.dir.path())
        .output()
        .await?;
    let other = String::from_utf8(out.stdout)?.trim().to_owned();
    assert!(other.starts_with("acpd_"), "token create printed {other:?}");
    let token_file = d.token_file();
    let args = ["--token-file", token_file.to_str().context("path")?];
    let mut shim = Shim::spawn(&d.url(), &args, d.dir.path())?;
    let id = shim
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        )
        .await?;
    let (init, _) = shim.until_response(id).await?;
    let link = init["result"]["_meta"]["acpd"]["connectionId"]
        .as_str()
        .context("connectionId")?
        .to_owned();
    // Someone else's token cannot take the link over, and does not learn that it exists.
    assert_eq!(resume_status(&d.url(), &other, &link, true).await?, 410);
    assert_eq!(
        resume_status(&d.url(), &token, "no-such-link", true).await?,
        410
    );
    let plain = resume_status(&d.url(), &token, &link, false).await?;
    assert_eq!(plain, 400, "a resume needs the subprotocol");
    // The shim's link was not disturbed by any of that.
    let id = shim
        .request("session/new", json!({"cwd": "/usr", "mcpServers": []}))
        .await?;
    assert!(shim.until_response(id).await?.0.get("result").is_some());
    Ok(())
}

#[tokio::test]
async fn stdin_closed_exits_zero_and_stdout_is_protocol_only() -> Result<()> {
    let d = Daemon::start(false).await?;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    shim.open_session().await?;
    // Not JSON: answered by the shim itself, never framed (the link must survive it).
    shim.send_line("{not json").await?;
    let err = shim.next_answer().await?;
    assert_eq!(err["error"]["code"], -32700, "{err}");
    // JSON but not a request: the daemon's business; it answers, the link lives.
    shim.send(&json!([1, 2])).await?;
    let err = shim.next_answer().await?;
    assert!(err.get("error").is_some(), "{err}");
    let id = shim.request("session/list", json!({})).await?;
    assert!(shim.until_response(id).await?.0.get("result").is_some());
    shim.close_stdin();
    assert_eq!(shim.wait_exit().await?, 0, "{}", shim.stderr());
    // Whatever was left on stdout is JSON lines too (recv checks every line).
    while let Ok(m) = shim.recv().await {
        assert!(m.is_object());
    }
    Ok(())
}

#[tokio::test]
async fn bad_token_exits_77_and_good_token_works() -> Result<()> {
    let d = Daemon::start(true).await?;
    let bad = d.dir.path().join("bad-token");
    std::fs::write(&bad, "acpd_not-a-real-token\n")?;
    let mut shim = Shim::spawn(
        &d.url(),
        &["--token-file", bad.to_str().context("path")?],
        d.dir.path(),
    )?;
    assert_eq!(shim.wait_exit().await?, 77);
    let err = shim.stderr();
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("acp-shim: ") && last.contains("token"),
        "{err}"
    );

    let good = d.token_file();
    let mut shim = Shim::spawn(
        &d.url(),
        &["--token-file", good.to_str().context("path")?],
        d.dir.path(),
    )?;
    shim.open_session().await?;
    Ok(())
}

#[tokio::test]
async fn nothing_listening_exits_69_and_bad_usage_64() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let url = format!("ws://127.0.0.1:{}/acp", free_port());
    let mut shim = Shim::spawn(&url, &[], dir.path())?;
    assert_eq!(shim.wait_exit().await?, 69);
    assert!(
        shim.stderr()
            .lines()
            .last()
            .unwrap_or_default()
            .starts_with("acp-shim: cannot reach acpd")
    );
    let mut shim = Shim::spawn("http://127.0.0.1:1/acp", &[], dir.path())?;
    assert_eq!(shim.wait_exit().await?, 64);
    Ok(())
}

/// A TLS WebSocket server speaking just enough acpd.resume.v1 to greet: the pin verifier is
/// tested end to end without the daemon (whose TLS is another issue).
#[allow(clippy::result_large_err)] // tungstenite's handshake callback signature
async fn tls_greeter() -> Result<(u16, [u8; 32])> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use sha2::{Digest, Sha256};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/shim_tls");
    let cert = CertificateDer::from_pem_file(format!("{dir}/cert.pem"))?;
    let key = PrivateKeyDer::from_pem_file(format!("{dir}/key.pem"))?;
    let pin: [u8; 32] = Sha256::digest(cert.as_ref()).into();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(vec![cert], key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let cb = |_: &tokio_tungstenite::tungstenite::handshake::server::Request,
                          mut resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
                    let h = resp.headers_mut();
                    h.insert("sec-websocket-protocol", "acpd.resume.v1".parse().expect("hv"));
                    h.insert("acp-connection-id", "tls-test".parse().expect("hv"));
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tls, cb).await else {
                    return;
                };
                let hello = r#"{"s":1,"a":0,"m":{"jsonrpc":"2.0","method":"hello"}}"#;
                let _ = ws.send(Message::Text(hello.into())).await;
                while let Some(Ok(_)) = ws.next().await {}
            });
        }
    });
    Ok((port, pin))
}

#[tokio::test]
async fn wss_with_pinned_certificate() -> Result<()> {
    let (port, pin) = tls_greeter().await?;
    let dir = tempfile::tempdir()?;
    let url = format!("wss://127.0.0.1:{port}/acp");
    let hex: String = pin
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut shim = Shim::spawn(&url, &["--pin-sha256", &hex], dir.path())?;
    assert_eq!(
        shim.recv().await?,
        json!({"jsonrpc": "2.0", "method": "hello"})
    );
    shim.close_stdin();
    assert_eq!(shim.wait_exit().await?, 0);

    let wrong = "ab".repeat(32);
    let mut shim = Shim::spawn(&url, &["--pin-sha256", &wrong], dir.path())?;
    assert_eq!(shim.wait_exit().await?, 76);
    assert!(
        shim.stderr().contains("does not match --pin-sha256"),
        "{}",
        shim.stderr()
    );
    // Without a pin the self-signed certificate is refused by the web PKI roots.
    let mut shim = Shim::spawn(&url, &[], dir.path())?;
    assert_eq!(shim.wait_exit().await?, 76);
    Ok(())
}

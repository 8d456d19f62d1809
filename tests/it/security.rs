//! Security rules end to end: TLS with a certificate from `acpd cert` (and its SIGHUP
//! reload), the refusal to serve a network address in clear, the Origin allowlist, bearer
//! tokens (never in the URL), and two principals who cannot reach each other's sessions.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::security_support::{
    Cert, RawDaemon, acpd, bearer, client, connect, eventually, local_token, make_cert, read_token,
    signal, token_create, trusting, upgrade_status, wss_url,
};
use crate::support::{Client, Daemon, DaemonOptions, RpcError, agent_texts, kind};

fn tls_options(cert: &Cert) -> DaemonOptions {
    DaemonOptions {
        args: cert.args(),
        ..DaemonOptions::default()
    }
}

/// A free loopback port number.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// The SHA-256 (plain hex) of the certificate the server presents to a client trusting
/// `cert`; an error when the handshake fails (e.g. the server presents another one).
async fn handshake(daemon: &Daemon, cert: &std::path::Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let tcp = tokio::net::TcpStream::connect(daemon.addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let connecting = tokio_rustls::TlsConnector::from(trusting(cert)).connect(name, tcp);
    let stream = tokio::time::timeout(Duration::from_secs(10), connecting)
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let der = &stream
        .get_ref()
        .1
        .peer_certificates()
        .ok_or("no certificate")?[0];
    Ok(Sha256::digest(der.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

async fn prompt_echo(client: &mut Client, sid: &str, text: &str) {
    let (updates, result) = client.prompt(sid, &format!("echo {text}")).await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), [text]);
}

#[tokio::test]
async fn tls_end_to_end_with_a_certificate_from_acpd_cert() {
    let certs = tempfile::tempdir().expect("temp dir");
    let cert = make_cert(certs.path()).await;
    assert_eq!(cert.fingerprint.len(), 64, "{}", cert.fingerprint);
    assert_eq!(
        cert.fingerprint_colons.replace(':', "").to_lowercase(),
        cert.fingerprint
    );
    let daemon = Daemon::start_with(tls_options(&cert)).await;

    // The certificate served is the one whose fingerprint `acpd cert` printed: the pin.
    assert_eq!(
        handshake(&daemon, &cert.cert).await,
        Ok(cert.fingerprint.clone())
    );

    let mut c = client(&wss_url(&daemon), &[], Some(trusting(&cert.cert))).await;
    let sid = c.open_session(&daemon.work_dir()).await;
    prompt_echo(&mut c, &sid, "over tls").await;
    let listed = c.list(None, None).await.expect("list");
    assert_eq!(listed["sessions"][0]["sessionId"], sid.as_str());

    // No clear-text fallback on the TLS port.
    let plain = format!("ws://{}/acp", daemon.addr);
    assert!(
        connect(&plain, &[], None).await.is_err(),
        "ws:// must not work on a TLS port"
    );
    // A client that trusts another certificate is refused by its own TLS check.
    let other = tempfile::tempdir().expect("temp dir");
    let other = make_cert(other.path()).await;
    assert!(handshake(&daemon, &other.cert).await.is_err());
}

#[tokio::test]
async fn sighup_reloads_the_certificate_for_new_connections_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let live = make_cert(&dir.path().join("live")).await;
    let daemon = Daemon::start_with(tls_options(&live)).await;
    // Trust in the first certificate, from a copy that survives the overwrite below.
    let old_pem = dir.path().join("old.pem");
    std::fs::copy(&live.cert, &old_pem).expect("keep the old certificate");

    let mut old = client(&wss_url(&daemon), &[], Some(trusting(&old_pem))).await;
    let old_sid = old.open_session(&daemon.work_dir()).await;
    prompt_echo(&mut old, &old_sid, "before reload").await;

    // A new pair in place of the old files, then SIGHUP.
    let next = make_cert(&dir.path().join("next")).await;
    std::fs::copy(&next.cert, &live.cert).expect("replace cert");
    std::fs::copy(&next.key, &live.key).expect("replace key");
    signal(daemon.pid(), libc::SIGHUP);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match handshake(&daemon, &next.cert).await {
            Ok(fp) => {
                assert_eq!(fp, next.fingerprint);
                break;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the new certificate was not served within 10 s of SIGHUP: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        handshake(&daemon, &old_pem).await.is_err(),
        "new connections must get the new certificate"
    );

    let mut new = client(&wss_url(&daemon), &[], Some(trusting(&next.cert))).await;
    let new_sid = new.open_session(&daemon.work_dir()).await;
    prompt_echo(&mut new, &new_sid, "after reload").await;
    // The connection made before the reload was not dropped.
    prompt_echo(&mut old, &old_sid, "still here").await;

    // A broken pair on SIGHUP is logged and the current certificate kept.
    std::fs::write(&live.key, "garbage").expect("break the key");
    signal(daemon.pid(), libc::SIGHUP);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(daemon.log_path())
        .unwrap_or_default()
        .contains("cannot reload the TLS certificate")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload error logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        handshake(&daemon, &next.cert).await,
        Ok(next.fingerprint.clone())
    );
}

#[tokio::test]
async fn network_address_without_tls_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data").display().to_string();
    let any = format!("0.0.0.0:{}", free_port());
    let run = acpd(&["serve", "--listen", &any, "--data-dir", &data]).await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    assert!(
        run.stderr.contains("TLS"),
        "the reason names TLS: {}",
        run.stderr
    );

    // The raw TCP listener has no authentication at all: loopback only, --insecure or not.
    let tcp = format!("0.0.0.0:{}", free_port());
    let run = acpd(&[
        "serve",
        "--tcp-listen",
        &tcp,
        "--insecure",
        "--data-dir",
        &data,
    ])
    .await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);

    // Half a TLS pair, or a pair that does not match, is a configuration error too.
    let certs = make_cert(&dir.path().join("a")).await;
    let other = make_cert(&dir.path().join("b")).await;
    let (cert, key, other_key) = (
        certs.cert.display().to_string(),
        certs.key.display().to_string(),
        other.key.display().to_string(),
    );
    for args in [
        vec!["serve", "--tls-cert", &cert, "--data-dir", &data],
        vec!["serve", "--tls-key", &key, "--data-dir", &data],
        vec![
            "serve",
            "--tls-cert",
            &cert,
            "--tls-key",
            &other_key,
            "--data-dir",
            &data,
        ],
        vec![
            "serve",
            "--tls-cert",
            &key,
            "--tls-key",
            &key,
            "--data-dir",
            &data,
        ],
    ] {
        let run = acpd(&args).await;
        assert_eq!(run.code, Some(64), "{args:?}: {}", run.stderr);
    }
}

#[tokio::test]
async fn insecure_serves_a_network_address_and_warns() {
    let args = ["--listen", "0.0.0.0:0", "--insecure"];
    let (daemon, addrs) = RawDaemon::start(&args, &["acpd listening: "]).await;
    let probe = addrs[0];
    eventually("the --insecure warning", || {
        daemon.log().contains("--insecure")
    })
    .await;
    // Authentication still applies.
    let url = format!("ws://{probe}/acp");
    assert_eq!(upgrade_status(&url, &[], None).await.0, 401);
    let secret = read_token(&daemon.data_dir()).await;
    let (name, value) = bearer(&secret);
    assert_eq!(upgrade_status(&url, &[(name, &value)], None).await.0, 101);
}

#[tokio::test]
async fn browser_origins_must_be_allowed() {
    let allowed = "https://editor.example";
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--allowed-origin", allowed)).await;
    let url = daemon.ws_url();
    // Native clients send no Origin: unaffected.
    assert_eq!(upgrade_status(&url, &[], None).await.0, 101);
    let mut c = client(&url, &[("origin", allowed)], None).await;
    let sid = c.open_session(&daemon.work_dir()).await;
    prompt_echo(&mut c, &sid, "from the browser").await;
    for bad in ["https://evil.example", "http://editor.example", "null"] {
        let (status, _) = upgrade_status(&url, &[("origin", bad)], None).await;
        assert_eq!(status, 403, "origin {bad}");
    }

    // With no allowlist, every browser origin is refused.
    let plain = Daemon::start().await;
    let (status, _) = upgrade_status(&plain.ws_url(), &[("origin", allowed)], None).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn tokens_are_required_and_never_taken_from_the_url() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let url = daemon.ws_url();
    let secret = local_token(&daemon).await;
    let (name, good) = bearer(&secret);

    assert_eq!(upgrade_status(&url, &[], None).await.0, 401);
    for bad in [
        "Bearer acpd_wrong",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        &secret,
    ] {
        let (status, _) = upgrade_status(&url, &[(name, bad)], None).await;
        assert_eq!(status, 401, "Authorization: {bad}");
    }

    // A credential in the query string is refused even next to a valid header, and the
    // refusal says where the token goes.
    for q in [
        format!("token={secret}"),
        format!("agent=scripted&access_token={secret}"),
    ] {
        let (status, body) = upgrade_status(&format!("{url}?{q}"), &[(name, &good)], None).await;
        assert_eq!(status, 400, "?{q}");
        assert!(body.contains("Authorization"), "{body}");
        assert!(
            !body.contains(&secret),
            "the refusal echoes the secret: {body}"
        );
    }

    let mut c = client(&url, &[(name, &good)], None).await;
    let sid = c.open_session(&daemon.work_dir()).await;
    prompt_echo(&mut c, &sid, "authenticated").await;

    let log = std::fs::read_to_string(daemon.log_path()).expect("daemon log");
    assert!(!log.contains(&secret), "the secret is in the log");
}

/// Params of a session method for a given session id.
type ParamsFor<'a> = Box<dyn Fn(&str) -> Value + 'a>;

/// What a request on someone else's session must look like: the reply to the same request
/// on a session that does not exist, with the ids swapped.
async fn same_as_unknown(
    attacker: &mut Client,
    method: &str,
    params: impl Fn(&str) -> Value,
    victim_sid: &str,
) -> Result<Value, RpcError> {
    let ghost = "00000000-0000-4000-8000-000000000000";
    let on_victim = attacker.request(method, params(victim_sid)).await;
    let on_ghost = attacker.request(method, params(ghost)).await;
    let swap = |r: Result<Value, RpcError>| match r {
        Ok(v) => Ok(v),
        Err(mut e) => {
            if let Some(d) = e.data.as_mut() {
                *d = serde_json::from_str(&d.to_string().replace(ghost, victim_sid))
                    .expect("data stays JSON");
            }
            Err(e)
        }
    };
    assert_eq!(
        on_victim,
        swap(on_ghost),
        "{method} on another principal's session differs from an unknown one"
    );
    on_victim
}

#[tokio::test]
async fn principals_cannot_reach_each_others_sessions() {
    let daemon = Daemon::start_with(DaemonOptions::default().auth()).await;
    let url = daemon.ws_url();
    let alice_token = token_create(&daemon, "alice").await;
    let bob_token = token_create(&daemon, "bob").await;
    let (h, a) = bearer(&alice_token);
    let mut alice = client(&url, &[(h, &a)], None).await;
    let (h, b) = bearer(&bob_token);
    let mut bob = client(&url, &[(h, &b)], None).await;
    let cwd = daemon.work_dir();

    let victim = alice.open_session(&cwd).await;
    prompt_echo(&mut alice, &victim, "alice's secret").await;
    let bobs = bob.open_session(&cwd).await;
    // Alice's next turn runs while Bob attacks.
    let turn = alice
        .send_prompt(&victim, "echo started; sleep 2000; echo finished")
        .await;

    let listed = bob.list(None, None).await.expect("list");
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert_eq!(ids, [bobs.as_str()], "bob sees only his own session");
    let listed = bob.list(Some(&cwd), None).await.expect("list by cwd");
    assert!(!listed.to_string().contains(&victim));

    let with_cwd = |sid: &str| json!({ "sessionId": sid, "cwd": &cwd, "mcpServers": [] });
    let cases: Vec<(&str, ParamsFor)> = vec![
        ("session/load", Box::new(with_cwd)),
        ("session/resume", Box::new(with_cwd)),
        (
            "session/prompt",
            Box::new(
                |sid| json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "echo pwned" }] }),
            ),
        ),
        ("session/close", Box::new(|sid| json!({ "sessionId": sid }))),
        (
            "session/set_mode",
            Box::new(|sid| json!({ "sessionId": sid, "modeId": "plan" })),
        ),
        (
            "session/set_config_option",
            Box::new(|sid| json!({ "sessionId": sid, "configId": "verbosity", "value": "high" })),
        ),
        (
            "_acpd/session/attach",
            Box::new(|sid| json!({ "sessionId": sid, "afterSeq": 0 })),
        ),
        (
            "session/set_model",
            Box::new(|sid| json!({ "sessionId": sid, "modelId": "x" })),
        ),
    ];
    for (method, params) in &cases {
        let err = same_as_unknown(&mut bob, method, params, &victim)
            .await
            .expect_err(method);
        assert_eq!(err.code, -32002, "{method}: {err}");
    }
    // Delete of what does not exist is a silent success; it must delete nothing.
    let deleted = same_as_unknown(
        &mut bob,
        "session/delete",
        |sid| json!({ "sessionId": sid }),
        &victim,
    )
    .await;
    assert_eq!(deleted, Ok(json!({})));
    // Cancel is a notification: no answer, and Alice's turn must not stop.
    bob.notify("session/cancel", json!({ "sessionId": victim }))
        .await;
    let after = bob.request("session/list", json!({})).await.expect("list");
    assert!(!after.to_string().contains(&victim));
    assert!(
        bob.take_buffered_updates()
            .iter()
            .all(|u| u["sessionId"] != victim.as_str()),
        "bob received alice's updates"
    );

    let (updates, result) = alice.collect_updates_until_response(&turn).await;
    assert_eq!(result.expect("alice's turn")["stopReason"], "end_turn");
    assert_eq!(agent_texts(&updates), ["started", "finished"]);
    prompt_echo(&mut alice, &victim, "still mine").await;
    let listed = alice.list(None, None).await.expect("list");
    assert!(listed.to_string().contains(&victim));

    // A fresh connection of Alice's replays everything, untouched by Bob.
    let mut again = client(&url, &[(h, &a)], None).await;
    let (replay, result) = again.load(&victim, &cwd).await;
    result.expect("alice loads her session");
    // One entry per message: the turn's two chunks are one.
    let texts = agent_texts(&replay);
    assert_eq!(texts, ["alice's secret", "startedfinished", "still mine"]);
    assert!(
        replay
            .iter()
            .all(|u| !matches!(kind(u), "current_mode_update" | "config_option_update")),
        "bob changed alice's mode or config"
    );
    // One agent process per principal.
    assert_eq!(daemon.agent_pids().len(), 2);
}

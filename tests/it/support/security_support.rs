//! Helpers for the security tests: certificates from `acpd cert`, `wss://` clients that trust
//! exactly one certificate, bearer tokens, upgrades with arbitrary headers, and one-shot
//! `acpd` runs whose exit status is the point.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::process::{Child, Command};
use tokio_tungstenite::Connector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};

use super::DEFAULT_TIMEOUT;
use super::client::Client;
use super::conn::Conn;
use super::daemon::Daemon;

/// A pair written by `acpd cert`, and the fingerprint it printed.
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The plain-hex line `acpd cert` printed.
    pub fingerprint: String,
    /// The colon-separated line `acpd cert` printed.
    pub fingerprint_colons: String,
}

/// The output of a finished `acpd` run.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `acpd ARGS` to completion (10 s at most).
pub async fn acpd(args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_acpd"));
    cmd.args(args);
    run_to_end(cmd, args).await
}

/// Runs a prepared `acpd` command to completion (10 s at most); `args` name it in a timeout.
pub async fn run_to_end(mut cmd: Command, args: &[&str]) -> Run {
    let out = cmd.stdin(Stdio::null()).kill_on_drop(true).output();
    let out = tokio::time::timeout(DEFAULT_TIMEOUT, out)
        .await
        .unwrap_or_else(|_| panic!("acpd {args:?} did not finish within {DEFAULT_TIMEOUT:?}"))
        .expect("run acpd");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `acpd cert --out-dir DIR --force`: a fresh self-signed pair.
pub async fn make_cert(dir: &Path) -> Cert {
    let dir_s = dir.display().to_string();
    let run = acpd(&["cert", "--out-dir", &dir_s, "--force"]).await;
    assert_eq!(run.code, Some(0), "acpd cert failed: {}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "acpd cert prints two lines: {:?}",
        run.stdout
    );
    Cert {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        fingerprint_colons: lines[0].to_string(),
        fingerprint: lines[1].to_string(),
    }
}

impl Cert {
    /// `--tls-cert F --tls-key F` for `DaemonOptions::args`.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }
}

/// A client configuration that trusts exactly the certificate in `cert_pem` (as its own root).
pub fn trusting(cert_pem: &Path) -> Arc<rustls::ClientConfig> {
    let der = CertificateDer::from_pem_file(cert_pem).expect("read the certificate PEM");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(der)
        .expect("certificate usable as a trust anchor");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// `wss://ADDR/acp` of a daemon started with TLS.
pub fn wss_url(daemon: &Daemon) -> String {
    format!("wss://{}/acp", daemon.addr)
}

/// Opens a WebSocket with extra request headers; `tls` for `wss://` URLs. The error is the
/// handshake's own, so tests can read an HTTP refusal's status.
pub async fn connect(
    url: &str,
    headers: &[(&str, &str)],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
    let mut request = url.into_client_request()?;
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("header name");
        let value = HeaderValue::from_str(value).expect("header value");
        request.headers_mut().insert(name, value);
    }
    let connector = tls.map(Connector::Rustls);
    let connecting =
        tokio_tungstenite::connect_async_tls_with_config(request, None, false, connector);
    let (ws, response) = tokio::time::timeout(DEFAULT_TIMEOUT, connecting)
        .await
        .unwrap_or_else(|_| panic!("timed out connecting to {url}"))?;
    let mut client = Client::new(Conn::ws(ws));
    client.handshake = Some(response);
    Ok(client)
}

/// `connect` that must succeed, then `initialize`.
pub async fn client(
    url: &str,
    headers: &[(&str, &str)],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Client {
    let mut c = connect(url, headers, tls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    c.initialize().await;
    c
}

/// The HTTP status of an upgrade attempt (101 when it succeeded) and the refusal's body.
pub async fn upgrade_status(
    url: &str,
    headers: &[(&str, &str)],
    tls: Option<Arc<rustls::ClientConfig>>,
) -> (u16, String) {
    use tokio_tungstenite::tungstenite::Error;
    match connect(url, headers, tls).await {
        Ok(mut c) => {
            c.close().await;
            (101, String::new())
        }
        Err(Error::Http(resp)) => {
            let body = resp.body().as_deref().unwrap_or_default();
            (
                resp.status().as_u16(),
                String::from_utf8_lossy(body).into_owned(),
            )
        }
        Err(e) => panic!("upgrade to {url} failed without an HTTP status: {e}"),
    }
}

/// `Authorization: Bearer SECRET` as a header pair.
pub fn bearer(secret: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {secret}"))
}

/// Polls `cond` until it holds; panics with `what` after 10 s.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The token acpd writes for the local user on first start (the listener is bound a moment
/// before it is written, hence the wait).
pub async fn read_token(data_dir: &Path) -> String {
    let path = data_dir.join(acpd_wire::local::TOKEN_FILE);
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    eventually(&format!("{}", path.display()), || !read().trim().is_empty()).await;
    read().trim().to_string()
}

pub async fn local_token(daemon: &Daemon) -> String {
    read_token(&daemon.dir().join("data")).await
}

/// `acpd token create --name NAME` against the daemon's store (started with auth); returns
/// the secret.
pub async fn token_create(daemon: &Daemon, name: &str) -> String {
    // Two processes migrating one fresh SQLite file at once collide ("table meta already
    // exists"): wait for the daemon's first-start token, written after its migrations.
    local_token(daemon).await;
    let data = daemon.dir().join("data").display().to_string();
    let store = daemon.store_url();
    let run = acpd(&[
        "token",
        "create",
        "--name",
        name,
        "--data-dir",
        &data,
        "--store",
        &store,
    ])
    .await;
    assert_eq!(run.code, Some(0), "token create failed: {}", run.stderr);
    run.stdout.trim().to_string()
}

/// An `acpd serve` started by hand, for listen addresses the `Daemon` harness does not use.
pub struct RawDaemon {
    /// Held so the process lives as long as this (`kill_on_drop`).
    _child: Child,
    pub log: PathBuf,
    dir: tempfile::TempDir,
}

impl RawDaemon {
    /// Starts `acpd serve ARGS --data-dir TMP` and waits until its log names the address
    /// after each of `listeners` (`"acpd listening: "`, `"newline-delimited TCP listener: "`):
    /// listen on port 0 and read the port here, since a port picked before the daemon binds it
    /// can be taken by another test meanwhile. An unspecified IP comes back as loopback.
    pub async fn start(args: &[&str], listeners: &[&str]) -> (RawDaemon, Vec<SocketAddr>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("acpd.log");
        let file = std::fs::File::create(&log).expect("log file");
        let data = dir.path().join("data").display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_acpd"))
            .arg("serve")
            .args(args)
            .args(["--data-dir", &data])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn acpd");
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        let addrs = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let found: Option<Vec<SocketAddr>> = listeners
                .iter()
                .map(|before| crate::support::listening_addr(&text, before))
                .collect();
            if let Some(found) = found {
                break found;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("acpd exited with {status} before listening:\n{text}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "acpd did not log {listeners:?}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let loopback = |a: SocketAddr| match a.ip().is_unspecified() {
            true => SocketAddr::from(([127, 0, 0, 1], a.port())),
            false => a,
        };
        let daemon = RawDaemon {
            _child: child,
            log,
            dir,
        };
        (daemon, addrs.into_iter().map(loopback).collect())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: a plain syscall on a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

//! Helpers for the acp-shim tests: a real daemon process, the shim as a child on pipes, and a
//! fault-injecting TCP proxy between them. Self-contained on purpose (see tests/it/shim.rs).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(20);
/// Keepalive used by both sides in tests, so dead links are noticed in about a second.
pub const KEEPALIVE_MS: u64 = 300;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// An `acpd serve` child with the scripted agent as profile `s`.
pub struct Daemon {
    pub dir: Arc<tempfile::TempDir>,
    pub port: u16,
    child: Child,
}

impl Daemon {
    pub async fn start(auth: bool) -> Result<Daemon> {
        let dir = Arc::new(tempfile::tempdir()?);
        Daemon::start_in(dir, 0, auth).await
    }

    /// Starts (again) on the given data dir and port. Port 0 on a fresh data dir: the port the
    /// kernel gives, read from acpd's log (a port picked beforehand could be taken by another
    /// test before acpd binds it); a restart passes that port again.
    pub async fn start_in(dir: Arc<tempfile::TempDir>, port: u16, auth: bool) -> Result<Daemon> {
        Daemon::start_with(dir, port, auth, &[]).await
    }

    pub async fn start_with(
        dir: Arc<tempfile::TempDir>,
        port: u16,
        auth: bool,
        extra: &[&str],
    ) -> Result<Daemon> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("acpd.log"))?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_acpd"));
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--agent")
            .arg(format!("s={}", crate::support::scripted_agent_bin()))
            .arg("--keepalive-ms")
            .arg(KEEPALIVE_MS.to_string())
            .arg("--bootstrap-delay-ms")
            .arg("10")
            .env("ACPD_LOG", "info,acpd::transport=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if !auth {
            cmd.arg("--no-auth");
        }
        cmd.args(extra);
        let child = cmd.spawn().context("spawn acpd")?;
        let mut d = Daemon { dir, port, child };
        if port == 0 {
            d.port = d.bound_port().await?;
        }
        d.wait_ready().await?;
        Ok(d)
    }

    /// The port of the `acpd listening: ws://127.0.0.1:PORT/acp` line acpd logs once it is set up.
    async fn bound_port(&mut self) -> Result<u16> {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            let log = self.log();
            let port = log
                .rsplit_once("acpd listening: ws://127.0.0.1:")
                .and_then(|(_, rest)| rest.split_once('/'))
                .and_then(|(port, _)| port.parse().ok());
            if let Some(port) = port {
                return Ok(port);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("acpd exited with {status} before listening; log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("acpd did not listen; log:\n{}", self.log())
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            if self.healthy().await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("acpd did not start; log:\n{}", self.log())
    }

    /// `/healthz` answers only once auth and the store are set up (the port opens earlier).
    async fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        let req = b"GET /healthz HTTP/1.0\r\n\r\n";
        let mut resp = Vec::new();
        s.write_all(req).await.is_ok()
            && s.read_to_end(&mut resp).await.is_ok()
            && resp.starts_with(b"HTTP/1.0 200") | resp.starts_with(b"HTTP/1.1 200")
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/acp", self.port)
    }

    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("token")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("acpd.log")).unwrap_or_default()
    }

    /// Waits until the daemon's log says `needle`.
    pub async fn wait_log(&self, needle: &str) -> Result<()> {
        wait_file(&self.dir.path().join("acpd.log"), needle).await
    }

    /// SIGTERM and wait: the graceful drain. Returns the exit code.
    pub async fn terminate(mut self) -> Result<(i32, Arc<tempfile::TempDir>)> {
        let pid = self.child.id().context("acpd already gone")?;
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .context("acpd did not drain in time")??;
        Ok((status.code().unwrap_or(-1), self.dir.clone()))
    }

    /// SIGKILL: no drain, no close frames; sessions survive only in the store.
    pub async fn kill(mut self) -> Arc<tempfile::TempDir> {
        let _ = self.child.kill().await;
        self.dir.clone()
    }
}

/// The shim as the editor sees it: JSON lines on its stdin and stdout.
pub struct Shim {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    pub stderr_path: PathBuf,
    next_id: u64,
}

impl Shim {
    pub fn spawn(url: &str, extra: &[&str], dir: &Path) -> Result<Shim> {
        let stderr_path = dir.join(format!("shim-{}.log", free_port()));
        let err = std::fs::File::create(&stderr_path)?;
        let mut child = Command::new(crate::support::shim_bin())
            .args(extra)
            .arg(url)
            .env("ACP_SHIM_KEEPALIVE_MS", KEEPALIVE_MS.to_string())
            .env("ACPD_LOG", "debug")
            .env_remove("ACPD_TOKEN")
            .env("XDG_DATA_HOME", dir.join("no-such-dir"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .context("spawn acp-shim")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
        Ok(Shim {
            child,
            stdin,
            stdout,
            stderr_path,
            next_id: 0,
        })
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits until the shim's log says `needle`.
    pub async fn wait_stderr(&self, needle: &str) -> Result<()> {
        wait_file(&self.stderr_path, needle).await
    }

    pub async fn send(&mut self, msg: &Value) -> Result<()> {
        self.send_line(&msg.to_string()).await
    }

    pub async fn send_line(&mut self, line: &str) -> Result<()> {
        self.send_bytes(line.as_bytes()).await
    }

    /// One line of raw bytes (need not be UTF-8); the newline is added.
    pub async fn send_bytes(&mut self, line: &[u8]) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        stdin.write_all(line).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Sends a request; returns its id.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line, which must be one JSON object.
    pub async fn recv(&mut self) -> Result<Value> {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .context("timed out waiting for the shim's stdout")??
            .context("shim stdout closed")?;
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("stdout line is not JSON: {line:?}"))?;
        if !v.is_object() {
            bail!("stdout line is not a JSON object: {line}");
        }
        Ok(v)
    }

    /// The next message that is not a notification (session updates may come at any time).
    pub async fn next_answer(&mut self) -> Result<Value> {
        loop {
            let m = self.recv().await?;
            if m.get("method").is_none() {
                return Ok(m);
            }
        }
    }

    /// Reads until the response to `id`; returns it and everything before it.
    pub async fn until_response(&mut self, id: u64) -> Result<(Value, Vec<Value>)> {
        let mut before = Vec::new();
        loop {
            let m = self.recv().await?;
            if m.get("method").is_none() && m["id"] == json!(id) {
                return Ok((m, before));
            }
            before.push(m);
        }
    }

    /// initialize + session/new; returns the session id.
    pub async fn open_session(&mut self) -> Result<String> {
        let id = self
            .request(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "it"}}),
            )
            .await?;
        let (r, _) = self.until_response(id).await?;
        if r.get("result").is_none() {
            bail!("initialize failed: {r}");
        }
        let id = self
            .request("session/new", json!({"cwd": "/usr", "mcpServers": []}))
            .await?;
        let (r, _) = self.until_response(id).await?;
        r["result"]["sessionId"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("session/new failed: {r}"))
    }

    pub async fn wait_exit(&mut self) -> Result<i32> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .context("shim did not exit")??;
        status.code().context("shim killed by a signal")
    }
}

/// Waits (at most `WAIT`) until the log file at `path` contains `needle`. Logs are files
/// another process appends to: they are read again every 20 ms.
async fn wait_file(path: &Path, needle: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{} never said {needle:?}:\n{text}", path.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn prompt(sid: &str, text: &str) -> Value {
    json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]})
}

/// A TCP proxy that can cut (reset) or blackhole (freeze, no FIN) its connections.
#[derive(Clone)]
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
    stop: CancellationToken,
    /// Bytes forwarded from the daemon towards the shim, over all connections.
    down_bytes: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Default)]
struct ProxyState {
    /// Per live connection: (cut, freeze).
    conns: Vec<(CancellationToken, CancellationToken)>,
    /// New connections start frozen.
    blackholed: bool,
    cuts: u32,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let p = Proxy {
            addr: listener.local_addr()?,
            state: Arc::default(),
            stop: CancellationToken::new(),
            down_bytes: Arc::new(tokio::sync::watch::channel(0).0),
        };
        let q = p.clone();
        tokio::spawn(async move {
            loop {
                let (down, _) = tokio::select! {
                    _ = q.stop.cancelled() => return,
                    r = listener.accept() => match r { Ok(x) => x, Err(_) => return },
                };
                let (cut, freeze) = (q.stop.child_token(), CancellationToken::new());
                {
                    let mut st = q.state.lock().expect("proxy state");
                    st.conns.retain(|(c, _)| !c.is_cancelled());
                    if st.blackholed {
                        freeze.cancel();
                    }
                    st.conns.push((cut.clone(), freeze.clone()));
                }
                tokio::spawn(pipe(down, upstream, cut, freeze, q.down_bytes.clone()));
            }
        });
        Ok(p)
    }

    pub fn url(&self) -> String {
        format!("ws://{}/acp", self.addr)
    }

    /// Resets every current connection.
    pub fn cut(&self) {
        let mut st = self.state.lock().expect("proxy state");
        st.cuts += 1;
        for (c, _) in st.conns.drain(..) {
            c.cancel();
        }
    }

    /// Stops forwarding on every connection, current and new, without closing any.
    pub fn blackhole(&self) {
        let mut st = self.state.lock().expect("proxy state");
        st.blackholed = true;
        for (_, f) in &st.conns {
            f.cancel();
        }
    }

    /// Waits until `n` bytes in all have been forwarded from the daemon towards the shim.
    pub async fn wait_down_bytes(&self, n: u64) -> Result<()> {
        let mut rx = self.down_bytes.subscribe();
        tokio::time::timeout(WAIT, rx.wait_for(|b| *b >= n))
            .await
            .with_context(|| format!("{n} bytes never went through the proxy"))??;
        Ok(())
    }

    /// New connections forward again (frozen ones stay frozen until cut).
    pub fn heal(&self) {
        self.state.lock().expect("proxy state").blackholed = false;
    }
}

async fn pipe(
    down: TcpStream,
    upstream: SocketAddr,
    cut: CancellationToken,
    freeze: CancellationToken,
    down_bytes: Arc<tokio::sync::watch::Sender<u64>>,
) {
    let Ok(up) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (down.set_nodelay(true), up.set_nodelay(true));
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    let a = tokio::spawn(one_way(dr, uw, cut.clone(), freeze.clone(), None));
    let b = tokio::spawn(one_way(ur, dw, cut, freeze, Some(down_bytes)));
    // A reset, not a FIN: the shim must treat it as a broken network, not a goodbye.
    if let (Ok((dr, uw)), Ok((ur, dw))) = (a.await, b.await) {
        if let Ok(d) = dr.reunite(dw) {
            let _ = d.set_zero_linger();
        }
        if let Ok(u) = ur.reunite(uw) {
            let _ = u.set_zero_linger();
        }
    }
}

async fn one_way(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    cut: CancellationToken,
    freeze: CancellationToken,
    counted: Option<Arc<tokio::sync::watch::Sender<u64>>>,
) -> (OwnedReadHalf, OwnedWriteHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = cut.cancelled() => break,
            // Frozen: hold the socket open, read and write nothing until cut.
            _ = freeze.cancelled() => { cut.cancelled().await; break }
            r = r.read(&mut buf) => match r { Ok(0) | Err(_) => break, Ok(n) => n },
        };
        if freeze.is_cancelled() {
            cut.cancelled().await;
            break;
        }
        tokio::select! {
            _ = cut.cancelled() => break,
            r = w.write_all(&buf[..n]) => if r.is_err() { break },
        }
        if let Some(c) = &counted {
            c.send_modify(|b| *b += n as u64);
        }
    }
    // Either direction ending takes the whole connection down.
    cut.cancel();
    (r, w)
}

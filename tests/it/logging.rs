//! acpd's own log on stderr as an operator pipes it: a reader that goes away (`acpd serve
//! 2>&1 | head -3`) costs log lines, never the daemon (SIGTERM still drains, exit 0), and
//! a piped log carries no terminal colour codes.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

use crate::support::{Client, acpd_bin, listening_addr, scripted_agent_bin};

/// `acpd serve` on port 0 with SQLite in `dir`, its stderr a pipe the test holds, no model
/// key in its environment, and `extra` arguments (the scripted agent is profile `scripted`).
pub(crate) fn spawn_piped(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    std::fs::create_dir_all(dir.join("data")).expect("data dir");
    let agent = scripted_agent_bin();
    let mut cmd = Command::new(acpd_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!("sqlite://{}", dir.join("acpd.db").display()))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--agent", &format!("scripted={agent}")])
        .args(extra)
        .env("RUST_LOG", "debug")
        .envs(env.iter().copied());
    for key in [
        "ACPD_LOG",
        "ACPD_MODEL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
    ] {
        if !env.iter().any(|(k, _)| *k == key) {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn().expect("spawn acpd")
}

/// Reads `stderr` until the listening line; returns the address and what was read.
pub(crate) async fn until_listening(
    stderr: &mut BufReader<ChildStderr>,
) -> (std::net::SocketAddr, String) {
    let mut seen = String::new();
    let read = async {
        loop {
            let mut line = String::new();
            let n = stderr.read_line(&mut line).await.expect("read acpd stderr");
            assert!(n > 0, "acpd closed stderr before listening:\n{seen}");
            seen.push_str(&line);
            if let Some(addr) = listening_addr(&seen, "acpd listening: ") {
                return addr;
            }
        }
    };
    let addr = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("acpd did not log its address within 10 s");
    (addr, seen)
}

/// SIGTERM, then the exit status within the drain deadline (10 s).
pub(crate) async fn sigterm(child: &mut Child) -> ExitStatus {
    let pid = child.id().expect("acpd is running") as i32;
    // SAFETY: plain syscall on a pid we own and have not reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("acpd did not exit within 10 s of SIGTERM: a log write killed the drain")
        .expect("wait for acpd")
}

/// No token, the scripted agent by default.
const SCRIPTED: &[&str] = &["--no-auth", "--default-agent", "scripted"];

/// The value of an unlabelled series in a /metrics text.
pub(crate) fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
}

#[tokio::test]
async fn a_closed_log_reader_costs_log_lines_not_the_daemon() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The sessions' cwd: beside the data directory, never around it.
    let work = tempfile::tempdir().expect("temp dir");
    let mut child = spawn_piped(dir.path(), SCRIPTED, &[]);
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (addr, _) = until_listening(&mut stderr).await;
    // The reader goes away, as `| head -3` does: every later write gets EPIPE.
    drop(stderr);

    let url = format!("ws://{addr}/acp");
    for _ in 0..3 {
        let mut client = Client::connect_ws(&url).await.expect("connect to acpd");
        client.initialize().await;
        let sid = client.new_session(work.path()).await;
        let (_, result) = client.prompt(&sid, "echo hi").await;
        assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
        client.close().await;
    }
    let (_, metrics) = crate::operations::http_get(addr, "/metrics").await;
    let dropped = metric(&metrics, "acpd_log_writes_dropped_total");
    assert!(dropped >= 1.0, "lost log lines are counted:\n{metrics}");

    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
}

#[tokio::test]
async fn a_piped_log_has_no_colour_codes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = spawn_piped(dir.path(), SCRIPTED, &[]);
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (_, mut seen) = until_listening(&mut stderr).await;
    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
    let mut rest = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stderr.read_to_string(&mut rest)).await;
    seen.push_str(&rest);
    assert!(
        !seen.contains('\u{1b}'),
        "escape sequences in a piped log: {:?}…",
        &seen[..seen.len().min(400)]
    );
}

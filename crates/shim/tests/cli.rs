//! acp-shim's command-line contract, without a daemon: usage errors and an unreachable daemon
//! end with their exit codes and one clear stderr line, and nothing on stdout. (Building
//! this test is also what makes `cargo test` build the binary that the daemon's suite runs.)

use std::process::{Command, Stdio};

/// Runs acp-shim to its end, killing it (and failing) after 20 s.
fn shim(args: &[&str]) -> std::process::Output {
    let child = Command::new(env!("CARGO_BIN_EXE_acp-shim"))
        .args(args)
        .env_remove("ACPD_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run acp-shim");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(out) => out.expect("acp-shim output"),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("acp-shim did not exit within 20 s");
        }
    }
}

#[test]
fn a_bad_url_is_a_usage_error() {
    let out = shim(&["not a url"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty(), "stdout is for protocol bytes only");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.trim().is_empty(), "a reason on stderr");
}

#[test]
fn an_unreachable_daemon_exits_69() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{port}/acp");
    let out = shim(&[&url]);
    assert!(out.stdout.is_empty(), "stdout is for protocol bytes only");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "stderr: {stderr}");
}

//! The scripted agent alone: how fast it streams `session/update`s with nothing behind it.
//!
//! A tiny driver (std only, no async): spawns the agent, opens a session, prompts
//! `stream N SIZE` and reads the agent's stdout in big blocks, counting lines until the
//! prompt's answer, which is the last of N + 1 lines. Prints updates/s and MB/s of the lines.
//!
//! ```sh
//! cargo build --release -p acpd-scripted-agent --bin acpd-scripted-agent --example stream_alone
//! target/release/examples/stream_alone 2000000 64
//! ```
//!
//! The agent is `acpd-scripted-agent` next to the example's directory (`target/release/`),
//! or the path in `ACPD_SCRIPTED_AGENT`.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(2_000_000, |a| a.parse().expect("N"));
    let size: usize = args.next().map_or(64, |a| a.parse().expect("SIZE"));
    let agent = std::env::var_os("ACPD_SCRIPTED_AGENT").map_or_else(
        || {
            let exe = std::env::current_exe().expect("current exe");
            let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
            dir.join("acpd-scripted-agent")
        },
        Into::into,
    );
    let mut child = Command::new(&agent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", agent.display()));
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::with_capacity(1 << 20, child.stdout.take().expect("stdout"));

    let mut line = String::new();
    let ask = |stdin: &mut std::process::ChildStdin, msg: &str| {
        writeln!(stdin, "{msg}").expect("write to the agent");
        stdin.flush().expect("flush");
    };
    ask(
        &mut stdin,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
    );
    stdout.read_line(&mut line).expect("initialize answer");
    ask(
        &mut stdin,
        r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
    );
    // The session's available_commands_update comes first, then the answer.
    let sid = loop {
        line.clear();
        stdout.read_line(&mut line).expect("session/new answer");
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
        if v["id"] == 2 {
            break v["result"]["sessionId"]
                .as_str()
                .expect("sessionId")
                .to_owned();
        }
    };

    let prompt = serde_json::json!({
        "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": { "sessionId": sid, "prompt": [{ "type": "text", "text": format!("stream {n} {size}") }] },
    });
    let started = Instant::now();
    ask(&mut stdin, &prompt.to_string());
    let mut buf = vec![0u8; 1 << 20];
    let (mut lines, mut bytes) = (0u64, 0u64);
    let mut tail = Vec::new();
    while lines < n + 1 {
        let got = stdout.read(&mut buf).expect("read the agent's stdout");
        assert!(got > 0, "the agent closed its stdout after {lines} lines");
        lines += buf[..got].iter().filter(|b| **b == b'\n').count() as u64;
        bytes += got as u64;
        tail.clear();
        tail.extend_from_slice(&buf[got.saturating_sub(200)..got]);
    }
    let elapsed = started.elapsed();
    let last = String::from_utf8_lossy(&tail);
    assert!(last.contains("end_turn"), "the turn ended: {last}");
    drop(stdin);
    let _ = child.wait();
    let secs = elapsed.as_secs_f64();
    println!(
        "{n} updates of {size} B in {:.3} s: {:.0} updates/s, {:.1} MB/s of lines",
        secs,
        n as f64 / secs,
        bytes as f64 / secs / 1e6
    );
}

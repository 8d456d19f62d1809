//! The scripted agent on its own, over real pipes: it speaks ACP v1 and streams what a
//! script asks for. (Building this test is also what makes `cargo test` build the binary
//! that the daemon's suite and the benchmark host.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

#[test]
fn initializes_opens_a_session_and_streams_a_script() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_acpd-scripted-agent"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the scripted agent");
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx
                .send(serde_json::from_str(&line).expect("a JSON line"))
                .is_err()
            {
                break;
            }
        }
    });
    let mut send = |v: Value| writeln!(&mut stdin, "{v}").expect("write to the agent");
    let next = || {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the agent answers")
    };
    // The answer to request `id`, past any notifications before it.
    let answer = |id: u64| loop {
        let m = next();
        if m["id"] == id {
            break m;
        }
        assert_eq!(
            m["method"], "session/update",
            "only updates come unasked: {m}"
        );
    };

    send(
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}),
    );
    let init = answer(1);
    assert_eq!(init["result"]["protocolVersion"], 1);

    send(
        json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}),
    );
    let new = answer(2);
    let sid = new["result"]["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();

    // Quiet: the answer is the next message, with nothing before it.
    send(
        json!({"jsonrpc":"2.0","id":4,"method":"session/new","params":{"cwd":"/","mcpServers":[],
        "_meta":{"scripted":{"quiet":true}}}}),
    );
    let quiet = next();
    assert_eq!(
        quiet["id"], 4,
        "an update came before the quiet answer: {quiet}"
    );
    assert!(quiet["result"]["sessionId"].is_string(), "{quiet}");

    send(
        json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{
        "sessionId": sid, "prompt": [{"type":"text","text":"stream 500 16"}]}}),
    );
    let mut updates = 0;
    let done = loop {
        let m = next();
        if m["method"] == "session/update" {
            assert_eq!(m["params"]["sessionId"], sid.as_str());
            updates += 1;
        } else {
            break m;
        }
    };
    assert_eq!(updates, 500);
    assert_eq!(done["id"], 3);
    assert_eq!(done["result"]["stopReason"], "end_turn");

    drop(stdin);
    assert!(child.wait().expect("the agent exits").success());
}

#[test]
fn an_unknown_flag_exits_64() {
    let out = Command::new(env!("CARGO_BIN_EXE_acpd-scripted-agent"))
        .arg("--frobnicate")
        .stdin(Stdio::null())
        .output()
        .expect("run the scripted agent");
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty(), "stdout is for protocol bytes only");
}

//! acp-shim's stdin: lines it cannot relay (overlong, not UTF-8, not JSON, JSON that is not an
//! object) are answered by the shim itself with a JSON-RPC error, the request's id when it can
//! be found, and the shim goes on. Real shim, real daemon (`shim_support`).

use anyhow::Result;
use serde_json::{Value, json};

use crate::shim_support::{Daemon, Shim, prompt};

/// The shim's line limit in these tests (a hidden flag; the default is 256 MiB).
const MAX_LINE: usize = 64 * 1024;

fn error_of(m: &Value) -> (Value, Value) {
    (m["id"].clone(), m["error"]["code"].clone())
}

#[tokio::test]
async fn bad_editor_lines_are_answered_locally_and_the_shim_goes_on() -> Result<()> {
    let d = Daemon::start(false).await?;
    let max = MAX_LINE.to_string();
    let mut shim = Shim::spawn(&d.url(), &["--max-line-bytes", &max], d.dir.path())?;
    let sid = shim.open_session().await?;
    let r = checks(&mut shim, &sid).await;
    if r.is_err() {
        eprintln!("shim stderr:\n{}", shim.stderr());
    }
    r
}

async fn checks(shim: &mut Shim, sid: &str) -> Result<()> {
    let sid = sid.to_owned();

    // An overlong request: answered -32600 under its own id, never sent on.
    let text = "x".repeat(MAX_LINE * 3);
    let big = json!({"jsonrpc": "2.0", "id": 41, "method": "session/prompt", "params": prompt(&sid, &text)});
    shim.send(&big).await?;
    let m = shim.next_answer().await?;
    assert_eq!(error_of(&m), (json!(41), json!(-32600)), "{m}");
    let msg = m["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("acp-shim"),
        "answered by the daemon, not the shim: {m}"
    );
    // Two in a row, the second with a string id and no newline until far past the limit.
    let big = json!({"id": "big-2", "jsonrpc": "2.0", "method": "session/prompt", "params": prompt(&sid, &text)});
    shim.send(&big).await?;
    let m = shim.next_answer().await?;
    assert_eq!(error_of(&m), (json!("big-2"), json!(-32600)), "{m}");

    // Not UTF-8: -32700, id null (the bytes are not read any further).
    shim.send_bytes(b"{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"x\",\"params\":\"\xff\xfe\"}")
        .await?;
    let m = shim.next_answer().await?;
    assert_eq!(error_of(&m), (json!(null), json!(-32700)), "{m}");

    // Not JSON, but its id comes before the mistake: -32700 under that id.
    shim.send_line(r#"{"jsonrpc":"2.0","id":43,"method":"session/list",}"#)
        .await?;
    let m = shim.next_answer().await?;
    assert_eq!(error_of(&m), (json!(43), json!(-32700)), "{m}");
    // No id to be found: null.
    shim.send_line("{not json").await?;
    let m = shim.next_answer().await?;
    assert_eq!(error_of(&m), (json!(null), json!(-32700)), "{m}");

    // The shim and its link lived through all of it.
    let id = shim
        .request("session/prompt", prompt(&sid, "echo still relaying"))
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let texts: Vec<&str> = msgs
        .iter()
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(texts, ["still relaying"], "{msgs:?}");
    shim.close_stdin();
    assert_eq!(shim.wait_exit().await?, 0, "{}", shim.stderr());
    Ok(())
}

/// JSON that is not a JSON-RPC object (a scalar, `null`, a batch) is answered -32600 with
/// `id: null` by the shim and never framed: framed, acpd closed the link and the shim exited.
#[tokio::test]
async fn json_lines_that_are_not_objects_are_answered_locally_on_the_same_link() -> Result<()> {
    let d = Daemon::start(false).await?;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let lines = [
        "null",
        "42",
        r#""x""#,
        "true",
        " [] ",
        "[1]",
        r#"[{"jsonrpc":"2.0","id":70,"method":"session/list","params":{}}]"#,
    ];
    for line in lines {
        shim.send_line(line).await?;
        let m = shim.next_answer().await?;
        assert_eq!(error_of(&m), (json!(null), json!(-32600)), "{line}: {m}");
        let msg = m["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("acp-shim"),
            "{line}: not the shim's answer: {m}"
        );
    }
    // Objects that are not JSON-RPC are the daemon's to answer, on the same link.
    for (line, id) in [
        ("{}", json!(null)),
        (r#"{"jsonrpc":"2.0","id":71,"method":7}"#, json!(71)),
    ] {
        shim.send_line(line).await?;
        let m = shim.next_answer().await?;
        assert_eq!(error_of(&m), (id, json!(-32600)), "{line}: {m}");
    }
    let id = shim
        .request("session/prompt", prompt(&sid, "echo still linked"))
        .await?;
    let (done, _) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let log = shim.stderr();
    assert!(
        !log.contains("reconnect"),
        "the shim's link was lost: {log}"
    );
    shim.close_stdin();
    assert_eq!(shim.wait_exit().await?, 0, "{}", shim.stderr());
    Ok(())
}

#[tokio::test]
async fn a_line_over_the_daemons_limit_is_answered_not_resent_forever() -> Result<()> {
    // The daemon takes 1 MiB messages and closes a socket whose frame passes 4 MiB; the
    // shim's own limit (256 MiB) would let a 6 MiB line through.
    let d = Daemon::start_with(
        std::sync::Arc::new(tempfile::tempdir()?),
        0,
        false,
        &["--max-message-bytes", "1048576"],
    )
    .await?;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    for (id, size) in [(61, 6 << 20), (62, (1 << 20) + 100)] {
        let text = "y".repeat(size);
        let big = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": prompt(&sid, &text)});
        shim.send(&big).await?;
        let m = shim.next_answer().await?;
        assert_eq!(error_of(&m), (json!(id), json!(-32600)), "{m}");
        let msg = m["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("acpd's limit"), "{m}");
    }
    // The link was never lost, and the shim goes on.
    let id = shim
        .request("session/prompt", prompt(&sid, "echo after the big one"))
        .await?;
    let (done, _) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert!(
        !shim.stderr().contains("reconnect"),
        "the shim reconnected: {}",
        shim.stderr()
    );
    shim.close_stdin();
    assert_eq!(shim.wait_exit().await?, 0, "{}", shim.stderr());
    Ok(())
}

/// One-shot scripted use (health checks, CI probes): `printf '<initialize>\n' | acp-shim URL`
/// prints the answer, then exits 0 — the answers the editor is owed at stdin EOF are delivered
/// before the shim goes. A `session/new` behind it (the agent starts for it) is answered too.
#[tokio::test]
async fn printf_into_the_shim_prints_the_answers_then_exits_0() -> Result<()> {
    let d = Daemon::start(false).await?;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}});
    let new = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/usr", "mcpServers": []}});
    let script = format!(
        "printf '%s\\n%s\\n' '{init}' '{new}' | '{}' '{}'",
        crate::support::shim_bin(),
        d.url()
    );
    let run = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("XDG_DATA_HOME", d.dir.path().join("no-such-dir"))
        .env_remove("ACPD_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), run).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let answers: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let by_id = |id: i64| answers.iter().find(|m| m["id"] == id).cloned();
    let first = by_id(1).unwrap_or_else(|| panic!("no initialize answer: {stdout}\n{stderr}"));
    assert_eq!(first["result"]["protocolVersion"], 1, "{first}");
    let second = by_id(2).unwrap_or_else(|| panic!("no session/new answer: {stdout}\n{stderr}"));
    assert!(second["result"]["sessionId"].is_string(), "{second}");
    Ok(())
}

//! The editor's stdio MCP servers run where acp-shim runs and reach the hosted agent through
//! acpd's loopback tunnel: the agent lists and calls the tool, a failing server is a clear
//! error, closing the session stops the server, and `--mcp drop|remote` keep it off the tunnel.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::shim_support::{Daemon, Shim, WAIT, prompt};

async fn init(shim: &mut Shim) -> Result<()> {
    let id = shim
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}, "clientInfo": {"name": "it"}}),
        )
        .await?;
    shim.until_response(id).await?;
    Ok(())
}

async fn new_session(shim: &mut Shim, cwd: &Path, servers: Value) -> Result<String> {
    let id = shim
        .request("session/new", json!({"cwd": cwd, "mcpServers": servers}))
        .await?;
    let (r, _) = shim.until_response(id).await?;
    r["result"]["sessionId"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("session/new failed: {r}"))
}

/// The agent's chunks of one turn.
async fn say(shim: &mut Shim, sid: &str, script: &str) -> Result<Vec<String>> {
    let id = shim.request("session/prompt", prompt(sid, script)).await?;
    let (r, before) = shim.until_response(id).await?;
    if r["result"]["stopReason"] != "end_turn" {
        bail!("turn failed: {r}");
    }
    Ok(before
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .map(str::to_owned)
        .collect())
}

fn server(name: &str, args: &[&str]) -> Value {
    json!({"name": name, "command": crate::support::scripted_mcp_bin(), "args": args, "env": []})
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

async fn wait_pid(file: &Path) -> Result<i32> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return Ok(pid);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{} never written", file.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn editor_mcp_server_runs_by_the_shim_and_serves_the_hosted_agent() -> Result<()> {
    let d = Daemon::start(false).await?;
    let work = tempfile::tempdir()?;
    let pid_file = d.dir.path().join("mcp.pid");
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut shim).await?;
    let pf = pid_file.to_str().context("utf-8")?;
    let servers = json!([server("tools", &["--pid-file", pf])]);
    let sid = new_session(&mut shim, work.path(), servers).await?;
    // Started on first use, not before.
    assert!(
        !pid_file.exists(),
        "the MCP server started before anyone used it"
    );
    let said = say(&mut shim, &sid, "mcp tools echo hello there").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=hello there".to_owned()),
        "{said:?}\n{}",
        shim.stderr()
    );
    let pid = wait_pid(&pid_file).await?;
    assert!(alive(pid));
    // The same process serves the next call.
    let said = say(&mut shim, &sid, "mcp tools echo again").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=again".to_owned()),
        "{said:?}"
    );
    // Closing the session stops it.
    let id = shim
        .request("session/close", json!({"sessionId": sid}))
        .await?;
    shim.until_response(id).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    while alive(pid) {
        if tokio::time::Instant::now() > deadline {
            bail!("the MCP server {pid} outlived its session");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn editor_mcp_server_that_fails_is_a_clear_error() -> Result<()> {
    let d = Daemon::start(false).await?;
    let work = tempfile::tempdir()?;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut shim).await?;
    let missing =
        json!({"name": "gone", "command": "/nonexistent/mcp-server", "args": [], "env": []});
    let servers = json!([missing, server("dies", &["--fail"])]);
    let sid = new_session(&mut shim, work.path(), servers).await?;
    let said = say(&mut shim, &sid, "mcp gone echo x\nmcp dies echo y").await?;
    assert!(
        said[0].starts_with("mcp error: -32603 MCP server `gone` could not start"),
        "{said:?}"
    );
    assert!(
        said[1].starts_with("mcp error: -32603 MCP server `dies`"),
        "{said:?}"
    );
    Ok(())
}

#[tokio::test]
async fn editor_mcp_policy_drop_and_remote_keep_servers_off_the_tunnel() -> Result<()> {
    let d = Daemon::start(false).await?;
    let work = tempfile::tempdir()?;
    let config = d.dir.path().join("shim.toml");
    std::fs::write(&config, "mcp = \"drop\"\n")?;
    let config = config.to_str().context("utf-8")?;
    // drop from the config file, remote by the flag (acpd's mcp_stdio policy then drops it
    // for the hosted agent: not in mcp_stdio_allow).
    for (args, seen) in [
        (["--config", config], "mcp error: no http server tools"),
        (["--mcp", "remote"], "mcp error: no http server tools"),
    ] {
        let mut shim = Shim::spawn(&d.url(), &args, d.dir.path())?;
        init(&mut shim).await?;
        let sid = new_session(&mut shim, work.path(), json!([server("tools", &[])])).await?;
        let said = say(&mut shim, &sid, "mcp tools echo x").await?;
        assert_eq!(said, [seen], "{args:?}");
    }
    // Only the remote one reached acpd as a stdio server (and was refused there).
    d.wait_log("stdio MCP server dropped").await?;
    assert_eq!(d.log().matches("stdio MCP server dropped").count(), 1);
    Ok(())
}

#[tokio::test]
async fn editor_mcp_call_survives_a_link_cut() -> Result<()> {
    let d = Daemon::start(false).await?;
    let proxy = crate::shim_support::Proxy::start(([127, 0, 0, 1], d.port).into()).await?;
    let work = tempfile::tempdir()?;
    let pid_file = d.dir.path().join("slow.pid");
    let mut shim = Shim::spawn(&proxy.url(), &[], d.dir.path())?;
    init(&mut shim).await?;
    let pf = pid_file.to_str().context("utf-8")?;
    let servers = json!([server("slow", &["--pid-file", pf, "--slow-ms", "1500"])]);
    let sid = new_session(&mut shim, work.path(), servers).await?;
    let id = shim
        .request(
            "session/prompt",
            prompt(&sid, "mcp slow echo through the cut"),
        )
        .await?;
    wait_pid(&pid_file).await?;
    // The tool call is running on the editor's machine: the link goes down under it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.cut();
    shim.wait_stderr("resumed=true").await?;
    let (r, before) = shim.until_response(id).await?;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let said: Vec<&str> = before
        .iter()
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert!(
        said.contains(&"mcp: tools=echo result=through the cut"),
        "{said:?}\n{}",
        shim.stderr()
    );
    Ok(())
}

#[tokio::test]
async fn editor_mcp_server_serves_the_builtin_agent() -> Result<()> {
    use crate::builtin_support::model::{text, tool};
    use crate::builtin_support::{Acpd, ModelServer, builtin_config};
    let model = ModelServer::start().await;
    let acpd = Acpd::start(&builtin_config(model.addr, "")).await;
    let url = format!("ws://{}/acp", acpd.addr);
    let mut shim = Shim::spawn(&url, &[], acpd.dir())?;
    init(&mut shim).await?;
    let sid = new_session(&mut shim, &acpd.work(), json!([server("tools", &[])])).await?;
    model.push_stream(vec![tool(
        "mcp__tools__echo",
        json!({ "text": "from the laptop" }),
    )]);
    model.push_stream(vec![text("done")]);
    let id = shim
        .request("session/prompt", prompt(&sid, "echo it"))
        .await?;
    loop {
        let m = shim.recv().await?;
        if m["method"] == "session/request_permission" {
            let answer = json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}});
            shim.send(&json!({"jsonrpc": "2.0", "id": m["id"], "result": answer}))
                .await?;
        } else if m.get("method").is_none() && m["id"] == json!(id) {
            assert_eq!(m["result"]["stopReason"], "end_turn", "{m}");
            break;
        }
    }
    let reqs = model.wait_requests(2).await;
    assert!(
        reqs[0]
            .tool_names()
            .contains(&"mcp__tools__echo".to_owned()),
        "{:?}",
        reqs[0].tool_names()
    );
    assert!(
        reqs[1].text().contains("from the laptop"),
        "{}\n{}",
        reqs[1].text(),
        acpd.log()
    );
    Ok(())
}

#[tokio::test]
async fn editor_mcp_servers_follow_a_session_loaded_by_another_shim() -> Result<()> {
    let d = Daemon::start(false).await?;
    let work = tempfile::tempdir()?;
    let mut first = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut first).await?;
    let servers = json!([server("tools", &[])]);
    let sid = new_session(&mut first, work.path(), servers.clone()).await?;
    let said = say(&mut first, &sid, "mcp tools echo one").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=one".to_owned()),
        "{said:?}"
    );
    first.close_stdin();
    assert_eq!(first.wait_exit().await?, 0);
    // The editor comes back with another shim: the load names the servers again.
    let mut second = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut second).await?;
    let id = second
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": work.path(), "mcpServers": servers}),
        )
        .await?;
    let (r, _) = second.until_response(id).await?;
    if r.get("result").is_none() {
        bail!("load failed: {r}");
    }
    let said = say(&mut second, &sid, "mcp tools echo two").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=two".to_owned()),
        "{said:?}"
    );
    Ok(())
}

/// A daemon restart (killed, or drained by SIGTERM): the shim re-attaches and claims the
/// session's tunnelled servers, the restored agent gets this daemon's loopback URLs for them,
/// and the same server process on the editor's machine answers.
async fn editor_mcp_server_survives_a_daemon_restart(graceful: bool) -> Result<()> {
    let d = Daemon::start(false).await?;
    let port = d.port;
    let work = tempfile::tempdir()?;
    let pid_file = d.dir.path().join("mcp.pid");
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut shim).await?;
    let pf = pid_file.to_str().context("utf-8")?;
    let servers = json!([server("tools", &["--pid-file", pf])]);
    let sid = new_session(&mut shim, work.path(), servers).await?;
    let said = say(&mut shim, &sid, "mcp tools echo before").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=before".to_owned()),
        "{said:?}"
    );
    let pid = wait_pid(&pid_file).await?;
    let dir = if graceful {
        d.terminate().await?.1
    } else {
        d.kill().await
    };
    let d2 = Daemon::start_in(dir, port, false).await?;
    shim.wait_stderr("re-attached").await?;
    let said = say(&mut shim, &sid, "mcp tools echo after").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=after".to_owned()),
        "{said:?}\n{}\n-----\n{}",
        shim.stderr(),
        d2.log()
    );
    // The server kept running on the editor's machine through the restart.
    assert!(alive(pid));
    assert_eq!(wait_pid(&pid_file).await?, pid);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_mcp_server_survives_a_killed_daemon() -> Result<()> {
    editor_mcp_server_survives_a_daemon_restart(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_mcp_server_survives_a_drained_daemon() -> Result<()> {
    editor_mcp_server_survives_a_daemon_restart(true).await
}

/// A shared session: the shim that named the servers serves them; another controller that
/// only attaches does not take them over, before or after a daemon restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editor_mcp_servers_stay_with_the_shim_that_carried_them() -> Result<()> {
    let d = Daemon::start(false).await?;
    let port = d.port;
    let work = tempfile::tempdir()?;
    let pid_file = d.dir.path().join("mcp.pid");
    let mut first = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut first).await?;
    let pf = pid_file.to_str().context("utf-8")?;
    let sid = new_session(
        &mut first,
        work.path(),
        json!([server("tools", &["--pid-file", pf])]),
    )
    .await?;
    let mut second = Shim::spawn(&d.url(), &[], d.dir.path())?;
    init(&mut second).await?;
    let id = second
        .request("_acpd/session/attach", json!({"sessionId": sid}))
        .await?;
    let (r, _) = second.until_response(id).await?;
    assert!(r.get("result").is_some(), "{r}");
    let said = say(&mut second, &sid, "mcp tools echo shared").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=shared".to_owned()),
        "{said:?}"
    );
    let pid = wait_pid(&pid_file).await?;
    let d2 = Daemon::start_in(d.kill().await, port, false).await?;
    first.wait_stderr("re-attached").await?;
    second.wait_stderr("re-attached").await?;
    let said = say(&mut second, &sid, "mcp tools echo again").await?;
    assert!(
        said.contains(&"mcp: tools=echo result=again".to_owned()),
        "{said:?}\n{}",
        d2.log()
    );
    assert_eq!(wait_pid(&pid_file).await?, pid);
    assert!(alive(pid));
    Ok(())
}

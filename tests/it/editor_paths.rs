//! acp-shim's path mapping end to end: an editor whose tree is at `/Users/ed/...` in front of
//! the shim, a daemon and a hosted (scripted) agent that see the box's paths. Every message
//! kind that carries a path is checked in the direction it travels.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::shim_support::{Daemon, Shim};

const LOCAL_APP: &str = "/Users/ed/src/app";
const LOCAL_LIB: &str = "/Users/ed/src/lib";

struct Setup {
    _daemon: Daemon,
    _tree: tempfile::TempDir,
    shim: Shim,
    app: String,
    lib: String,
}

/// A daemon, a box tree (`<data>/box/{app,lib}`) and a shim mapping the editor's tree onto it:
/// app by `--map`, lib by the `--config` file.
async fn setup() -> Result<Setup> {
    let d = Daemon::start(false).await?;
    // Outside the daemon's data directory, which no session may reach.
    let tree = tempfile::tempdir()?;
    let root = tree.path().join("box");
    let (app, lib) = (root.join("app"), root.join("lib"));
    std::fs::create_dir_all(app.join("src"))?;
    std::fs::create_dir_all(&lib)?;
    let s = |p: &Path| p.to_str().map(str::to_owned).context("utf-8 path");
    let (app, lib) = (s(&app)?, s(&lib)?);
    let config = d.dir.path().join("shim.toml");
    std::fs::write(
        &config,
        format!("map = [{:?}]\n", format!("{LOCAL_LIB}={lib}")),
    )?;
    let map = format!("{LOCAL_APP}={app}");
    let cfg = s(&config)?;
    let shim = Shim::spawn(&d.url(), &["--map", &map, "--config", &cfg], d.dir.path())?;
    Ok(Setup {
        _daemon: d,
        _tree: tree,
        shim,
        app,
        lib,
    })
}

async fn open(shim: &mut Shim) -> Result<String> {
    let caps = json!({"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true});
    let id = shim
        .request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": caps, "clientInfo": {"name": "it"}}),
        )
        .await?;
    if let Err(e) = shim.until_response(id).await {
        bail!("{e}: {}", shim.stderr());
    }
    let id = shim
        .request(
            "session/new",
            json!({"cwd": LOCAL_APP, "additionalDirectories": [LOCAL_LIB], "mcpServers": []}),
        )
        .await?;
    let (r, _) = shim.until_response(id).await?;
    r["result"]["sessionId"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("session/new failed: {r}"))
}

/// Runs one prompt, answering the agent's requests as an editor would; returns the updates
/// and the requests (method, params) the editor was sent.
async fn turn(shim: &mut Shim, params: Value) -> Result<(Vec<Value>, Vec<(String, Value)>)> {
    let id = shim.request("session/prompt", params).await?;
    let (mut updates, mut asked) = (vec![], vec![]);
    loop {
        let m = shim.recv().await?;
        match (m["method"].as_str(), m.get("id")) {
            (Some("session/update"), None) => updates.push(m["params"]["update"].clone()),
            (Some(method), Some(rid)) => {
                let result = match method {
                    "fs/read_text_file" => json!({"content": "text"}),
                    "fs/write_text_file" | "terminal/release" => json!({}),
                    "terminal/create" => json!({"terminalId": "t1"}),
                    "terminal/wait_for_exit" => json!({"exitCode": 0}),
                    "terminal/output" => json!({"output": "hi", "truncated": false}),
                    "session/request_permission" => {
                        json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}})
                    }
                    other => bail!("unexpected request {other}: {m}"),
                };
                asked.push((method.to_owned(), m["params"].clone()));
                shim.send(&json!({"jsonrpc": "2.0", "id": rid, "result": result}))
                    .await?;
            }
            (None, Some(rid)) if *rid == json!(id) => {
                if m["result"]["stopReason"] != "end_turn" {
                    bail!("turn failed: {m}");
                }
                return Ok((updates, asked));
            }
            _ => {}
        }
    }
}

fn texts(updates: &[Value]) -> Vec<&str> {
    updates
        .iter()
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

fn params_of<'a>(asked: &'a [(String, Value)], method: &str) -> Vec<&'a Value> {
    asked
        .iter()
        .filter(|(m, _)| m == method)
        .map(|(_, p)| p)
        .collect()
}

#[tokio::test]
async fn path_mapping_rewrites_what_the_editor_sends() -> Result<()> {
    let Setup {
        _daemon,
        _tree,
        mut shim,
        app,
        lib,
    } = setup().await?;
    let sid = open(&mut shim).await?;
    let prompt = json!({"sessionId": sid, "prompt": [
        {"type": "text", "text": "where\nlinks"},
        {"type": "resource_link", "name": "b.rs", "uri": format!("file://{LOCAL_APP}/src/b%20c.rs")},
        {"type": "resource", "resource": {"uri": format!("file://{LOCAL_LIB}/l.rs"), "text": "x"}},
        {"type": "resource_link", "name": "o", "uri": "file:///Users/ed/src/application/o.rs"},
    ]});
    let (updates, _) = turn(&mut shim, prompt).await?;
    let said = texts(&updates);
    // What the agent says is prose (never rewritten): the box's paths, as it saw them.
    assert!(
        said.contains(&format!("cwd: {app} dirs: [{lib:?}]").as_str()),
        "{said:?}"
    );
    let links = format!(
        "links: file://{app}/src/b%20c.rs file://{lib}/l.rs file:///Users/ed/src/application/o.rs"
    );
    assert!(said.contains(&links.as_str()), "{said:?}");
    Ok(())
}

#[tokio::test]
async fn path_mapping_rewrites_what_the_agent_sends() -> Result<()> {
    let Setup {
        _daemon,
        _tree,
        mut shim,
        app,
        ..
    } = setup().await?;
    let sid = open(&mut shim).await?;
    let script = format!(
        "locate {app}/src/a.rs\nread {app}/src/a.rs\nwrite {app}/new.txt hello\nread /opt/elsewhere/x\n\
         terminal_at {app}/src echo hi\npermission {app}/src/a.rs"
    );
    let (updates, asked) = turn(
        &mut shim,
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": script}]}),
    )
    .await?;
    let local = format!("{LOCAL_APP}/src/a.rs");
    let link = format!("file://{local}");
    let call = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call")
        .context("no tool call")?;
    assert_eq!(call["locations"][0]["path"], local.as_str(), "{call}");
    assert_eq!(call["content"][0]["path"], local.as_str(), "diff: {call}");
    assert_eq!(
        call["content"][1]["content"]["uri"],
        link.as_str(),
        "{call}"
    );
    let update = updates
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call_update" && u.get("locations").is_some())
        .context("no tool call update")?;
    assert_eq!(update["locations"][0]["path"], local.as_str());
    assert!(
        updates
            .iter()
            .any(|u| u["sessionUpdate"] == "agent_message_chunk"
                && u["content"]["uri"] == link.as_str()),
        "no local resource link among {updates:?}"
    );
    let reads: Vec<&Value> = params_of(&asked, "fs/read_text_file")
        .into_iter()
        .map(|p| &p["path"])
        .collect();
    assert_eq!(reads, [&json!(local), &json!("/opt/elsewhere/x")]);
    assert_eq!(
        params_of(&asked, "fs/write_text_file")[0]["path"],
        format!("{LOCAL_APP}/new.txt")
    );
    assert_eq!(
        params_of(&asked, "terminal/create")[0]["cwd"],
        format!("{LOCAL_APP}/src")
    );
    let perm = params_of(&asked, "session/request_permission");
    assert_eq!(perm[0]["toolCall"]["locations"][0]["path"], local.as_str());
    Ok(())
}

#[tokio::test]
async fn path_mapping_keeps_list_filter_and_replay_local() -> Result<()> {
    let Setup {
        _daemon,
        _tree,
        mut shim,
        app,
        ..
    } = setup().await?;
    let sid = open(&mut shim).await?;
    let link = format!("file://{LOCAL_APP}/src/b.rs");
    turn(
        &mut shim,
        json!({"sessionId": sid, "prompt": [
            {"type": "text", "text": format!("locate {app}/src/a.rs")},
            {"type": "resource_link", "name": "b", "uri": link},
        ]}),
    )
    .await?;
    // The editor filters by its own cwd and sees its own cwd.
    let id = shim
        .request("session/list", json!({"cwd": LOCAL_APP}))
        .await?;
    let (r, _) = shim.until_response(id).await?;
    let sessions = r["result"]["sessions"].as_array().context("no sessions")?;
    let s = sessions
        .iter()
        .find(|s| s["sessionId"] == sid.as_str())
        .with_context(|| format!("session not listed under the local cwd: {r}"))?;
    assert_eq!(s["cwd"], LOCAL_APP, "{r}");
    let id = shim
        .request("session/list", json!({"cwd": "/Users/ed/src/other"}))
        .await?;
    let (r, _) = shim.until_response(id).await?;
    assert_eq!(r["result"]["sessions"], json!([]), "{r}");
    // A load replays the journal (the box's paths) as the editor's.
    let id = shim
        .request(
            "session/load",
            json!({"sessionId": sid, "cwd": LOCAL_APP, "mcpServers": []}),
        )
        .await?;
    let (r, replay) = shim.until_response(id).await?;
    if r.get("result").is_none() {
        bail!("load failed: {r}");
    }
    let ups: Vec<&Value> = replay.iter().map(|m| &m["params"]["update"]).collect();
    assert!(
        ups.iter()
            .any(|u| u["sessionUpdate"] == "user_message_chunk"
                && u["content"]["uri"] == link.as_str()),
        "the prompt's link is not local on replay: {ups:?}"
    );
    let call = ups
        .iter()
        .find(|u| u["sessionUpdate"] == "tool_call")
        .context("no tool call replayed")?;
    assert_eq!(
        call["locations"][0]["path"],
        format!("{LOCAL_APP}/src/a.rs")
    );
    Ok(())
}

#[tokio::test]
async fn path_mapping_refuses_a_bad_spec() -> Result<()> {
    let d = Daemon::start(false).await?;
    let mut shim = Shim::spawn(&d.url(), &["--map", "relative=/x"], d.dir.path())?;
    assert_eq!(shim.wait_exit().await?, 64);
    assert!(
        shim.stderr().contains("must be absolute"),
        "{}",
        shim.stderr()
    );
    Ok(())
}

/// The official npm SDK's stdio stream in front of acp-shim (`tests/interop/shim-paths.mjs`):
/// the mapped paths both ways, as an SDK-built editor sees them. Needs `ACPD_TEST_SDK_DIR`
/// (see `streamable_http::the_official_sdk_http_client_runs_a_session`).
#[tokio::test]
#[cfg_attr(
    not(acpd_sdk),
    ignore = "set ACPD_TEST_SDK_DIR to a directory with @agentclientprotocol/sdk installed"
)]
async fn path_mapping_with_the_official_sdk_in_front_of_the_shim() -> Result<()> {
    let dir = std::env::var("ACPD_TEST_SDK_DIR")?;
    let script = Path::new(&dir).join("acpd-shim-paths.mjs");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/shim-paths.mjs");
    std::fs::copy(source, &script)?;
    let d = Daemon::start(false).await?;
    let tree = tempfile::tempdir()?;
    let remote = tree.path().join("app");
    std::fs::create_dir_all(&remote)?;
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .env("ACPD_SHIM", crate::support::shim_bin())
        .env("ACPD_URL", d.url())
        .env("LOCAL", LOCAL_APP)
        .env("REMOTE", &remote)
        .env("XDG_DATA_HOME", d.dir.path().join("no-such-dir"))
        .env_remove("ACPD_TOKEN")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(crate::shim_support::WAIT, run)
        .await
        .context("node in time")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("ok: session"), "{stderr}");
    Ok(())
}

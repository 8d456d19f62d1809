//! acpd-scripted-agent: a real stdio ACP v1 agent whose prompts are scripts.
//!
//! It is the stand-in for third-party agents in acpd's tests and demos. Each prompt's text is
//! a list of commands (see `script.rs`): emit updates, call the client (permission, fs,
//! terminal, extension), wait for cancellation, crash. Newline-delimited JSON-RPC on
//! stdin/stdout, logs on stderr. Standalone on purpose: it must not share code with the
//! daemon it tests.
//!
//! Like a real agent, it starts the stdio MCP servers named in `session/new|load|resume`
//! (and does nothing else with them): tests see by a marker file whether acpd let one through.
//!
//! Flags: `--no-load` (no `loadSession`), `--no-resume` (no `sessionCapabilities.resume`),
//! `--fork` (`session/fork`), `--list` (`session/list`, with titles only there),
//! `--list-by-cwd` (as `--list`, but like qwen-code's: one cwd's sessions, its own without one),
//! `--pid-dir DIR` (creates `DIR/<pid>` at start so tests can find leftover processes),
//! `--need-login` (`session/new` needs `--login` to have run in `$HOME`), `--login` (the
//! terminal login its `term` auth method runs: `login.rs`).
//! A `session/new` with `_meta.scripted.quiet: true` is answered without the
//! `available_commands_update` that otherwise comes before the answer.
//! `_scripted/echo` answers its params; `_scripted/hang` is never answered (a stuck agent).
//! `ACPD_SCRIPTED_AGENT_QUIET=1`: no line on stderr per request (the benchmark's agent).

mod elicit;
mod io;
mod login;
mod mcp_http;
mod script;
mod state;

use std::sync::Arc;

use acpd_protocol::method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use io::{Out, RpcError};
use state::{Agent, Flags, MODES, VERBOSITY};

fn usage() -> ! {
    eprintln!(
        "usage: acpd-scripted-agent [--no-load] [--no-resume] [--fork] [--list] [--list-by-cwd] \
         [--pid-dir DIR] [--need-login] [--login]"
    );
    std::process::exit(64);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut flags = Flags::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--no-load" => flags.no_load = true,
            "--no-resume" => flags.no_resume = true,
            "--fork" => flags.fork = true,
            "--login" => login::run(),
            "--need-login" => flags.need_login = true,
            "--list" => flags.list = true,
            "--list-by-cwd" => {
                flags.list = true;
                flags.list_by_cwd = true;
            }
            "--pid-dir" => {
                let dir = args.next().unwrap_or_else(|| usage());
                let path = std::path::Path::new(&dir).join(std::process::id().to_string());
                if let Err(e) =
                    std::fs::create_dir_all(&dir).and_then(|_| std::fs::File::create(&path))
                {
                    eprintln!("scripted-agent: cannot create {}: {e}", path.display());
                    std::process::exit(1);
                }
            }
            _ => usage(),
        }
    }
    flags.quiet = std::env::var_os("ACPD_SCRIPTED_AGENT_QUIET").is_some_and(|v| v == "1");
    eprintln!(
        "scripted-agent[{}]: started ({flags:?})",
        std::process::id()
    );
    let agent = Arc::new(Agent::new(Out::start(), flags));

    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    loop {
        let read = tokio::select! {
            r = stdin.read_line(&mut line) => r,
            // `stop_reading`: stdin stays unread while the turns go on.
            _ = agent.stop_reading.cancelled() => std::future::pending().await,
            // `stop_reading MS`: unread for a while. A line partly read stays in `line` (a
            // cancelled `read_line` keeps what it appended) and is finished afterwards.
            _ = agent.paused.notified() => {
                let ms = agent.pause_ms.load(std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => {
                // The client closed our stdin: nobody can talk to us any more.
                eprintln!(
                    "scripted-agent[{}]: stdin closed, exiting",
                    std::process::id()
                );
                std::process::exit(0);
            }
            Ok(_) => {}
        }
        let text = line.trim();
        if !text.is_empty() {
            match serde_json::from_str::<Value>(text) {
                Ok(msg) => dispatch(&agent, msg),
                Err(e) => agent.out.respond(
                    Value::Null,
                    Err(RpcError::new(-32700, format!("Parse error: {e}"))),
                ),
            }
        }
        line.clear();
    }
}

/// Routes one incoming message. Never awaits: turns run on their own tasks so the loop keeps
/// reading (responses to the agent's own requests and `session/cancel` arrive mid-turn).
fn dispatch(agent: &Arc<Agent>, msg: Value) {
    let method = msg.get("method").and_then(Value::as_str);
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    match (method, msg.get("id")) {
        (Some(method), Some(id)) => {
            let id = id.clone();
            if method == method::SESSION_PROMPT {
                prompt(agent, id, params);
            } else if method == "_scripted/hang" {
                // Never answered: stands in for an agent that is stuck on a request.
            } else {
                let result = handle_request(agent, method, params);
                agent.out.respond(id, result);
            }
        }
        (Some(method), None) => {
            if method == method::SESSION_CANCEL
                && let Some(sid) = params["sessionId"].as_str()
            {
                agent.cancel(sid);
            }
            // Every other notification (`$/cancel_request`, extensions) is ignored.
        }
        (None, Some(_)) => agent.peer.resolve(&msg),
        (None, None) => agent
            .out
            .respond(Value::Null, Err(RpcError::new(-32600, "Invalid Request"))),
    }
}

fn session_id(params: &Value) -> Result<String, RpcError> {
    params["sessionId"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| RpcError::invalid_params("sessionId is required"))
}

fn handle_request(agent: &Arc<Agent>, method: &str, params: Value) -> Result<Value, RpcError> {
    if !agent.flags.quiet {
        eprintln!("scripted-agent[{}]: {method}", std::process::id());
    }
    match method {
        method::INITIALIZE => {
            *agent.client_caps.lock().unwrap() = params
                .get("clientCapabilities")
                .cloned()
                .unwrap_or(Value::Null);
            let terminal =
                params.pointer("/clientCapabilities/auth/terminal") == Some(&json!(true));
            Ok(initialize_result(&agent.flags, terminal))
        }
        method::AUTHENTICATE | method::LOGOUT => Ok(json!({})),
        method::SESSION_NEW => new_session(agent, params),
        method::SESSION_LOAD if !agent.flags.no_load => load_session(agent, &params),
        method::SESSION_RESUME if !agent.flags.no_resume => {
            start_mcp_servers(&params);
            let sid = session_id(&params)?;
            agent.ensure_session(&sid);
            agent.with_session(&sid, |s| {
                s.mcp_servers = params["mcpServers"].clone();
                s.setup_result()
            })
        }
        method::SESSION_SET_MODE => {
            let sid = session_id(&params)?;
            let mode = params["modeId"].as_str().unwrap_or_default().to_string();
            if !MODES.iter().any(|(id, _)| *id == mode) {
                return Err(RpcError::invalid_params(format!("unknown mode {mode:?}")));
            }
            agent.with_session(&sid, |s| s.mode = mode.clone())?;
            agent.emit(
                &sid,
                json!({ "sessionUpdate": "current_mode_update", "currentModeId": mode }),
            );
            Ok(json!({}))
        }
        method::SESSION_SET_CONFIG_OPTION => set_config_option(agent, &params),
        method::SESSION_FORK if agent.flags.fork => {
            let parent = session_id(&params)?;
            let cwd = params["cwd"].as_str().unwrap_or_default();
            let sid = agent.fork_session(&parent, cwd)?;
            let mut result = agent.with_session(&sid, |s| s.setup_result())?;
            result["sessionId"] = json!(sid);
            Ok(result)
        }
        method::SESSION_LIST if agent.flags.list_by_cwd => {
            // qwen-code's list is of one project: the request's cwd, else its own directory.
            let cwd = match params["cwd"].as_str() {
                Some(c) => c.to_owned(),
                None => std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
            };
            let mut list = agent.list_sessions();
            if let Some(items) = list["sessions"].as_array_mut() {
                items.retain(|s| s["cwd"] == cwd.as_str());
            }
            Ok(list)
        }
        method::SESSION_LIST if agent.flags.list => Ok(agent.list_sessions()),
        "_scripted/echo" => Ok(params),
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// A new session: its place, its MCP servers; its commands announced (unless quiet).
fn new_session(agent: &Arc<Agent>, params: Value) -> Result<Value, RpcError> {
    if agent.flags.need_login && !login::logged_in() {
        return Err(RpcError::new(-32000, "Authentication required"));
    }
    start_mcp_servers(&params);
    let sid = agent.create_session();
    let cwd = params["cwd"].as_str().unwrap_or_default().to_owned();
    let dirs = params["additionalDirectories"].clone();
    agent.with_session(&sid, |s| {
        s.cwd = cwd;
        s.dirs = dirs;
        s.mcp_servers = params["mcpServers"].clone();
    })?;
    // Sent before the response on purpose: the daemon must hold it until the client
    // knows the session (Zed drops updates for sessions it has not registered yet).
    // `_meta.scripted.quiet`: the answer alone (the benchmark's session/new round
    // trip is one message each way on every path; a relay that leaves Nagle on
    // would stall a second one for a delayed ACK).
    if params.pointer("/_meta/scripted/quiet") != Some(&json!(true)) {
        agent.emit(
            &sid,
            json!({
                "sessionUpdate": "available_commands_update",
                "availableCommands": [{ "name": "echo", "description": "Echo text" }],
            }),
        );
    }
    let mut result = agent.with_session(&sid, |s| s.setup_result())?;
    result["sessionId"] = json!(sid);
    Ok(result)
}

/// A loaded session: its history replayed as updates, then the answer.
fn load_session(agent: &Arc<Agent>, params: &Value) -> Result<Value, RpcError> {
    start_mcp_servers(params);
    let sid = session_id(params)?;
    let (history, result) = agent.with_session(&sid, |s| (s.history.clone(), s.setup_result()))?;
    let lines = state::ChunkLines::new(&sid);
    for item in history {
        match item {
            state::History::Update(update) => agent.out.notify(
                method::SESSION_UPDATE,
                json!({ "sessionId": sid, "update": update }),
            ),
            state::History::Stream {
                first,
                count,
                size,
                n,
            } => {
                // In bursts, like the live stream (without waiting for the budget:
                // this handler answers inline).
                let mut k = 0;
                while k < count {
                    let m = (count - k).min(1024);
                    agent
                        .out
                        .burst(lines.render(first + k, m, size, n + k), None);
                    k += m;
                }
            }
        }
    }
    Ok(result)
}

/// The one config option, `verbosity`.
fn set_config_option(agent: &Arc<Agent>, params: &Value) -> Result<Value, RpcError> {
    let sid = session_id(params)?;
    if params["configId"] != "verbosity" {
        return Err(RpcError::invalid_params(format!(
            "unknown config option {}",
            params["configId"]
        )));
    }
    let value = params["value"].as_str().unwrap_or_default().to_string();
    if !VERBOSITY.iter().any(|(v, _)| *v == value) {
        return Err(RpcError::invalid_params(format!(
            "unknown verbosity {value:?}"
        )));
    }
    let options = agent.with_session(&sid, |s| {
        s.verbosity = value;
        s.config_options()
    })?;
    agent.emit(
        &sid,
        json!({ "sessionUpdate": "config_option_update", "configOptions": options }),
    );
    Ok(json!({ "configOptions": options }))
}

/// Runs the command of every stdio server in `params.mcpServers`, as an agent would (its
/// output is ignored; it is reaped on a thread).
fn start_mcp_servers(params: &Value) {
    let servers = params["mcpServers"].as_array().into_iter().flatten();
    for s in servers.filter(|s| matches!(s["type"].as_str(), None | Some("stdio"))) {
        let Some(command) = s["command"].as_str() else {
            continue;
        };
        let args = s["args"].as_array().into_iter().flatten();
        let child = std::process::Command::new(command)
            .args(args.filter_map(Value::as_str))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(mut c) => {
                eprintln!("scripted-agent: started MCP server {command}");
                std::thread::spawn(move || c.wait());
            }
            Err(e) => eprintln!("scripted-agent: cannot start MCP server {command}: {e}"),
        }
    }
}

/// The terminal login is listed only to a client that says it can run one
/// (`clientCapabilities.auth.terminal`), as claude-agent-acp does.
fn initialize_result(flags: &Flags, terminal: bool) -> Value {
    let mut session_caps = json!({});
    if !flags.no_resume {
        session_caps["resume"] = json!({});
    }
    if flags.fork {
        session_caps["fork"] = json!({});
    }
    if flags.list {
        session_caps["list"] = json!({});
    }
    json!({
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": !flags.no_load,
            "promptCapabilities": { "image": false, "audio": false, "embeddedContext": true },
            "mcpCapabilities": { "http": false, "sse": false },
            "sessionCapabilities": session_caps,
        },
        "authMethods": if terminal { json!([
            { "id": "token", "name": "Token" },
            { "id": "term", "name": "Terminal login", "type": "terminal", "args": ["--login"], "env": {} },
        ]) } else { json!([{ "id": "token", "name": "Token" }]) },
        "agentInfo": { "name": "scripted-agent", "version": "0.1.0" },
    })
}

/// Starts a turn: records the prompt in the history, then runs the script on its own task.
fn prompt(agent: &Arc<Agent>, id: Value, params: Value) {
    let started = (|| {
        let sid = session_id(&params)?;
        let blocks = params["prompt"].as_array().cloned().unwrap_or_default();
        let text: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect();
        let commands = script::parse(&text.join("\n")).map_err(RpcError::invalid_params)?;
        agent.with_session(&sid, |s| {
            s.last_prompt = blocks.clone();
            for block in &blocks {
                s.history.push(state::History::Update(
                    json!({ "sessionUpdate": "user_message_chunk", "content": block }),
                ));
            }
        })?;
        let (turn, cancel) = agent.begin_turn(&sid)?;
        Ok::<_, RpcError>((sid, commands, turn, cancel))
    })();
    let (sid, commands, turn, cancel) = match started {
        Ok(v) => v,
        Err(e) => return agent.out.respond(id, Err(e)),
    };
    let agent = agent.clone();
    tokio::spawn(async move {
        let lock = agent.with_session(&sid, |s| s.turn_lock.clone());
        let Ok(lock) = lock else { return };
        let _turn_guard = lock.lock().await;
        let end = script::run(&agent, &sid, commands, &cancel).await;
        agent.end_turn(&sid, turn);
        let usage = agent.with_session(&sid, |s| s.usage.take()).ok().flatten();
        let result = match end {
            script::TurnEnd::Stop(reason) => Ok(match usage {
                Some(usage) => json!({ "stopReason": reason, "usage": usage }),
                None => json!({ "stopReason": reason }),
            }),
            script::TurnEnd::Error(e) => Err(e),
        };
        agent.out.respond(id, result);
    });
}

//! The prompt script language: one command per line (or `;`-separated), run in order for one
//! turn. Unknown first words make the whole line an `echo`, so free text still gets an answer.

use acpd_protocol::method;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::io::{CallOutcome, RpcError};
use crate::state::Agent;

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Echo(String),
    Stream {
        count: u64,
        size: usize,
    },
    Thought(String),
    /// `tick N MS`: N message chunks whose text is the wall-clock time they were made
    /// (`tick UNIX_NS`), MS ms apart (0: back to back), each made only once the one before it
    /// was written: the benchmark's update latency (agent write → client read).
    Tick {
        count: u64,
        every_ms: u64,
    },
    Tool,
    /// `permission [PATH]`: the tool call asked about names PATH in its `locations`.
    Permission(Option<String>),
    /// `permission_read`: a permission request about a read-only (`kind: read`) tool call.
    PermissionRead,
    /// `ask_tool`: a `tool_call` update, then a permission request about that tool call (the
    /// order real agents use).
    AskTool,
    /// A tool call naming PATH in every place ACP carries a path (locations, a diff, a
    /// `file://` link), its update, and a message chunk linking it.
    Locate(String),
    /// Says the session's `cwd` and `additionalDirectories`.
    Where,
    /// `mcp NAME TOOL TEXT`: calls TOOL of the session's http MCP server NAME.
    Mcp {
        server: String,
        tool: String,
        text: String,
    },
    /// Says the `file://` URIs of the prompt's `resource_link` and `resource` blocks.
    Links,
    Read(String),
    Write {
        path: String,
        text: String,
    },
    Terminal {
        cwd: Option<String>,
        command: String,
        args: Vec<String>,
    },
    Ext,
    WaitForCancel,
    /// `stop_reading`: the agent reads nothing more from its stdin, ever (it still writes).
    /// `stop_reading MS`: nothing for MS ms, then it reads on (an agent busy computing).
    StopReading(Option<u64>),
    /// From here on the turn does not see `session/cancel` (gemini-cli, often).
    IgnoreCancel,
    /// A cancelled turn answers this stop reason instead of `cancelled` (opencode: end_turn).
    CancelAnswer(String),
    Sleep(u64),
    Crash,
    UnknownUpdate,
    Title(String),
    Caps,
    Stop(String),
    /// `usage IN OUT [CACHED [THOUGHT]]`: the turn's answer carries these tokens as `usage`.
    Usage([u64; 4]),
    /// `cost AMOUNT CURRENCY`: a `usage_update` whose `cost` is the session's running total
    /// after adding AMOUNT.
    Cost(f64, String),
    Error {
        code: i64,
        message: String,
    },
    /// `notice TITLE`: a `notice` update (gated: `clientCapabilities.session.notices`).
    Notice(String),
    /// `elicit_form`, `elicit_url`, `elicit_complete` (`elicit.rs`).
    Elicit(crate::elicit::Elicit),
}

/// Parses the whole script before anything runs, so a typo fails the prompt cleanly.
pub fn parse(text: &str) -> Result<Vec<Command>, String> {
    text.split(['\n', ';'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(parse_line)
        .collect()
}

// long: one arm per script word (a flat table from the word to its `Command`).
fn parse_line(line: &str) -> Result<Command, String> {
    let (word, rest) = match line.split_once(char::is_whitespace) {
        Some((w, r)) => (w, r.trim()),
        None => (line, ""),
    };
    let args: Vec<&str> = rest.split_whitespace().collect();
    let bad = |why: &str| format!("invalid script line `{line}`: {why}");
    let int = |s: Option<&&str>, what: &str| -> Result<u64, String> {
        s.and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(&format!("{what} must be an integer")))
    };
    let path = |what: &str| -> Result<String, String> {
        args.first()
            .map(|s| s.to_string())
            .ok_or_else(|| bad(&format!("{what} needs a path")))
    };
    if let Some(e) = crate::elicit::parse(word, rest) {
        return e.map(Command::Elicit);
    }
    Ok(match word {
        "echo" => Command::Echo(rest.to_string()),
        "stream" => Command::Stream {
            count: int(args.first(), "N")?,
            size: int(args.get(1), "S")? as usize,
        },
        "thought" => Command::Thought(rest.to_string()),
        "tick" => Command::Tick {
            count: int(args.first(), "N")?,
            every_ms: int(args.get(1), "MS")?,
        },
        "tool" => Command::Tool,
        "permission" => Command::Permission(args.first().map(|s| s.to_string())),
        "ask_tool" => Command::AskTool,
        "permission_read" => Command::PermissionRead,
        "locate" => Command::Locate(path("locate")?),
        "where" => Command::Where,
        "links" => Command::Links,
        "mcp" => match args.as_slice() {
            [server, tool, text @ ..] => Command::Mcp {
                server: server.to_string(),
                tool: tool.to_string(),
                text: text.join(" "),
            },
            _ => return Err(bad("needs a server and a tool")),
        },
        "read" => Command::Read(path("read")?),
        "write" => {
            let path = path("write")?;
            let text = rest[path.len()..].trim_start().to_string();
            Command::Write { path, text }
        }
        "terminal" => {
            let (command, args) = args.split_first().ok_or_else(|| bad("needs a command"))?;
            Command::Terminal {
                cwd: None,
                command: command.to_string(),
                args: args.iter().map(|s| s.to_string()).collect(),
            }
        }
        "terminal_at" => match args.as_slice() {
            [cwd, command, args @ ..] => Command::Terminal {
                cwd: Some(cwd.to_string()),
                command: command.to_string(),
                args: args.iter().map(|s| s.to_string()).collect(),
            },
            _ => return Err(bad("needs a directory and a command")),
        },
        "ext" => Command::Ext,
        "wait_for_cancel" => Command::WaitForCancel,
        "stop_reading" => match args.first() {
            None => Command::StopReading(None),
            ms => Command::StopReading(Some(int(ms, "MS")?)),
        },
        "ignore_cancel" => Command::IgnoreCancel,
        "cancel_answer" => Command::CancelAnswer(
            args.first()
                .ok_or_else(|| bad("needs a stop reason"))?
                .to_string(),
        ),
        "sleep" => Command::Sleep(int(args.first(), "MS")?),
        "crash" => Command::Crash,
        "unknown_update" => Command::UnknownUpdate,
        "title" => Command::Title(rest.to_string()),
        "notice" => Command::Notice(rest.to_string()),
        "caps" => Command::Caps,
        "usage" => {
            let n = |i: usize| args.get(i).map_or(Ok(0), |s| int(Some(s), "a token count"));
            Command::Usage([
                int(args.first(), "IN")?,
                int(args.get(1), "OUT")?,
                n(2)?,
                n(3)?,
            ])
        }
        "cost" => match args.as_slice() {
            [amount, currency] => Command::Cost(
                amount.parse().map_err(|_| bad("AMOUNT must be a number"))?,
                currency.to_string(),
            ),
            _ => return Err(bad("needs an amount and a currency")),
        },
        "stop" => Command::Stop(
            args.first()
                .ok_or_else(|| bad("needs a stop reason"))?
                .to_string(),
        ),
        "error" => {
            let code = args
                .first()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("CODE must be an integer"))?;
            let message = rest
                .split_once(char::is_whitespace)
                .map(|(_, m)| m.trim())
                .unwrap_or("");
            Command::Error {
                code,
                message: message.to_string(),
            }
        }
        _ => Command::Echo(line.to_string()),
    })
}

/// Bytes of one `stream` burst (a few hundred updates of 64 B).
const BURST_BYTES: usize = 128 * 1024;

/// How a turn ends.
pub enum TurnEnd {
    Stop(String),
    Error(RpcError),
}

/// What one command did to the turn: `Err` ends it.
type Flow = Result<(), TurnEnd>;

fn cancelled() -> TurnEnd {
    TurnEnd::Stop("cancelled".into())
}

/// Runs the commands of one turn in order. The turn ends at the first `stop`, `error`, or
/// cancellation; otherwise with `end_turn`.
pub async fn run(
    agent: &Arc<Agent>,
    sid: &str,
    commands: Vec<Command>,
    cancel: &CancellationToken,
) -> TurnEnd {
    // `ignore_cancel` swaps in a token nothing cancels; `cancel_answer` renames the outcome.
    let mut cancel = cancel.clone();
    let mut on_cancel = "cancelled".to_string();
    let end = 'turn: {
        for command in commands {
            if cancel.is_cancelled() {
                break 'turn cancelled();
            }
            match command {
                Command::IgnoreCancel => cancel = CancellationToken::new(),
                Command::CancelAnswer(reason) => on_cancel = reason,
                command => {
                    if let Err(end) = run_one(agent, sid, command, &cancel).await {
                        break 'turn end;
                    }
                }
            }
        }
        if cancel.is_cancelled() {
            break 'turn cancelled();
        }
        TurnEnd::Stop("end_turn".into())
    };
    match end {
        TurnEnd::Stop(r) if r == "cancelled" && cancel.is_cancelled() => TurnEnd::Stop(on_cancel),
        end => end,
    }
}

// long: one arm per script command (a flat match over `Command`); the longer ones are functions
// of their own.
async fn run_one(
    agent: &Arc<Agent>,
    sid: &str,
    command: Command,
    cancel: &CancellationToken,
) -> Flow {
    match command {
        Command::Echo(text) => agent.say(sid, text),
        Command::Stream { count, size } => stream(agent, sid, count, size, cancel).await?,
        Command::Tick { count, every_ms } => tick(agent, sid, count, every_ms, cancel).await?,
        Command::Thought(text) => agent.emit(
            sid,
            json!({ "sessionUpdate": "agent_thought_chunk", "content": { "type": "text", "text": text } }),
        ),
        Command::Tool => {
            let id = format!("tool-{}", next_tool(agent, sid));
            announce_tool(agent, sid, &id, "Read a file", "read");
            agent.emit(
                sid,
                json!({ "sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed" }),
            );
        }
        Command::Permission(path) => {
            let id = format!("perm-{}", next_tool(agent, sid));
            permission(agent, sid, (id, "other"), path, cancel).await?
        }
        Command::PermissionRead => {
            let id = format!("perm-{}", next_tool(agent, sid));
            permission(agent, sid, (id, "read"), None, cancel).await?
        }
        Command::StopReading(None) => agent.stop_reading.cancel(),
        Command::StopReading(Some(ms)) => agent.pause_reading(ms),
        Command::AskTool => {
            let id = format!("tool-{}", next_tool(agent, sid));
            announce_tool(agent, sid, &id, "Run a scripted action", "other");
            permission(agent, sid, (id, "other"), None, cancel).await?
        }
        Command::Locate(path) => locate(agent, sid, &path),
        Command::Where => {
            let (cwd, dirs) = agent
                .with_session(sid, |s| (s.cwd.clone(), s.dirs.clone()))
                .unwrap_or_default();
            agent.say(sid, format!("cwd: {cwd} dirs: {dirs}"));
        }
        Command::Mcp { server, tool, text } => mcp(agent, sid, &server, &tool, &text, cancel).await?,
        Command::Links => links(agent, sid),
        Command::Read(path) => {
            let params = json!({ "sessionId": sid, "path": path });
            let Some(result) = call(agent, sid, method::FS_READ_TEXT_FILE, params, cancel).await? else {
                return Ok(());
            };
            let content = result.get("content").and_then(Value::as_str).unwrap_or("");
            agent.say(sid, format!("read: {content}"));
        }
        Command::Write { path, text } => {
            let params = json!({ "sessionId": sid, "path": path, "content": text });
            if call(agent, sid, method::FS_WRITE_TEXT_FILE, params, cancel).await?.is_some() {
                agent.say(sid, format!("wrote: {path}"));
            }
        }
        Command::Terminal { cwd, command, args } => {
            terminal(agent, sid, cwd, command, args, cancel).await?
        }
        Command::Ext => {
            if let Some(result) = call(agent, sid, "_scripted/ping", json!({ "n": 1 }), cancel).await? {
                agent.say(sid, format!("ext: {result}"));
            }
        }
        Command::WaitForCancel => {
            cancel.cancelled().await;
            return Err(cancelled());
        }
        Command::IgnoreCancel | Command::CancelAnswer(_) => {}
        Command::Sleep(ms) => {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = cancel.cancelled() => return Err(cancelled()),
            }
        }
        Command::Crash => {
            agent.out.exit(3);
            // The writer task ends the process after flushing; this turn never answers.
            std::future::pending::<()>().await;
        }
        Command::UnknownUpdate => agent.emit(
            sid,
            json!({
                "sessionUpdate": "acpd_test_unknown_kind",
                "payload": { "x": 1 },
                "_meta": { "scripted": { "kept": true } },
            }),
        ),
        Command::Title(title) if agent.flags.list => {
            // Like claude-agent-acp and opencode: the title is in its own list only.
            let _ = agent.with_session(sid, |s| s.title = Some(title));
        }
        Command::Title(title) => {
            agent.emit(sid, json!({ "sessionUpdate": "session_info_update", "title": title }))
        }
        Command::Caps => {
            let caps = agent.client_caps.lock().unwrap().clone();
            agent.say(sid, format!("caps: {caps}"));
        }
        Command::Stop(reason) => return Err(TurnEnd::Stop(reason)),
        Command::Notice(title) => agent.emit(
            sid,
            json!({ "sessionUpdate": "notice", "severity": "info", "title": title }),
        ),
        Command::Elicit(e) => crate::elicit::run(agent, sid, e, cancel)
            .await
            .map_err(|()| cancelled())?,
        Command::Usage([input, output, cached, thought]) => {
            let usage = json!({
                "inputTokens": input, "outputTokens": output, "cachedReadTokens": cached,
                "thoughtTokens": thought, "totalTokens": input + output + cached + thought,
            });
            let _ = agent.with_session(sid, |s| s.usage = Some(usage));
        }
        Command::Cost(amount, currency) => {
            let total = agent.with_session(sid, |s| {
                s.cost += amount;
                s.cost
            });
            let cost = json!({ "amount": total.unwrap_or(amount), "currency": currency });
            agent.emit(
                sid,
                json!({ "sessionUpdate": "usage_update", "used": 1000, "size": 200000, "cost": cost }),
            );
        }
        Command::Error { code, message } => return Err(TurnEnd::Error(RpcError::new(code, message))),
    }
    Ok(())
}

/// `stream N S`: bursts of pre-serialized lines, each one write; the output budget makes the
/// stream wait for its reader instead of piling up.
async fn stream(
    agent: &Arc<Agent>,
    sid: &str,
    count: u64,
    size: usize,
    cancel: &CancellationToken,
) -> Flow {
    let line = size + 220;
    let per_burst = (BURST_BYTES / line).max(1) as u64;
    let mut i = 0;
    while i < count {
        let n = per_burst.min(count - i);
        let permit = tokio::select! {
            p = agent.out.reserve(line * n as usize) => p,
            _ = cancel.cancelled() => return Err(cancelled()),
        };
        agent.stream(sid, i, n, size, permit);
        i += n;
    }
    Ok(())
}

/// `tick N MS`: one stamped chunk at a time, the next made once the writer has written the
/// one before (a one-permit semaphore whose permit the written burst releases), so the stamp
/// measures the relay and not a queue inside this agent. `MS` 0: the writer thread makes them
/// itself (`io::Ticks`), with no wake-up of this task per chunk.
async fn tick(
    agent: &Arc<Agent>,
    sid: &str,
    count: u64,
    every_ms: u64,
    cancel: &CancellationToken,
) -> Flow {
    if every_ms == 0 {
        // Back to back: the writer thread makes them (`io::Ticks`), one write per round.
        let Some(done) = agent.ticks(sid, count, cancel.clone()) else {
            return Ok(());
        };
        let written = done.await.unwrap_or(0);
        if written < count {
            agent.untick(sid, count - written);
            return Err(cancelled());
        }
        return Ok(());
    }
    let written = Arc::new(tokio::sync::Semaphore::new(1));
    let mut every = tokio::time::interval(Duration::from_millis(every_ms.max(1)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..count {
        if every_ms > 0 {
            tokio::select! {
                _ = every.tick() => {}
                _ = cancel.cancelled() => return Err(cancelled()),
            }
        }
        let permit = tokio::select! {
            p = written.clone().acquire_owned() => p.expect("never closed"),
            _ = cancel.cancelled() => return Err(cancelled()),
        };
        agent.tick(sid, permit);
    }
    Ok(())
}

/// `locate PATH`: a tool call with a location, a diff and a link, then a link in the message.
fn locate(agent: &Arc<Agent>, sid: &str, path: &str) {
    let id = format!("tool-{}", next_tool(agent, sid));
    let uri = format!("file://{path}");
    agent.emit(
        sid,
        json!({
            "sessionUpdate": "tool_call", "toolCallId": id, "title": format!("Edit {path}"),
            "kind": "edit", "status": "pending",
            "locations": [{ "path": path, "line": 1 }],
            "content": [
                { "type": "diff", "path": path, "oldText": "old", "newText": "new" },
                { "type": "content", "content": { "type": "resource_link", "name": "file", "uri": uri } },
            ],
        }),
    );
    agent.emit(
        sid,
        json!({
            "sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed",
            "locations": [{ "path": path }],
        }),
    );
    agent.emit(
        sid,
        json!({
            "sessionUpdate": "agent_message_chunk",
            "content": { "type": "resource_link", "name": "file", "uri": uri },
        }),
    );
}

/// `mcp SERVER TOOL TEXT`: calls a tool of the session's HTTP MCP server and says the result.
async fn mcp(
    agent: &Arc<Agent>,
    sid: &str,
    server: &str,
    tool: &str,
    text: &str,
    cancel: &CancellationToken,
) -> Flow {
    let servers = agent
        .with_session(sid, |s| s.mcp_servers.clone())
        .unwrap_or_default();
    let url = servers
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == server && s["type"] == "http")
        .and_then(|s| s["url"].as_str())
        .map(str::to_owned);
    let said = match url {
        None => format!("mcp error: no http server {server}"),
        Some(url) => {
            let call = crate::mcp_http::call_tool(&url, tool, text);
            tokio::select! {
                r = call => match r {
                    Ok((tools, out)) => format!("mcp: tools={} result={out}", tools.join(",")),
                    Err(e) => format!("mcp error: {e}"),
                },
                _ = cancel.cancelled() => return Err(cancelled()),
            }
        }
    };
    agent.say(sid, said);
    Ok(())
}

/// `links`: says the links of the last prompt.
fn links(agent: &Arc<Agent>, sid: &str) {
    let blocks = agent
        .with_session(sid, |s| s.last_prompt.clone())
        .unwrap_or_default();
    let uris: Vec<&str> = blocks
        .iter()
        .filter_map(|b| match b["type"].as_str() {
            Some("resource_link") => b["uri"].as_str(),
            Some("resource") => b["resource"]["uri"].as_str(),
            _ => None,
        })
        .collect();
    agent.say(sid, format!("links: {}", uris.join(" ")));
}

fn next_tool(agent: &Agent, sid: &str) -> u64 {
    agent
        .with_session(sid, |s| {
            s.tool_n += 1;
            s.tool_n
        })
        .unwrap_or(0)
}

/// A pending `tool_call` update announcing tool call `id`.
fn announce_tool(agent: &Agent, sid: &str, id: &str, title: &str, kind: &str) {
    agent.emit(
        sid,
        json!({
            "sessionUpdate": "tool_call", "toolCallId": id, "title": title,
            "kind": kind, "status": "pending",
        }),
    );
}

/// Calls the client. `Err(flow)` ends the turn (cancelled); `Ok(None)` means the client
/// answered with an error, already reported as an `error: CODE MESSAGE` chunk.
async fn call(
    agent: &Arc<Agent>,
    sid: &str,
    method: &str,
    params: Value,
    cancel: &CancellationToken,
) -> Result<Option<Value>, TurnEnd> {
    match agent.peer.call(&agent.out, method, params, cancel).await {
        CallOutcome::Ok(v) => Ok(Some(v)),
        CallOutcome::Err(e) => {
            agent.say(sid, format!("error: {} {}", e.code, e.message));
            Ok(None)
        }
        CallOutcome::Cancelled => Err(cancelled()),
    }
}

async fn permission(
    agent: &Arc<Agent>,
    sid: &str,
    (id, kind): (String, &str),
    path: Option<String>,
    cancel: &CancellationToken,
) -> Flow {
    let options: Vec<Value> = [
        ("allow-once", "Allow once", "allow_once"),
        ("allow-always", "Allow always", "allow_always"),
        ("reject-once", "Reject once", "reject_once"),
        ("reject-always", "Reject always", "reject_always"),
    ]
    .iter()
    .map(|(id, name, kind)| json!({ "optionId": id, "name": name, "kind": kind }))
    .collect();
    let mut params = json!({
        "sessionId": sid,
        "toolCall": { "toolCallId": id, "title": "Run a scripted action", "kind": kind, "status": "pending" },
        "options": options,
    });
    if let Some(path) = path {
        params["toolCall"]["locations"] = json!([{ "path": path }]);
    }
    match agent
        .peer
        .call(
            &agent.out,
            method::SESSION_REQUEST_PERMISSION,
            params,
            cancel,
        )
        .await
    {
        CallOutcome::Ok(result) => {
            let outcome = &result["outcome"];
            match (outcome["outcome"].as_str(), outcome["optionId"].as_str()) {
                (Some("selected"), Some(option)) => {
                    agent.say(sid, format!("permission: selected {option}"));
                    Ok(())
                }
                (Some("cancelled"), _) => {
                    agent.say(sid, "permission: cancelled");
                    Err(cancelled())
                }
                _ => {
                    agent.say(
                        sid,
                        format!("error: -32602 invalid permission outcome {result}"),
                    );
                    Ok(())
                }
            }
        }
        CallOutcome::Err(e) => {
            agent.say(sid, format!("error: {} {}", e.code, e.message));
            Ok(())
        }
        CallOutcome::Cancelled => {
            agent.say(sid, "permission: cancelled");
            Err(cancelled())
        }
    }
}

async fn terminal(
    agent: &Arc<Agent>,
    sid: &str,
    cwd: Option<String>,
    command: String,
    args: Vec<String>,
    cancel: &CancellationToken,
) -> Flow {
    let mut params = json!({ "sessionId": sid, "command": command, "args": args });
    if let Some(cwd) = cwd {
        params["cwd"] = json!(cwd);
    }
    let Some(created) = call(agent, sid, method::TERMINAL_CREATE, params, cancel).await? else {
        return Ok(());
    };
    let Some(tid) = created["terminalId"].as_str().map(str::to_string) else {
        agent.say(
            sid,
            format!("error: -32602 terminal/create returned no terminalId: {created}"),
        );
        return Ok(());
    };
    let ids = json!({ "sessionId": sid, "terminalId": tid });
    let flow = async {
        let exit = call(
            agent,
            sid,
            method::TERMINAL_WAIT_FOR_EXIT,
            ids.clone(),
            cancel,
        )
        .await?;
        let output = call(agent, sid, method::TERMINAL_OUTPUT, ids.clone(), cancel).await?;
        if let (Some(exit), Some(output)) = (exit, output) {
            let code = exit.get("exitCode").cloned().unwrap_or(Value::Null);
            let text = output["output"].as_str().unwrap_or("");
            agent.say(sid, format!("terminal: exit {code} output {text}"));
        }
        Ok::<(), TurnEnd>(())
    }
    .await;
    match flow {
        Ok(()) => {
            // Release is awaited on the normal path so a test sees it happen before the turn ends.
            call(agent, sid, method::TERMINAL_RELEASE, ids, cancel).await?;
            Ok(())
        }
        Err(end) => {
            // Cancelled: the agent still must release, but waits for nothing any more.
            agent
                .peer
                .fire_and_forget(&agent.out, method::TERMINAL_RELEASE, ids);
            Err(end)
        }
    }
}

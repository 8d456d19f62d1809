//! What the scripted agent remembers: its sessions, each with the history it would replay on
//! `session/load`, its mode and config values, and the running turn's cancellation token.

use acpd_protocol::method;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::io::{Out, Peer, RpcError, Ticks};

pub const MODES: [(&str, &str); 2] = [("default", "Default"), ("plan", "Plan")];
pub const VERBOSITY: [(&str, &str); 2] = [("low", "Low"), ("high", "High")];

/// Command-line switches.
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub no_load: bool,
    pub no_resume: bool,
    /// `sessionCapabilities.fork`: `session/fork` copies a session's history.
    pub fork: bool,
    /// `sessionCapabilities.list`: `session/list` lists its sessions, with the titles set by
    /// `title` commands (in its own list only, as claude-agent-acp and opencode do).
    pub list: bool,
    /// `--list-by-cwd` (with `list`): like qwen-code, `session/list` lists one project's
    /// sessions only: those made in `params.cwd`, or in its own working directory when the
    /// request names none.
    pub list_by_cwd: bool,
    /// No line on stderr per request (`ACPD_SCRIPTED_AGENT_QUIET`): the benchmark's agent,
    /// whose stderr acpd would log line by line while the other paths drop it.
    pub quiet: bool,
    /// `--need-login`: `session/new` is answered -32000 until `--login` has run in `$HOME`.
    pub need_login: bool,
}

/// One item of a session's history.
#[derive(Clone)]
pub enum History {
    Update(Value),
    /// Chunks `first..first + count` of a `stream` of `size`-byte texts, stamped `n..n + count`:
    /// kept as a range, so a stream of millions costs nothing to remember.
    Stream {
        first: u64,
        count: u64,
        size: usize,
        n: u64,
    },
}

pub struct Session {
    /// Every update sent for this session, plus the user's prompts, in order.
    pub history: Vec<History>,
    /// The title its own `session/list` shows (`--list`), and the cwd it was made in.
    pub title: Option<String>,
    pub cwd: String,
    /// `additionalDirectories` as `session/new` gave them, and the last prompt's blocks
    /// (`where` and `links` report them, for path-mapping tests).
    pub dirs: Value,
    pub last_prompt: Vec<Value>,
    /// The `mcpServers` of its last `session/new|load|resume` (`mcp` uses the http ones).
    pub mcp_servers: Value,
    /// Counter stamped into `agent_message_chunk`s (`_meta.scripted.n`).
    chunk_n: u64,
    /// Counter for tool call and permission ids.
    pub tool_n: u64,
    pub mode: String,
    pub verbosity: String,
    /// Running (or queued) turns: number and cancellation token.
    turns: Vec<(u64, CancellationToken)>,
    /// Serializes turns of one session: a second prompt waits for the first.
    pub turn_lock: Arc<tokio::sync::Mutex<()>>,
    /// The running turn's `usage` (`usage` in a script), answered with its stop reason.
    pub usage: Option<Value>,
    /// The session's running total of `cost` (`cost` in a script).
    pub cost: f64,
}

impl Session {
    fn new() -> Session {
        Session {
            history: Vec::new(),
            title: None,
            cwd: String::new(),
            dirs: Value::Null,
            mcp_servers: Value::Null,
            last_prompt: Vec::new(),
            chunk_n: 0,
            tool_n: 0,
            mode: "default".into(),
            verbosity: "low".into(),
            turns: Vec::new(),
            turn_lock: Arc::new(tokio::sync::Mutex::new(())),
            usage: None,
            cost: 0.0,
        }
    }

    pub fn modes(&self) -> Value {
        let available: Vec<Value> = MODES
            .iter()
            .map(|(id, name)| json!({ "id": id, "name": name }))
            .collect();
        json!({ "currentModeId": self.mode, "availableModes": available })
    }

    pub fn config_options(&self) -> Value {
        let options: Vec<Value> = VERBOSITY
            .iter()
            .map(|(v, name)| json!({ "value": v, "name": name }))
            .collect();
        json!([{
            "id": "verbosity",
            "name": "Verbosity",
            "type": "select",
            "currentValue": self.verbosity,
            "options": options,
        }])
    }

    /// The result of `session/load` and `session/resume`.
    pub fn setup_result(&self) -> Value {
        json!({ "modes": self.modes(), "configOptions": self.config_options() })
    }
}

/// The whole agent, shared by the stdin loop and the turn tasks.
pub struct Agent {
    pub out: Out,
    pub peer: Peer,
    pub flags: Flags,
    pub sessions: Mutex<HashMap<String, Session>>,
    /// `clientCapabilities` exactly as received in `initialize`.
    pub client_caps: Mutex<Value>,
    next_session: AtomicU64,
    next_turn: AtomicU64,
    /// Fired by the script command `stop_reading`: stdin is not read any more (an agent stuck
    /// with its input unread); turns already running go on writing.
    pub stop_reading: tokio_util::sync::CancellationToken,
    /// Fired by `stop_reading MS`: the reading loop stops for `pause_ms`, then reads on.
    pub paused: tokio::sync::Notify,
    pub pause_ms: AtomicU64,
}

impl Agent {
    pub fn new(out: Out, flags: Flags) -> Agent {
        Agent {
            out,
            peer: Peer::new(),
            flags,
            sessions: Mutex::new(HashMap::new()),
            client_caps: Mutex::new(Value::Null),
            next_session: AtomicU64::new(1),
            next_turn: AtomicU64::new(1),
            stop_reading: tokio_util::sync::CancellationToken::new(),
            paused: tokio::sync::Notify::new(),
            pause_ms: AtomicU64::new(0),
        }
    }

    /// Stops reading stdin for `ms` ms (from the reading loop's next pass).
    pub fn pause_reading(&self, ms: u64) {
        self.pause_ms.store(ms, Ordering::Relaxed);
        self.paused.notify_one();
    }

    /// Creates a session with a fresh id `sa-<counter>-<pid>`.
    pub fn create_session(&self) -> String {
        let n = self.next_session.fetch_add(1, Ordering::Relaxed);
        let id = format!("sa-{n}-{}", std::process::id());
        self.sessions
            .lock()
            .unwrap()
            .insert(id.clone(), Session::new());
        id
    }

    /// `session/fork`: a new session whose history is a copy of `parent`'s.
    pub fn fork_session(&self, parent: &str, cwd: &str) -> Result<String, RpcError> {
        let history = self.with_session(parent, |s| s.history.clone())?;
        let id = self.create_session();
        self.with_session(&id, |s| {
            s.history = history;
            s.cwd = cwd.to_owned();
        })?;
        Ok(id)
    }

    /// `session/list` (`--list`): every session with its title, newest first.
    pub fn list_sessions(&self) -> Value {
        let sessions = self.sessions.lock().unwrap();
        let mut items: Vec<(&String, &Session)> = sessions.iter().collect();
        items.sort_by_key(|(id, _)| std::cmp::Reverse(session_number(id)));
        let list: Vec<Value> = items
            .into_iter()
            .map(|(id, s)| {
                let mut v = json!({ "sessionId": id, "cwd": s.cwd });
                if let Some(t) = &s.title {
                    v["title"] = json!(t);
                    v["updatedAt"] = json!("2026-01-02T03:04:05.000Z");
                }
                v
            })
            .collect();
        json!({ "sessions": list })
    }

    /// Creates empty state under a caller-chosen id unless it exists (`session/resume`).
    pub fn ensure_session(&self, id: &str) {
        self.sessions
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_insert_with(Session::new);
    }

    /// Runs `f` on a session, or fails with -32002.
    pub fn with_session<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, RpcError> {
        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions
            .get_mut(id)
            .ok_or_else(|| RpcError::session_not_found(id))?;
        Ok(f(session))
    }

    /// Sends a `session/update` and records it in the session's history. Both happen under
    /// the sessions lock so that history order is send order.
    pub fn emit(&self, session_id: &str, mut update: Value) {
        let mut sessions = self.sessions.lock().unwrap();
        let Some(session) = sessions.get_mut(session_id) else {
            return;
        };
        if update["sessionUpdate"] == "agent_message_chunk" {
            session.chunk_n += 1;
            update["_meta"] = json!({ "scripted": { "n": session.chunk_n } });
        }
        self.out.notify(
            method::SESSION_UPDATE,
            json!({ "sessionId": session_id, "update": update }),
        );
        session.history.push(History::Update(update));
    }

    /// Sends chunks `first..first + count` of a `stream` as one burst of pre-serialized lines
    /// (the same updates `say` would send, `_meta.scripted.n` included) and records them.
    pub fn stream(
        &self,
        session_id: &str,
        first: u64,
        count: u64,
        size: usize,
        permit: OwnedSemaphorePermit,
    ) {
        let mut sessions = self.sessions.lock().unwrap();
        let Some(session) = sessions.get_mut(session_id) else {
            return;
        };
        let n = session.chunk_n + 1;
        session.chunk_n += count;
        let bytes = ChunkLines::new(session_id).render(first, count, size, n);
        self.out.burst(bytes, Some(permit));
        if let Some(History::Stream {
            first: f,
            count: c,
            size: s,
            n: m,
        }) = session.history.last_mut()
            && *s == size
            && *f + *c == first
            && *m + *c == n
        {
            *c += count;
        } else {
            session.history.push(History::Stream {
                first,
                count,
                size,
                n,
            });
        }
    }

    /// Sends one `agent_message_chunk` whose text is `tick UNIX_NS`, the wall-clock time now,
    /// written before `permit` is released. Not kept in the history: a benchmark's stamps are
    /// not worth replaying.
    pub fn tick(&self, session_id: &str, permit: OwnedSemaphorePermit) {
        let mut sessions = self.sessions.lock().unwrap();
        let Some(session) = sessions.get_mut(session_id) else {
            return;
        };
        session.chunk_n += 1;
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let msg = json!({
            "jsonrpc": "2.0",
            "method": method::SESSION_UPDATE,
            "params": {
                "sessionId": session_id,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": { "type": "text", "text": format!("tick {ns}") },
                    "_meta": { "scripted": { "n": session.chunk_n } },
                },
            },
        });
        let mut line = serde_json::to_vec(&msg).expect("JSON values always serialize");
        line.push(b'\n');
        self.out.burst(line, Some(permit));
    }

    /// Hands `count` back-to-back ticks of the session to the writer thread (`io::Ticks`),
    /// numbered on from the session's chunks; resolves to how many were written. `None`: no
    /// such session.
    pub fn ticks(
        &self,
        session_id: &str,
        count: u64,
        cancel: CancellationToken,
    ) -> Option<tokio::sync::oneshot::Receiver<u64>> {
        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions.get_mut(session_id)?;
        let n = session.chunk_n + 1;
        session.chunk_n += count;
        let (done, written) = tokio::sync::oneshot::channel();
        self.out.ticks(Ticks {
            head: ChunkLines::new(session_id).head,
            mid: CHUNK_MID,
            tail: CHUNK_TAIL,
            n,
            left: count,
            cancel,
            done,
            written: 0,
        });
        Some(written)
    }

    /// Takes back the numbers of `unsent` chunks reserved by `ticks` (a cancelled run).
    pub fn untick(&self, session_id: &str, unsent: u64) {
        if let Some(session) = self.sessions.lock().unwrap().get_mut(session_id) {
            session.chunk_n -= unsent;
        }
    }

    /// Sends an `agent_message_chunk` with plain text.
    pub fn say(&self, session_id: &str, text: impl Into<String>) {
        let text: String = text.into();
        let update = json!({
            "sessionUpdate": "agent_message_chunk",
            "content": { "type": "text", "text": text },
        });
        self.emit(session_id, update);
    }

    /// Registers a new turn; returns its number and token. Done on the stdin task, before the
    /// turn task is spawned, so a `session/cancel` read right after the prompt finds it.
    pub fn begin_turn(&self, session_id: &str) -> Result<(u64, CancellationToken), RpcError> {
        let n = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.with_session(session_id, |s| {
            s.turns.push((n, token.clone()));
        })?;
        Ok((n, token))
    }

    pub fn end_turn(&self, session_id: &str, n: u64) {
        let _ = self.with_session(session_id, |s| s.turns.retain(|(m, _)| *m != n));
    }

    /// `session/cancel`: stops the running turn's waits, and any queued turn of the session.
    pub fn cancel(&self, session_id: &str) {
        let _ = self.with_session(session_id, |s| {
            for (_, token) in &s.turns {
                token.cancel();
            }
        });
    }
}

/// `n` of an id `sa-<n>-<pid>`.
fn session_number(id: &str) -> u64 {
    id.split('-')
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The line of a streamed `agent_message_chunk`, as a template: only the chunk's index, its
/// padding and its number are written per update, no JSON is built.
pub struct ChunkLines {
    head: Vec<u8>,
}

const CHUNK_MID: &[u8] = br#""},"_meta":{"scripted":{"n":"#;
const CHUNK_TAIL: &[u8] = b"}}}}}\n";

impl ChunkLines {
    pub fn new(session_id: &str) -> ChunkLines {
        let sid = serde_json::to_string(session_id).expect("strings always serialize");
        let head = format!(
            r#"{{"jsonrpc":"2.0","method":"{m}","params":{{"sessionId":{sid},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":""#,
            m = method::SESSION_UPDATE
        );
        ChunkLines {
            head: head.into_bytes(),
        }
    }

    /// The lines of chunks `first..first + count`: text `"{i}:"` padded with `x` to `size`
    /// bytes, numbered from `n`.
    pub fn render(&self, first: u64, count: u64, size: usize, n: u64) -> Vec<u8> {
        let line = self.head.len() + size.max(24) + CHUNK_MID.len() + CHUNK_TAIL.len() + 20;
        let mut out = Vec::with_capacity(line * count as usize);
        for k in 0..count {
            out.extend_from_slice(&self.head);
            let start = out.len();
            push_int(&mut out, first + k);
            out.push(b':');
            let written = out.len() - start;
            if written < size {
                out.resize(out.len() + size - written, b'x');
            }
            out.extend_from_slice(CHUNK_MID);
            push_int(&mut out, n + k);
            out.extend_from_slice(CHUNK_TAIL);
        }
        out
    }
}

/// Appends `v` in decimal.
fn push_int(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::ChunkLines;
    use serde_json::{Value, json};

    #[test]
    fn template_lines_are_the_updates_say_would_send() {
        let bytes = ChunkLines::new("sa-\"1\"").render(9, 3, 6, 41);
        let lines: Vec<Value> = std::str::from_utf8(&bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let line = |text: &str, n: u64| {
            json!({ "jsonrpc": "2.0", "method": "session/update", "params": {
                "sessionId": "sa-\"1\"",
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": { "type": "text", "text": text },
                    "_meta": { "scripted": { "n": n } },
                },
            }})
        };
        assert_eq!(
            lines,
            [line("9:xxxx", 41), line("10:xxx", 42), line("11:xxx", 43)]
        );
        assert!(bytes.ends_with(b"\n"));
        let short = ChunkLines::new("s").render(12345, 1, 2, 1);
        let v: Value = serde_json::from_slice(&short).unwrap();
        assert_eq!(v["params"]["update"]["content"]["text"], "12345:");
    }
}

//! The editor's stdio MCP servers, run on the editor's machine (`--mcp local`, the default):
//! the entry the agent sees becomes `{"type":"http","url":"acpd-mcp:TOKEN"}`, which acpd
//! points at a loopback endpoint of its own and tunnels back over this link as
//! `_acpd/mcp/message {server: TOKEN, message}` (answered `{message}`) and
//! `_acpd/mcp/notify {server, message}`. `--mcp remote` leaves the entries as they are (the
//! server starts where the agent runs), `--mcp drop` removes them. http/sse entries pass.
//!
//! `LocalMcp` is owned by the relay loop and awaits nothing: each server is a task owning its
//! child process (started on the first message for it, again after it exited), fed by a
//! bounded channel; answers for the daemon come back to the loop on `replies`. A server that
//! cannot start or exits answers its callers with an error that names it. A session's servers
//! stop when the editor closes or deletes the session, and all of them when the shim ends.

use acpd_protocol::{Method, method};
use std::collections::{HashMap, HashSet};
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// `--mcp`: where the editor's stdio MCP servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// On the editor's machine, tunnelled to the agent through acpd.
    Local,
    /// Where the agent runs (the entry is relayed as the editor sent it).
    Remote,
    /// Nowhere: the agent does not see them.
    Drop,
}

/// By session: the `acpd-mcp:` entries the shim serves for it (a re-attach claims them).
pub type McpClaims = HashMap<String, Value>;

/// Messages queued for one server before its callers wait.
const SERVER_QUEUE: usize = 64;

#[derive(Clone)]
struct Spec {
    name: String,
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

enum ToServer {
    /// A request: answer `daemon_id` (raw JSON id) with the server's response.
    Request {
        daemon_id: String,
        message: Value,
    },
    Notify(Value),
}

/// What the loop does with a daemon message.
pub enum FromDaemon {
    /// Not for the tunnel: relay it.
    Relay,
    /// Handled here; send this to the daemon now, if anything.
    Handled(Option<String>),
}

pub struct LocalMcp {
    policy: Policy,
    next: u64,
    specs: HashMap<String, Spec>,
    running: HashMap<String, (mpsc::Sender<ToServer>, CancellationToken)>,
    /// Tokens of sessions the editor closed: their servers do not start again.
    closed: HashSet<String>,
    by_session: HashMap<String, Vec<String>>,
    /// `session/new` requests (raw id) whose answer names the session of these tokens.
    by_new: HashMap<String, Vec<String>>,
    replies: mpsc::Sender<String>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl LocalMcp {
    pub fn new(
        policy: Policy,
        replies: mpsc::Sender<String>,
        tasks: TaskTracker,
        cancel: CancellationToken,
    ) -> LocalMcp {
        LocalMcp {
            policy,
            next: 0,
            specs: HashMap::new(),
            running: HashMap::new(),
            closed: HashSet::new(),
            by_session: HashMap::new(),
            by_new: HashMap::new(),
            replies,
            tasks,
            cancel,
        }
    }

    /// An editor message; `Some` when its `mcpServers` were rewritten.
    pub fn editor_to_daemon(&mut self, line: &str) -> Option<String> {
        // Prompts (which may be large) and everything else are not parsed here.
        let ours = line.contains("\"mcpServers\"")
            || line.contains(Method::SessionClose.quoted())
            || line.contains(Method::SessionDelete.quoted());
        if self.policy == Policy::Remote || !ours {
            return None;
        }
        let mut v: Value = serde_json::from_str(line).ok()?;
        let method = v.get("method")?.as_str()?.to_owned();
        let sid = v
            .pointer("/params/sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match method.as_str() {
            method::SESSION_CLOSE | method::SESSION_DELETE => {
                for t in sid
                    .and_then(|s| self.by_session.remove(&s))
                    .unwrap_or_default()
                {
                    self.stop(&t);
                    self.closed.insert(t);
                }
                None
            }
            method::SESSION_NEW | method::SESSION_LOAD | method::SESSION_RESUME
                if self.policy != Policy::Remote =>
            {
                let servers = v.pointer_mut("/params/mcpServers")?.as_array_mut()?;
                let stdio = |s: &Value| s.get("command").is_some_and(Value::is_string);
                if !servers.iter().any(stdio) {
                    return None;
                }
                let mut tokens = Vec::new();
                if self.policy == Policy::Drop {
                    servers.retain(|s| !stdio(s));
                } else {
                    for s in servers.iter_mut().filter(|s| stdio(s)) {
                        let token = self.add(s);
                        *s = entry(&s["name"], &token);
                        tokens.push(token);
                    }
                }
                match (sid, v.get("id")) {
                    (Some(sid), _) => {
                        // A load or resume gives the agent this list instead of the last one.
                        for t in self.by_session.insert(sid, tokens).unwrap_or_default() {
                            self.stop(&t);
                            self.closed.insert(t);
                        }
                    }
                    (None, Some(id)) => {
                        self.by_new.insert(id.to_string(), tokens);
                    }
                    _ => {}
                }
                Some(v.to_string())
            }
            _ => None,
        }
    }

    /// The tunnel entries of each open session, as the daemon was given them: what a
    /// re-attach after a daemon restart claims.
    pub fn claims(&self) -> McpClaims {
        self.by_session
            .iter()
            .filter(|(_, tokens)| !tokens.is_empty())
            .map(|(sid, tokens)| {
                let entries = tokens
                    .iter()
                    .filter_map(|t| Some((t, self.specs.get(t)?)))
                    .map(|(t, spec)| entry(&json!(spec.name), t))
                    .collect();
                (sid.clone(), Value::Array(entries))
            })
            .collect()
    }

    /// Records a stdio entry; its token names it on the link.
    fn add(&mut self, s: &Value) -> String {
        self.next += 1;
        let name = s["name"].as_str().unwrap_or("mcp").to_owned();
        let token = format!(
            "{}-{}",
            self.next,
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect()
        };
        let env = s["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect();
        let spec = Spec {
            name,
            command: s["command"].as_str().unwrap_or_default().to_owned(),
            args: strings(&s["args"]),
            env,
        };
        self.specs.insert(token.clone(), spec);
        token
    }

    /// A daemon message: the tunnel's own are handled here.
    pub fn daemon_to_editor(&mut self, text: &str) -> FromDaemon {
        if !self.by_new.is_empty() && !text.contains("\"method\"") {
            self.note_answer(text);
        }
        if !text.contains("\"_acpd/mcp/") {
            return FromDaemon::Relay;
        }
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return FromDaemon::Relay;
        };
        let (Some(method), id) = (v["method"].as_str(), v.get("id").map(Value::to_string)) else {
            return FromDaemon::Relay;
        };
        let server = v
            .pointer("/params/server")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let message = v.pointer("/params/message").cloned().unwrap_or(Value::Null);
        let msg = match (method, id) {
            (method::ACPD_MCP_MESSAGE, Some(daemon_id)) => ToServer::Request { daemon_id, message },
            (method::ACPD_MCP_NOTIFY, None) => ToServer::Notify(message),
            _ => return FromDaemon::Relay,
        };
        FromDaemon::Handled(self.send(server, msg))
    }

    fn note_answer(&mut self, text: &str) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let Some(tokens) = v
            .get("id")
            .and_then(|id| self.by_new.remove(&id.to_string()))
        else {
            return;
        };
        match v.pointer("/result/sessionId").and_then(Value::as_str) {
            Some(sid) => self
                .by_session
                .entry(sid.to_owned())
                .or_default()
                .extend(tokens),
            // No session: nothing will use them.
            None => tokens.iter().for_each(|t| self.closed.extend([t.clone()])),
        }
    }

    /// Hands `msg` to its server's task, starting it when needed; an immediate answer when
    /// the server cannot take it.
    fn send(&mut self, token: &str, msg: ToServer) -> Option<String> {
        let refuse = |msg: ToServer, why: String| match msg {
            ToServer::Request { daemon_id, .. } => Some(error(&daemon_id, &why)),
            ToServer::Notify(_) => None,
        };
        if self.closed.contains(token) {
            return refuse(
                msg,
                format!("MCP server `{token}` belongs to a closed session"),
            );
        }
        let Some(spec) = self.specs.get(token) else {
            return refuse(
                msg,
                format!("no MCP server `{token}` on the editor's machine"),
            );
        };
        let alive = self
            .running
            .get(token)
            .is_some_and(|(tx, _)| !tx.is_closed());
        if !alive {
            let (tx, rx) = mpsc::channel(SERVER_QUEUE);
            let kill = self.cancel.child_token();
            let spec = spec.clone();
            self.tasks
                .spawn(serve(spec, rx, self.replies.clone(), kill.clone()));
            self.running.insert(token.to_owned(), (tx, kill));
        }
        let (tx, _) = &self.running[token];
        match tx.try_send(msg) {
            Ok(()) => None,
            Err(e) => refuse(
                e.into_inner(),
                format!("MCP server `{token}` is busy; try again"),
            ),
        }
    }

    fn stop(&mut self, token: &str) {
        if let Some((_, kill)) = self.running.remove(token) {
            kill.cancel();
        }
    }
}

/// The entry the daemon (and, through it, the agent) sees for a server run here.
fn entry(name: &Value, token: &str) -> Value {
    json!({"type": "http", "name": name, "url": format!("acpd-mcp:{token}"), "headers": []})
}

fn error(daemon_id: &str, why: &str) -> String {
    json!({"jsonrpc": "2.0", "id": serde_json::from_str::<Value>(daemon_id).unwrap_or(Value::Null),
        "error": {"code": -32603, "message": why}})
    .to_string()
}

fn answer(daemon_id: &str, message: Value) -> String {
    json!({"jsonrpc": "2.0", "id": serde_json::from_str::<Value>(daemon_id).unwrap_or(Value::Null),
        "result": {"message": message}})
    .to_string()
}

/// One server: its process, and the requests it has not answered (its id → the daemon's).
async fn serve(
    spec: Spec,
    mut rx: mpsc::Receiver<ToServer>,
    replies: mpsc::Sender<String>,
    kill: CancellationToken,
) {
    let name = spec.name.clone();
    let child = tokio::process::Command::new(&spec.command)
        .args(&spec.args)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let why = format!("MCP server `{name}` could not start on the editor's machine: {e}");
            tracing::warn!("{why}");
            rx.close();
            while let Some(m) = rx.recv().await {
                if let ToServer::Request { daemon_id, .. } = m {
                    let _ = replies.send(error(&daemon_id, &why)).await;
                }
            }
            return;
        }
    };
    tracing::info!(server = %name, pid = child.id(), "started the editor's MCP server");
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return;
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut pending: HashMap<String, String> = HashMap::new();
    let why = loop {
        tokio::select! {
            _ = kill.cancelled() => break format!("MCP server `{name}` was stopped"),
            m = rx.recv() => {
                let Some(m) = m else { break format!("MCP server `{name}` was stopped") };
                if to_server(m, &mut stdin, &mut pending).await.is_err() {
                    break format!("MCP server `{name}` stopped reading its input");
                }
            }
            l = lines.next_line() => {
                let Ok(Some(l)) = l else { break format!("MCP server `{name}` exited") };
                let Ok(v) = serde_json::from_str::<Value>(&l) else { continue };
                from_server(v, &mut pending, &replies, &mut stdin).await;
            }
        }
    };
    tracing::info!(server = %name, "{why}");
    rx.close();
    for (_, daemon_id) in pending.drain() {
        let _ = replies.send(error(&daemon_id, &why)).await;
    }
    while let Ok(m) = rx.try_recv() {
        if let ToServer::Request { daemon_id, .. } = m {
            let _ = replies.send(error(&daemon_id, &why)).await;
        }
    }
    drop(stdin);
    let _ = child.start_kill();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), child.wait()).await;
}

/// A message for the server, written to its stdin (a request's id remembered).
async fn to_server(
    m: ToServer,
    stdin: &mut tokio::process::ChildStdin,
    pending: &mut HashMap<String, String>,
) -> std::io::Result<()> {
    let message = match m {
        ToServer::Request { daemon_id, message } => {
            pending.insert(message["id"].to_string(), daemon_id);
            message
        }
        ToServer::Notify(message) => message,
    };
    let mut line = message.to_string();
    line.push('\n');
    stdin.write_all(line.as_bytes()).await?;
    stdin.flush().await
}

/// A message from the server: an answer goes to the daemon's request it answers; a request
/// of its own is refused.
async fn from_server(
    v: Value,
    pending: &mut HashMap<String, String>,
    replies: &mpsc::Sender<String>,
    stdin: &mut tokio::process::ChildStdin,
) {
    let id = v.get("id").map(Value::to_string);
    match (v.get("method"), id) {
        (None, Some(id)) => {
            if let Some(daemon_id) = pending.remove(&id) {
                let _ = replies.send(answer(&daemon_id, v)).await;
            }
        }
        // The server asks the client (sampling, roots): the tunnel carries no
        // server-initiated requests.
        (Some(_), Some(id)) => {
            let refusal = format!(
                "{}\n",
                json!({"jsonrpc": "2.0", "id": serde_json::from_str::<Value>(&id).unwrap_or(Value::Null),
                    "error": {"code": -32601, "message": "not supported through acpd's MCP tunnel"}})
            );
            let _ = stdin.write_all(refusal.as_bytes()).await;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(policy: Policy) -> (LocalMcp, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel(4);
        let m = LocalMcp::new(policy, tx, TaskTracker::new(), CancellationToken::new());
        (m, rx)
    }

    const NEW: &str = r#"{"jsonrpc":"2.0","id":4,"method":"session/new","params":{"cwd":"/w","mcpServers":[
        {"name":"git","command":"uvx","args":["mcp-server-git"],"env":[{"name":"K","value":"v"}]},
        {"type":"http","name":"web","url":"https://x/mcp","headers":[]}]}}"#;

    #[test]
    fn stdio_servers_become_tunnel_entries_and_http_ones_pass() {
        let (mut m, _rx) = local(Policy::Local);
        let v: Value = serde_json::from_str(&m.editor_to_daemon(NEW).unwrap()).unwrap();
        let s = &v["params"]["mcpServers"];
        assert_eq!(
            s[0],
            json!({"type":"http","name":"git","url":"acpd-mcp:1-git","headers":[]})
        );
        assert_eq!(s[1]["url"], "https://x/mcp");
        let spec = &m.specs["1-git"];
        assert_eq!(
            (spec.command.as_str(), spec.args.as_slice()),
            ("uvx", &["mcp-server-git".to_owned()][..])
        );
        assert_eq!(spec.env, [("K".to_owned(), "v".to_owned())]);
        // The answer binds the tokens to the session; closing it closes them.
        m.daemon_to_editor(r#"{"jsonrpc":"2.0","id":4,"result":{"sessionId":"s1"}}"#);
        assert_eq!(m.by_session["s1"], ["1-git"]);
        // What a re-attach after a daemon restart claims: the entry the daemon was given.
        assert_eq!(m.claims()["s1"], json!([s[0].clone()]));
        m.editor_to_daemon(
            r#"{"jsonrpc":"2.0","id":5,"method":"session/close","params":{"sessionId":"s1"}}"#,
        );
        assert!(m.closed.contains("1-git"));
        let FromDaemon::Handled(Some(e)) = m.daemon_to_editor(
            r#"{"jsonrpc":"2.0","id":9,"method":"_acpd/mcp/message","params":{"server":"1-git","message":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}}"#,
        ) else {
            panic!("not answered")
        };
        assert!(
            e.contains(r#""id":9"#) && e.contains("closed session"),
            "{e}"
        );
    }

    #[test]
    fn drop_and_remote_policies() {
        let (mut m, _rx) = local(Policy::Drop);
        let v: Value = serde_json::from_str(&m.editor_to_daemon(NEW).unwrap()).unwrap();
        assert_eq!(v["params"]["mcpServers"].as_array().unwrap().len(), 1);
        assert_eq!(v["params"]["mcpServers"][0]["name"], "web");
        let (mut m, _rx) = local(Policy::Remote);
        assert_eq!(m.editor_to_daemon(NEW), None);
    }

    #[test]
    fn unknown_servers_and_other_messages() {
        let (mut m, _rx) = local(Policy::Local);
        let FromDaemon::Handled(Some(e)) = m.daemon_to_editor(
            r#"{"jsonrpc":"2.0","id":"x","method":"_acpd/mcp/message","params":{"server":"nope","message":{}}}"#,
        ) else {
            panic!("not answered")
        };
        assert!(e.contains("no MCP server `nope`"), "{e}");
        let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}"#;
        assert!(matches!(m.daemon_to_editor(chunk), FromDaemon::Relay));
    }
}

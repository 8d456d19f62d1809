//! An editor-like ACP client over WebSocket. It answers the agent's requests for real:
//! `fs/*` on the local disk, `terminal/*` by running the command, permission requests from
//! a queue of answers, `_acpd/tool_call` with a canned result. Every wait has a timeout.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;

pub const WAIT: Duration = Duration::from_secs(20);

type Replies = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>>;

/// A terminal the agent created: its output so far and its exit.
struct Term {
    output: Arc<Mutex<String>>,
    /// `Some(exit code)` once the command ended.
    exit: watch::Receiver<Option<Option<i32>>>,
    kill: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct Handled {
    /// (method, params) of every request the agent sent us.
    requests: Vec<(String, Value)>,
    /// Option ids to answer permission requests with; "allow_once" when empty.
    permission: VecDeque<&'static str>,
    /// Don't answer permission requests at all (to cancel while one is pending).
    hold_permission: bool,
    terminals: HashMap<String, Term>,
}

pub struct Editor {
    out: mpsc::UnboundedSender<String>,
    replies: Replies,
    next_id: AtomicU64,
    updates: mpsc::UnboundedReceiver<Value>,
    handled: Arc<Mutex<Handled>>,
    /// Fires whenever the agent sent us a request.
    requested: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
    /// Every `session/update` params seen so far.
    pub seen: Vec<Value>,
}

impl Drop for Editor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Editor {
    /// Connects and initializes with the given client capabilities.
    pub async fn connect(addr: SocketAddr, caps: Value) -> (Editor, Value) {
        let (ws, _) = tokio::time::timeout(
            WAIT,
            tokio_tungstenite::connect_async(format!("ws://{addr}/acp")),
        )
        .await
        .expect("connect in time")
        .expect("websocket connect");
        let (mut sink, mut stream) = ws.split();
        let (out, mut out_rx) = mpsc::unbounded_channel::<String>();
        let (up_tx, updates) = mpsc::unbounded_channel();
        let replies: Replies = Default::default();
        let handled: Arc<Mutex<Handled>> = Default::default();
        let requested = Arc::new(Notify::new());
        let (r2, h2, o2, n2) = (
            replies.clone(),
            handled.clone(),
            out.clone(),
            requested.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    m = out_rx.recv() => match m {
                        Some(t) => { if sink.send(Message::text(t)).await.is_err() { break } }
                        None => break,
                    },
                    f = stream.next() => match f {
                        Some(Ok(Message::Text(t))) => {
                            let v: Value = serde_json::from_str(t.as_str()).expect("json from acpd");
                            on_message(v, &r2, &h2, &o2, &up_tx);
                            n2.notify_waiters();
                        }
                        Some(Ok(_)) => {}
                        _ => break,
                    },
                }
            }
        });
        let mut ed = Editor {
            out,
            replies,
            next_id: AtomicU64::new(1),
            updates,
            handled,
            requested,
            task,
            seen: vec![],
        };
        let init = ed
            .request(
                "initialize",
                json!({ "protocolVersion": 1, "clientCapabilities": caps, "clientInfo": { "name": "test-editor", "version": "1" } }),
            )
            .await
            .expect("initialize");
        (ed, init)
    }

    /// Sends a request; the answer comes on the returned receiver.
    pub fn start(&self, method: &str, params: Value) -> oneshot::Receiver<Result<Value, Value>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.replies.lock().unwrap().insert(id, tx);
        let msg = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let _ = self.out.send(msg.to_string());
        rx
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let rx = self.start(method, params);
        self.finish(rx).await
    }

    /// Waits for an answer, collecting updates meanwhile.
    pub async fn finish(
        &mut self,
        mut rx: oneshot::Receiver<Result<Value, Value>>,
    ) -> Result<Value, Value> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            tokio::select! {
                r = &mut rx => return r.expect("connection alive"),
                Some(u) = self.updates.recv() => self.seen.push(u),
                _ = tokio::time::sleep_until(deadline) => panic!("no answer in time; updates: {:#?}", self.seen),
            }
        }
    }

    pub fn notify(&self, method: &str, params: Value) {
        let msg = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        let _ = self.out.send(msg.to_string());
    }

    /// Waits for a `session/update` whose `update` matches; returns it.
    pub async fn wait_update(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(u) = self.seen.iter().find(|u| pred(&u["update"])) {
            return u["update"].clone();
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, self.updates.recv()).await {
                Ok(Some(u)) => {
                    self.seen.push(u.clone());
                    if pred(&u["update"]) {
                        return u["update"].clone();
                    }
                }
                _ => panic!("no update {what} in time; seen: {:#?}", self.seen),
            }
        }
    }

    /// The updates of one kind seen so far.
    pub fn updates_of(&self, kind: &str) -> Vec<Value> {
        self.seen
            .iter()
            .filter(|u| u["update"]["sessionUpdate"] == kind)
            .map(|u| u["update"].clone())
            .collect()
    }

    pub fn answer_permissions(&self, answers: &[&'static str]) {
        self.handled.lock().unwrap().permission.extend(answers);
    }

    pub fn hold_permissions(&self, hold: bool) {
        self.handled.lock().unwrap().hold_permission = hold;
    }

    /// Methods of the requests the agent sent us, in order.
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.handled.lock().unwrap().requests.clone()
    }

    pub fn request_methods(&self) -> Vec<String> {
        self.requests().into_iter().map(|(m, _)| m).collect()
    }

    /// Waits until the agent has sent us a request for `method` (collecting updates).
    pub async fn wait_request(&mut self, method: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.requested.notified();
            if self.request_methods().iter().any(|m| m == method) {
                return;
            }
            tokio::select! {
                _ = notified => {}
                Some(u) = self.updates.recv() => self.seen.push(u),
                _ = tokio::time::sleep_until(deadline) => {
                    panic!("no {method} request in time; got {:?}", self.request_methods())
                }
            }
        }
    }

    /// New session in `cwd`; returns its id.
    pub async fn new_session(&mut self, cwd: &std::path::Path, extra: Value) -> (String, Value) {
        let mut params = json!({ "cwd": cwd, "mcpServers": [] });
        if let (Some(p), Value::Object(e)) = (params.as_object_mut(), extra) {
            p.extend(e);
        }
        let r = self
            .request("session/new", params)
            .await
            .expect("session/new");
        (r["sessionId"].as_str().expect("sessionId").to_owned(), r)
    }

    pub async fn prompt(&mut self, sid: &str, text: &str) -> Result<Value, Value> {
        self.request(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
        )
        .await
    }

    pub fn start_prompt(&self, sid: &str, text: &str) -> oneshot::Receiver<Result<Value, Value>> {
        self.start(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
        )
    }
}

fn on_message(
    v: Value,
    replies: &Replies,
    handled: &Arc<Mutex<Handled>>,
    out: &mpsc::UnboundedSender<String>,
    updates: &mpsc::UnboundedSender<Value>,
) {
    let method = v.get("method").and_then(Value::as_str).map(str::to_owned);
    match (method, v.get("id").cloned()) {
        (None, Some(id)) => {
            let Some(id) = id.as_u64() else { return };
            if let Some(tx) = replies.lock().unwrap().remove(&id) {
                let r = match v.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(v["result"].clone()),
                };
                let _ = tx.send(r);
            }
        }
        (Some(m), None) => {
            if m == "session/update" {
                let _ = updates.send(v["params"].clone());
            }
        }
        (Some(m), Some(id)) => {
            let params = v["params"].clone();
            handled
                .lock()
                .unwrap()
                .requests
                .push((m.clone(), params.clone()));
            let handled = handled.clone();
            let out = out.clone();
            tokio::spawn(async move {
                let Some(result) = handle(&m, &params, &handled).await else {
                    return;
                };
                let msg = match result {
                    Ok(r) => json!({ "jsonrpc": "2.0", "id": id, "result": r }),
                    Err(e) => {
                        json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32603, "message": e } })
                    }
                };
                let _ = out.send(msg.to_string());
            });
        }
        (None, None) => {}
    }
}

/// Answers one agent request; `None` leaves it unanswered.
async fn handle(
    m: &str,
    p: &Value,
    handled: &Arc<Mutex<Handled>>,
) -> Option<Result<Value, String>> {
    let s = |k: &str| {
        p.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Some(match m {
        "fs/read_text_file" => std::fs::read_to_string(s("path"))
            .map(|c| json!({ "content": c }))
            .map_err(|e| e.to_string()),
        "fs/write_text_file" => std::fs::write(s("path"), s("content"))
            .map(|_| json!({}))
            .map_err(|e| e.to_string()),
        // A form is filled in with "blue" for each of its fields.
        "elicitation/create" => {
            let fields = p
                .pointer("/requestedSchema/properties")
                .and_then(Value::as_object);
            let content: serde_json::Map<String, Value> = fields
                .into_iter()
                .flatten()
                .map(|(k, _)| (k.clone(), json!("blue")))
                .collect();
            Ok(json!({ "action": "accept", "content": content }))
        }
        "session/request_permission" => {
            let answer = {
                let mut h = handled.lock().unwrap();
                if h.hold_permission {
                    return None;
                }
                h.permission.pop_front().unwrap_or("allow_once")
            };
            Ok(json!({ "outcome": { "outcome": "selected", "optionId": answer } }))
        }
        "terminal/create" => {
            let mut cmd = tokio::process::Command::new(s("command"));
            cmd.args(
                p["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str),
            )
            .current_dir(s("cwd"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return Some(Err(e.to_string())),
            };
            let id = format!("term-{}", uuid::Uuid::new_v4().simple());
            let output = Arc::new(Mutex::new(String::new()));
            let (exit_tx, exit) = watch::channel(None);
            let (kill_tx, kill_rx) = oneshot::channel::<()>();
            let o2 = output.clone();
            tokio::spawn(async move {
                let mut stdout = child.stdout.take();
                let mut buf = String::new();
                let read = async {
                    if let Some(s) = stdout.as_mut() {
                        let _ = s.read_to_string(&mut buf).await;
                    }
                };
                tokio::select! {
                    _ = read => { o2.lock().unwrap().push_str(&buf); }
                    _ = kill_rx => { let _ = child.start_kill(); }
                }
                let code = child.wait().await.ok().and_then(|s| s.code());
                let _ = exit_tx.send(Some(code));
            });
            handled.lock().unwrap().terminals.insert(
                id.clone(),
                Term {
                    output,
                    exit,
                    kill: Some(kill_tx),
                },
            );
            Ok(json!({ "terminalId": id }))
        }
        "terminal/wait_for_exit" | "terminal/output" | "terminal/kill" | "terminal/release" => {
            let tid = s("terminalId");
            let (output, exit, kill) = {
                let mut h = handled.lock().unwrap();
                let Some(t) = h.terminals.get_mut(&tid) else {
                    return Some(Err("no such terminal".into()));
                };
                let kill = if m == "terminal/kill" || m == "terminal/release" {
                    t.kill.take()
                } else {
                    None
                };
                (t.output.clone(), t.exit.clone(), kill)
            };
            if let Some(k) = kill {
                let _ = k.send(());
            }
            match m {
                "terminal/wait_for_exit" => {
                    let mut exit = exit;
                    let code = match exit.wait_for(Option::is_some).await {
                        Ok(c) => c.flatten(),
                        Err(_) => None,
                    };
                    Ok(json!({ "exitCode": code }))
                }
                "terminal/output" => {
                    let text = output.lock().unwrap().clone();
                    let mut r = json!({ "output": text, "truncated": false });
                    if let Some(c) = *exit.borrow() {
                        r["exitStatus"] = json!({ "exitCode": c });
                    }
                    Ok(r)
                }
                _ => Ok(json!({})),
            }
        }
        "_acpd/tool_call" => {
            Ok(json!({ "content": format!("client tool {} ran with {}", s("name"), p["input"]) }))
        }
        other => Err(format!("unexpected request {other}")),
    })
}

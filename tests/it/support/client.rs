//! A JSON-RPC test client that behaves like a small editor: it answers the agent's requests
//! while it waits for anything, buffers notifications, and gives tests both a typed API
//! (`request`, `prompt`, ...) and raw access (`send_text`, `recv_json`) for bad-input tests.
//!
//! Every wait has a deadline; running past it panics with what was awaited.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::http;

use super::conn::{Conn, Frame};
use super::editor::{Editor, Handled};
use super::{DEFAULT_TIMEOUT, chunk_text, kind, session_update_params};

/// A JSON-RPC error object received from the peer.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)?;
        if let Some(data) = &self.data {
            write!(f, " ({data})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RpcError {}

impl RpcError {
    fn from_json(err: &Value) -> RpcError {
        RpcError {
            code: err["code"].as_i64().unwrap_or(i64::MIN),
            message: err["message"].as_str().unwrap_or_default().to_string(),
            data: err.get("data").cloned(),
        }
    }
}

/// The client capabilities of a full editor (Zed's set).
pub fn editor_capabilities() -> Value {
    json!({
        "fs": { "readTextFile": true, "writeTextFile": true },
        "terminal": true,
        "auth": { "terminal": true },
    })
}

pub struct Client {
    conn: Conn,
    next_id: i64,
    /// Deadline of every single wait.
    pub timeout: Duration,
    /// Notifications received and not yet consumed, in arrival order.
    inbox: VecDeque<Value>,
    /// Responses received for requests nobody is waiting for yet, by id (as JSON text).
    responses: HashMap<String, Value>,
    pub editor: Editor,
    /// Every agent→client request received, in order (answered or held).
    pub received_requests: Vec<Value>,
    /// Requests the editor was told to hold, not answered yet.
    held: VecDeque<Value>,
    /// The HTTP response of the WebSocket upgrade (WebSocket clients only).
    pub handshake: Option<http::Response<Option<Vec<u8>>>>,
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Client {
    pub fn new(conn: Conn) -> Client {
        Client {
            conn,
            next_id: 1,
            timeout: DEFAULT_TIMEOUT,
            inbox: VecDeque::new(),
            responses: HashMap::new(),
            editor: Editor::default(),
            received_requests: Vec::new(),
            held: VecDeque::new(),
            handshake: None,
        }
    }

    /// Opens a WebSocket to `url` (e.g. `ws://127.0.0.1:PORT/acp`).
    pub async fn connect_ws(url: &str) -> Result<Client> {
        let (ws, response) =
            tokio::time::timeout(DEFAULT_TIMEOUT, tokio_tungstenite::connect_async(url))
                .await
                .with_context(|| format!("timed out connecting to {url}"))?
                .with_context(|| format!("websocket connect to {url}"))?;
        let mut client = Client::new(Conn::ws(ws));
        client.handshake = Some(response);
        Ok(client)
    }

    /// Opens a newline-delimited JSON-RPC connection over raw TCP.
    pub async fn connect_tcp(addr: std::net::SocketAddr) -> Result<Client> {
        let stream = tokio::time::timeout(DEFAULT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .with_context(|| format!("timed out connecting to {addr}"))?
            .with_context(|| format!("tcp connect to {addr}"))?;
        let (r, w) = stream.into_split();
        Ok(Client::new(Conn::lines(r, w)))
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    // ----- sending -----

    /// Sends one text message (WebSocket frame or line). A peer that stops reading makes a
    /// send block: that, too, runs into the deadline.
    pub async fn send_text(&mut self, text: &str) {
        match tokio::time::timeout(self.timeout, self.conn.send_text(text)).await {
            Ok(sent) => sent.expect("send a text message"),
            Err(_) => panic!("timed out after {:?} sending a message", self.timeout),
        }
    }

    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        match tokio::time::timeout(self.timeout, self.conn.send_binary(bytes)).await {
            Ok(sent) => sent.expect("send a binary frame"),
            Err(_) => panic!("timed out after {:?} sending a binary frame", self.timeout),
        }
    }

    pub async fn send_json(&mut self, msg: &Value) {
        self.send_text(&msg.to_string()).await;
    }

    /// Sends a request without waiting; returns its id for `wait_response`.
    pub async fn send_request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.send_json(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await;
        id
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        self.send_json(&json!({ "jsonrpc": "2.0", "method": method, "params": params }))
            .await;
    }

    /// Answers a request the editor held.
    pub async fn respond(&mut self, id: &Value, result: Result<Value, RpcError>) {
        let msg = match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(e) => json!({
                "jsonrpc": "2.0", "id": id,
                "error": { "code": e.code, "message": e.message, "data": e.data },
            }),
        };
        self.send_json(&msg).await;
    }

    /// Closes politely; best effort, so a peer that does not answer the close just times out.
    pub async fn close(&mut self) {
        let _ = tokio::time::timeout(self.timeout, self.conn.close()).await;
    }

    // ----- receiving -----

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Reads one raw frame, bypassing all buffering and request handling.
    async fn read_frame(&mut self, deadline: Instant, what: &str) -> Frame {
        match tokio::time::timeout_at(deadline, self.conn.recv()).await {
            Ok(frame) => frame
                .unwrap_or_else(|e| panic!("connection failed while waiting for {what}: {e:#}")),
            Err(_) => panic!("timed out after {:?} waiting for {what}", self.timeout),
        }
    }

    /// Reads and files one incoming message: answers (or holds) agent requests, buffers
    /// notifications and responses.
    async fn pump(&mut self, deadline: Instant, what: &str) {
        let text = match self.read_frame(deadline, what).await {
            Frame::Text(text) => text,
            Frame::Binary => return,
            Frame::Closed => panic!("connection closed while waiting for {what}"),
        };
        let msg: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("peer sent invalid JSON ({e}) while waiting for {what}: {text}")
        });
        self.file(msg).await;
    }

    async fn file(&mut self, msg: Value) {
        let has_id = msg.get("id").is_some();
        match (msg.get("method").and_then(Value::as_str), has_id) {
            (Some(method), true) => {
                let method = method.to_string();
                self.received_requests.push(msg.clone());
                let params = msg.get("params").cloned().unwrap_or(Value::Null);
                match self.editor.handle(&method, &params).await {
                    Handled::Answer(result) => self.respond(&msg["id"], result).await,
                    Handled::Hold => self.held.push_back(msg),
                }
            }
            (Some(_), false) => self.inbox.push_back(msg),
            (None, true) => {
                self.responses.insert(id_key(&msg["id"]), msg);
            }
            (None, false) => panic!(
                "peer sent a message that is neither request, response nor notification: {msg}"
            ),
        }
    }

    /// Reads and discards everything until the connection ends (a close frame, EOF or a
    /// reset). The caller bounds the wait.
    pub async fn wait_closed(&mut self) {
        loop {
            match self.conn.recv().await {
                Ok(Frame::Closed) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Next incoming message of any kind, raw: nothing is answered or buffered. For bad-input
    /// tests where nothing else is in flight.
    pub async fn recv_json(&mut self) -> Value {
        let deadline = self.deadline();
        loop {
            match self.read_frame(deadline, "a message").await {
                Frame::Text(text) => {
                    return serde_json::from_str(&text)
                        .unwrap_or_else(|e| panic!("invalid JSON from peer ({e}): {text}"));
                }
                Frame::Binary => continue,
                Frame::Closed => panic!("connection closed while waiting for a message"),
            }
        }
    }

    /// Waits for the response to `id`, serving the agent meanwhile.
    pub async fn wait_response(&mut self, id: &Value) -> Result<Value, RpcError> {
        let deadline = self.deadline();
        let key = id_key(id);
        loop {
            if let Some(msg) = self.responses.remove(&key) {
                return match msg.get("error") {
                    Some(err) => Err(RpcError::from_json(err)),
                    None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                };
            }
            self.pump(deadline, &format!("the response to request {key}"))
                .await;
        }
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.send_request(method, params).await;
        self.wait_response(&id).await
    }

    /// Next notification (any method), in arrival order.
    pub async fn next_notification(&mut self) -> Value {
        let deadline = self.deadline();
        loop {
            if let Some(msg) = self.inbox.pop_front() {
                return msg;
            }
            self.pump(deadline, "a notification").await;
        }
    }

    /// First notification matching `pred`; the others stay buffered in order.
    pub async fn next_notification_where(
        &mut self,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = self.deadline();
        loop {
            if let Some(pos) = self.inbox.iter().position(&pred) {
                return self.inbox.remove(pos).expect("position is in range");
            }
            self.pump(deadline, what).await;
        }
    }

    /// Whether a notification received and not yet taken matches `pred` (no waiting).
    pub fn has_buffered(&self, pred: impl Fn(&Value) -> bool) -> bool {
        self.inbox.iter().any(pred)
    }

    /// Params of the next `session/update` (other notifications stay buffered).
    pub async fn next_update(&mut self) -> Value {
        let msg = self
            .next_notification_where("a session/update", |m| m["method"] == "session/update")
            .await;
        msg["params"].clone()
    }

    /// Takes the buffered `session/update` params (without waiting).
    pub fn take_buffered_updates(&mut self) -> Vec<Value> {
        let mut updates = Vec::new();
        self.inbox.retain(|m| match session_update_params(m) {
            Some(p) => {
                updates.push(p.clone());
                false
            }
            None => true,
        });
        updates
    }

    /// Collects `session/update` params (already buffered ones first) until the response to
    /// `id` arrives. Updates that arrive after the response are left for later.
    pub async fn collect_updates_until_response(
        &mut self,
        id: &Value,
    ) -> (Vec<Value>, Result<Value, RpcError>) {
        let deadline = self.deadline();
        let key = id_key(id);
        let mut updates = self.take_buffered_updates();
        loop {
            if self.responses.contains_key(&key) {
                let result = self.wait_response(id).await;
                return (updates, result);
            }
            self.pump(
                deadline,
                &format!("updates and the response to request {key}"),
            )
            .await;
            updates.extend(self.take_buffered_updates());
        }
    }

    /// Collects `session/update` params until `done` returns true for the collected list.
    pub async fn collect_updates_until(
        &mut self,
        what: &str,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = self.deadline();
        let mut updates = self.take_buffered_updates();
        while !done(&updates) {
            self.pump(deadline, what).await;
            updates.extend(self.take_buffered_updates());
        }
        updates
    }

    /// Waits until the editor holds a request of `method`; returns it (and forgets it: the
    /// test answers with `respond` or never).
    pub async fn wait_held_request(&mut self, method: &str) -> Value {
        let deadline = self.deadline();
        loop {
            if let Some(pos) = self.held.iter().position(|r| r["method"] == method) {
                return self.held.remove(pos).expect("position is in range");
            }
            self.pump(deadline, &format!("an agent request {method}"))
                .await;
        }
    }

    // ----- ACP conveniences -----

    /// `initialize` with the capabilities of a full editor.
    pub async fn initialize(&mut self) -> Value {
        self.request(
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": editor_capabilities(),
                "clientInfo": { "name": "acpd-tests", "version": "0.0.0" },
            }),
        )
        .await
        .expect("initialize")
    }

    /// `session/new` in `cwd`; returns the whole result.
    pub async fn new_session_result(&mut self, cwd: &std::path::Path) -> Value {
        self.request("session/new", json!({ "cwd": cwd, "mcpServers": [] }))
            .await
            .expect("session/new")
    }

    pub async fn new_session(&mut self, cwd: &std::path::Path) -> String {
        let result = self.new_session_result(cwd).await;
        result["sessionId"]
            .as_str()
            .expect("session/new returns a sessionId")
            .to_string()
    }

    /// `session/new`, then waits for the agent's `available_commands_update` (acpd sends it
    /// after the response), so that a following prompt collects only its own turn.
    pub async fn open_session(&mut self, cwd: &std::path::Path) -> String {
        let sid = self.new_session(cwd).await;
        let what = format!("the available_commands_update of new session {sid}");
        self.next_notification_where(&what, |m| {
            m["method"] == "session/update"
                && m["params"]["sessionId"] == sid.as_str()
                && m["params"]["update"]["sessionUpdate"] == "available_commands_update"
        })
        .await;
        sid
    }

    /// Collects `session/update` params until one is an `agent_message_chunk` with exactly
    /// `text` (all buffered updates are taken, so some may follow it).
    pub async fn updates_until_text(&mut self, text: &str) -> Vec<Value> {
        let what = format!("an agent_message_chunk {text:?}");
        self.collect_updates_until(&what, |updates| {
            updates
                .iter()
                .any(|u| kind(u) == "agent_message_chunk" && chunk_text(u) == Some(text))
        })
        .await
    }

    /// `session/list` with optional `cwd` and `cursor`.
    pub async fn list(
        &mut self,
        cwd: Option<&std::path::Path>,
        cursor: Option<&str>,
    ) -> Result<Value, RpcError> {
        let mut params = json!({});
        if let Some(cwd) = cwd {
            params["cwd"] = json!(cwd);
        }
        if let Some(cursor) = cursor {
            params["cursor"] = json!(cursor);
        }
        self.request("session/list", params).await
    }

    /// Sends a prompt (one text block) and collects the turn's updates and the response.
    pub async fn prompt(
        &mut self,
        session_id: &str,
        script: &str,
    ) -> (Vec<Value>, Result<Value, RpcError>) {
        let id = self.send_prompt(session_id, script).await;
        self.collect_updates_until_response(&id).await
    }

    /// Sends a prompt without waiting; returns the request id.
    pub async fn send_prompt(&mut self, session_id: &str, script: &str) -> Value {
        let params =
            json!({ "sessionId": session_id, "prompt": [{ "type": "text", "text": script }] });
        self.send_request("session/prompt", params).await
    }

    /// `_acpd/session/attach` after `after_seq`: every journaled update after it, one per seq
    /// (a `session/load` merges each message's chunks), and the response.
    pub async fn attach_after(
        &mut self,
        session_id: &str,
        after_seq: i64,
    ) -> (Vec<Value>, Result<Value, RpcError>) {
        let params = json!({ "sessionId": session_id, "afterSeq": after_seq });
        let id = self.send_request("_acpd/session/attach", params).await;
        self.collect_updates_until_response(&id).await
    }

    /// `session/load`: the updates replayed before the response, and the response.
    pub async fn load(
        &mut self,
        session_id: &str,
        cwd: &std::path::Path,
    ) -> (Vec<Value>, Result<Value, RpcError>) {
        let params = json!({ "sessionId": session_id, "cwd": cwd, "mcpServers": [] });
        let id = self.send_request("session/load", params).await;
        self.collect_updates_until_response(&id).await
    }
}

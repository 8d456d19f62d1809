//! Agent→client requests and the rest of a session over Streamable HTTP (issue 16): the
//! permission, fs and terminal requests come on the session's SSE stream and their answers
//! go back as POSTs; cancel, list and load through POST + SSE.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::streamable_http::{SSE, rpc};
use crate::support::client::editor_capabilities;
use crate::support::editor::{Editor, Handled};
use crate::support::http::{Sse, SseEvent, post};
use crate::support::{Daemon, agent_texts, session_update_params};

/// An HTTP connection whose `initialize` offers what the test editor can do (fs, terminal).
struct Http {
    addr: SocketAddr,
    conn: String,
    main: Sse,
}

impl Http {
    async fn open(daemon: &Daemon) -> Http {
        let addr = daemon.addr;
        let init = rpc(
            1,
            "initialize",
            json!({
                "protocolVersion": 1,
                "clientCapabilities": editor_capabilities(),
                "clientInfo": { "name": "acpd-http-tests", "version": "0.0.0" },
            }),
        );
        let r = post(addr, &[], &init).await;
        assert_eq!(r.status, 200, "{r:?}");
        let conn = r.header("acp-connection-id").unwrap().to_owned();
        let main = Sse::open(addr, &[("acp-connection-id", &conn), SSE]).await;
        Http { addr, conn, main }
    }

    async fn post(&self, sid: Option<&str>, msg: &Value) {
        let mut h = vec![("acp-connection-id", self.conn.as_str())];
        h.extend(sid.map(|s| ("acp-session-id", s)));
        let r = post(self.addr, &h, msg).await;
        assert_eq!(r.status, 202, "{r:?}");
    }

    /// A request on the connection; its answer from the connection stream.
    async fn call(&mut self, id: i64, method: &str, params: Value) -> Vec<SseEvent> {
        self.post(None, &rpc(id, method, params)).await;
        self.main.until_answer(id).await
    }

    async fn new_session(&mut self, daemon: &Daemon) -> (String, Sse) {
        let params = json!({ "cwd": daemon.work_dir(), "mcpServers": [] });
        let answer = self.call(2, "session/new", params).await.pop().unwrap();
        let sid = answer.data["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_owned();
        let h = [
            ("acp-connection-id", self.conn.as_str()),
            ("acp-session-id", sid.as_str()),
            SSE,
        ];
        let stream = Sse::open(self.addr, &h).await;
        (sid, stream)
    }

    /// A prompt on the session's stream, the agent's requests answered by `editor` (by POST);
    /// returns the events and the agent requests seen.
    async fn turn(
        &self,
        stream: &mut Sse,
        sid: &str,
        id: i64,
        text: &str,
        editor: &mut Editor,
    ) -> (Vec<SseEvent>, Vec<Value>) {
        let prompt = rpc(
            id,
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
        );
        self.post(Some(sid), &prompt).await;
        let mut requests = Vec::new();
        let mut events = Vec::new();
        loop {
            let e = stream.next().await.expect("the stream ended early");
            let method = e.data["method"].as_str().map(str::to_owned);
            if let (Some(method), Some(rid)) = (method, e.data.get("id")) {
                let Handled::Answer(result) = editor.handle(&method, &e.data["params"]).await
                else {
                    panic!("nothing held in these tests");
                };
                let answer = match result {
                    Ok(r) => json!({ "jsonrpc": "2.0", "id": rid, "result": r }),
                    Err(err) => json!({ "jsonrpc": "2.0", "id": rid,
                        "error": { "code": err.code, "message": err.message } }),
                };
                self.post(Some(sid), &answer).await;
                requests.push(e.data.clone());
                continue;
            }
            let done = e.data.get("method").is_none() && e.data["id"] == id;
            events.push(e);
            if done {
                return (events, requests);
            }
        }
    }
}

fn texts(events: &[SseEvent]) -> Vec<String> {
    let updates: Vec<Value> = events
        .iter()
        .filter_map(|e| session_update_params(&e.data).cloned())
        .collect();
    agent_texts(&updates)
}

#[tokio::test]
async fn permission_fs_and_terminal_requests_are_answered_by_post() {
    let daemon = Daemon::start().await;
    let mut http = Http::open(&daemon).await;
    let (sid, mut stream) = http.new_session(&daemon).await;
    let mut editor = Editor::default();
    let input = daemon.work_dir().join("notes.txt");
    std::fs::write(&input, "remember the milk").unwrap();
    let output = daemon.work_dir().join("out.txt");
    let script = format!(
        "permission\nread {}\nwrite {} written over http\nterminal echo from the editor",
        input.display(),
        output.display()
    );
    let (events, requests) = http.turn(&mut stream, &sid, 3, &script, &mut editor).await;
    assert_eq!(
        events.last().unwrap().data["result"]["stopReason"],
        "end_turn"
    );
    assert_eq!(
        texts(&events),
        [
            "permission: selected allow-once".to_string(),
            "read: remember the milk".to_string(),
            format!("wrote: {}", output.display()),
            "terminal: exit 0 output from the editor\n".to_string(),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        "written over http"
    );
    let methods: Vec<&str> = requests
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        [
            "session/request_permission",
            "fs/read_text_file",
            "fs/write_text_file",
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    // On the session's stream, with acpd's session id.
    assert!(
        requests
            .iter()
            .all(|r| r["params"]["sessionId"] == sid.as_str())
    );
}

#[tokio::test]
async fn cancel_list_and_load_over_post() {
    let daemon = Daemon::start().await;
    let mut http = Http::open(&daemon).await;
    let (sid, mut stream) = http.new_session(&daemon).await;
    let mut editor = Editor::default();
    let (events, _) = http
        .turn(&mut stream, &sid, 3, "echo before", &mut editor)
        .await;
    assert_eq!(texts(&events), ["before"]);

    // Cancel: a notification POST; the turn answers `cancelled`.
    let prompt = rpc(
        4,
        "session/prompt",
        json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": "wait_for_cancel; echo never" }] }),
    );
    http.post(Some(&sid), &prompt).await;
    let cancel =
        json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": sid } });
    http.post(Some(&sid), &cancel).await;
    let events = stream.until_answer(4).await;
    assert_eq!(
        events.last().unwrap().data["result"]["stopReason"],
        "cancelled",
        "{events:?}"
    );
    assert!(!texts(&events).contains(&"never".to_string()), "{events:?}");

    // List: on the connection stream.
    let answer = http.call(5, "session/list", json!({})).await.pop().unwrap();
    let sessions = answer.data["result"]["sessions"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        sessions.iter().any(|s| s["sessionId"] == sid.as_str()),
        "{answer:?}"
    );

    // Load on another connection: the history replayed, then the answer.
    let mut other = Http::open(&daemon).await;
    let params = json!({ "sessionId": sid, "cwd": daemon.work_dir(), "mcpServers": [] });
    let events = other.call(6, "session/load", params).await;
    let answer = events.last().unwrap();
    assert!(answer.data["result"].is_object(), "{answer:?}");
    assert_eq!(texts(&events), ["before"], "{events:?}");
}

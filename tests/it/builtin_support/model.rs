//! A scripted model server: real HTTP with SSE streaming, speaking both the Anthropic
//! Messages API (`POST /v1/messages`) and OpenAI Chat Completions (`POST
//! /v1/chat/completions`). Each request takes the next scripted reply, rendered in the
//! format of the endpoint it hit, and is recorded so tests can assert what the agent sent
//! (the transcript, the tools it offered, the model name).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// One piece of a scripted answer.
#[derive(Debug, Clone)]
pub enum Ev {
    Text(String),
    Thinking(String),
    Tool {
        name: String,
        input: Value,
    },
    /// Waits before the next piece.
    Pause(u64),
    /// Never finishes: the stream stays open until the client goes away.
    Hang,
    /// Starts an event and never ends its line: data until the client goes away.
    Endless,
    /// Overrides the finish reason (Anthropic names: end_turn, tool_use, max_tokens, refusal).
    Finish(&'static str),
}

pub fn text(s: &str) -> Ev {
    Ev::Text(s.into())
}

pub fn tool(name: &str, input: Value) -> Ev {
    Ev::Tool {
        name: name.into(),
        input,
    }
}

#[derive(Debug, Clone)]
pub enum Reply {
    Stream(Vec<Ev>),
    Status(u16, &'static str),
    /// Never answers, not even the status line (until the client goes away).
    Silent,
}

#[derive(Debug, Clone)]
pub struct Recorded {
    /// "anthropic" or "openai".
    pub api: &'static str,
    pub body: Value,
    pub auth: Option<String>,
}

impl Recorded {
    /// The names of the tools offered.
    pub fn tool_names(&self) -> Vec<String> {
        let tools = self.body["tools"].as_array().cloned().unwrap_or_default();
        tools
            .iter()
            .filter_map(|t| {
                t.get("name")
                    .or_else(|| t.pointer("/function/name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Everything in the request, as text: for "does the model see X" assertions.
    pub fn text(&self) -> String {
        self.body.to_string()
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    seen: Vec<Recorded>,
}

#[derive(Clone, Default)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    arrived: Arc<Notify>,
}

pub struct ModelServer {
    pub addr: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelServer {
    pub async fn start() -> ModelServer {
        let shared = Shared::default();
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the model server");
        let addr = listener.local_addr().expect("model server address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ModelServer { addr, shared, task }
    }

    pub fn push(&self, reply: Reply) {
        self.shared.inner.lock().unwrap().script.push_back(reply);
    }

    pub fn push_stream(&self, evs: Vec<Ev>) {
        self.push(Reply::Stream(evs));
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.inner.lock().unwrap().seen.clone()
    }

    /// Waits until `n` requests have arrived; returns them.
    pub async fn wait_requests(&self, n: usize) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.shared.arrived.notified();
            let seen = self.requests();
            if seen.len() >= n {
                return seen;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("expected {n} model requests, got {}: {seen:#?}", seen.len());
            }
        }
    }
}

fn record(shared: &Shared, api: &'static str, headers: &HeaderMap, body: &str) -> Reply {
    let auth = headers
        .get("x-api-key")
        .or_else(|| headers.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let reply = {
        let mut inner = shared.inner.lock().unwrap();
        inner.seen.push(Recorded { api, body, auth });
        inner
            .script
            .pop_front()
            .unwrap_or(Reply::Status(500, "the script is exhausted"))
    };
    shared.arrived.notify_waiters();
    reply
}

async fn anthropic(State(shared): State<Shared>, headers: HeaderMap, body: String) -> Response {
    match record(&shared, "anthropic", &headers, &body) {
        Reply::Status(code, msg) => error(code, msg),
        Reply::Silent => std::future::pending().await,
        Reply::Stream(evs) => sse(move |tx| anthropic_events(evs, tx)),
    }
}

async fn openai(State(shared): State<Shared>, headers: HeaderMap, body: String) -> Response {
    match record(&shared, "openai", &headers, &body) {
        Reply::Status(code, msg) => error(code, msg),
        Reply::Silent => std::future::pending().await,
        Reply::Stream(evs) => sse(move |tx| openai_events(evs, tx)),
    }
}

fn error(code: u16, msg: &str) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({ "type": "error", "error": { "type": "test", "message": msg } });
    (status, body.to_string()).into_response()
}

type Tx = mpsc::Sender<String>;

/// Streams what `produce` sends as the SSE body.
fn sse<F, Fut>(produce: F) -> Response
where
    F: FnOnce(Tx) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<String>(16);
    tokio::spawn(produce(tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("sse response")
}

/// Sends a chunk; false when the client is gone.
async fn send(tx: &Tx, s: String) -> bool {
    tx.send(s).await.is_ok()
}

/// Sends `start`, then 64 KiB chunks without a line end until the client is gone.
async fn endless(tx: &Tx, start: &str) {
    let chunk = "x".repeat(64 * 1024);
    let mut ok = send(tx, start.to_owned()).await;
    while ok {
        ok = send(tx, chunk.clone()).await;
    }
}

/// Splits text in two so the client sees several deltas.
fn halves(s: &str) -> Vec<String> {
    let mid = s
        .char_indices()
        .nth(s.chars().count() / 2)
        .map(|(i, _)| i)
        .unwrap_or(0);
    let (a, b) = s.split_at(mid);
    [a, b]
        .into_iter()
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn anthropic_events(evs: Vec<Ev>, tx: Tx) {
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut stop = if evs.iter().any(|e| matches!(e, Ev::Tool { .. })) {
        "tool_use"
    } else {
        "end_turn"
    };
    if !send(&tx, ev("message_start", json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"test","usage":{"input_tokens":100,"output_tokens":1}}}))).await {
        return;
    }
    let mut index = 0;
    let mut tool_no = 0;
    for e in evs {
        let ok = match e {
            Ev::Text(t) => {
                let mut ok = send(&tx, ev("content_block_start", json!({"type":"content_block_start","index":index,"content_block":{"type":"text","text":""}}))).await;
                for h in halves(&t) {
                    ok &= send(&tx, ev("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"text_delta","text":h}}))).await;
                }
                ok &= send(
                    &tx,
                    ev(
                        "content_block_stop",
                        json!({"type":"content_block_stop","index":index}),
                    ),
                )
                .await;
                index += 1;
                ok
            }
            Ev::Thinking(t) => {
                let mut ok = send(&tx, ev("content_block_start", json!({"type":"content_block_start","index":index,"content_block":{"type":"thinking","thinking":""}}))).await;
                ok &= send(&tx, ev("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"thinking_delta","thinking":t}}))).await;
                ok &= send(&tx, ev("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"signature_delta","signature":"sig-1"}}))).await;
                ok &= send(
                    &tx,
                    ev(
                        "content_block_stop",
                        json!({"type":"content_block_stop","index":index}),
                    ),
                )
                .await;
                index += 1;
                ok
            }
            Ev::Tool { name, input } => {
                tool_no += 1;
                let id = format!("toolu_{tool_no}_{}", uuid::Uuid::new_v4().simple());
                let mut ok = send(&tx, ev("content_block_start", json!({"type":"content_block_start","index":index,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}))).await;
                for h in halves(&input.to_string()) {
                    ok &= send(&tx, ev("content_block_delta", json!({"type":"content_block_delta","index":index,"delta":{"type":"input_json_delta","partial_json":h}}))).await;
                }
                ok &= send(
                    &tx,
                    ev(
                        "content_block_stop",
                        json!({"type":"content_block_stop","index":index}),
                    ),
                )
                .await;
                index += 1;
                ok
            }
            Ev::Pause(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                true
            }
            Ev::Hang => {
                tx.closed().await;
                return;
            }
            Ev::Endless => {
                endless(&tx, "event: content_block_delta\ndata: ").await;
                return;
            }
            Ev::Finish(f) => {
                stop = f;
                true
            }
        };
        if !ok {
            return;
        }
    }
    let _ = send(&tx, ev("message_delta", json!({"type":"message_delta","delta":{"stop_reason":stop},"usage":{"output_tokens":20}}))).await;
    let _ = send(&tx, ev("message_stop", json!({"type":"message_stop"}))).await;
}

async fn openai_events(evs: Vec<Ev>, tx: Tx) {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id":"c1","object":"chat.completion.chunk","model":"test","choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
        )
    };
    let mut finish = if evs.iter().any(|e| matches!(e, Ev::Tool { .. })) {
        "tool_calls"
    } else {
        "stop"
    };
    let mut tool_no = 0;
    for e in evs {
        let ok = match e {
            Ev::Text(t) => {
                let mut ok = true;
                for h in halves(&t) {
                    ok &= send(
                        &tx,
                        chunk(json!({"role":"assistant","content":h}), Value::Null),
                    )
                    .await;
                }
                ok
            }
            Ev::Thinking(t) => send(&tx, chunk(json!({"reasoning_content":t}), Value::Null)).await,
            Ev::Tool { name, input } => {
                let id = format!("call_{tool_no}_{}", uuid::Uuid::new_v4().simple());
                let mut ok = send(&tx, chunk(json!({"tool_calls":[{"index":tool_no,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}), Value::Null)).await;
                for h in halves(&input.to_string()) {
                    ok &= send(
                        &tx,
                        chunk(
                            json!({"tool_calls":[{"index":tool_no,"function":{"arguments":h}}]}),
                            Value::Null,
                        ),
                    )
                    .await;
                }
                tool_no += 1;
                ok
            }
            Ev::Pause(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                true
            }
            Ev::Hang => {
                tx.closed().await;
                return;
            }
            Ev::Endless => {
                endless(&tx, "data: ").await;
                return;
            }
            Ev::Finish(f) => {
                finish = match f {
                    "max_tokens" => "length",
                    "refusal" => "content_filter",
                    "tool_use" => "tool_calls",
                    _ => "stop",
                };
                true
            }
        };
        if !ok {
            return;
        }
    }
    let _ = send(&tx, chunk(json!({}), json!(finish))).await;
    let _ = send(
        &tx,
        format!(
            "data: {}\n\n",
            json!({"id":"c1","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20}})
        ),
    )
    .await;
    let _ = send(&tx, "data: [DONE]\n\n".to_owned()).await;
}

//! Wire plumbing of the scripted agent: one stdout writer thread (single messages and
//! pre-serialized bursts) and the table of requests the agent sent to the client and is still
//! waiting for.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// A JSON-RPC error, in either direction.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(-32602, message)
    }

    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(-32601, format!("Method not found: {method}"))
    }

    pub fn session_not_found(session_id: &str) -> RpcError {
        RpcError {
            code: -32002,
            message: "Resource not found".into(),
            data: Some(json!({ "sessionId": session_id })),
        }
    }

    fn to_json(&self) -> Value {
        let mut err = json!({ "code": self.code, "message": self.message });
        if let Some(data) = &self.data {
            err["data"] = data.clone();
        }
        err
    }
}

enum OutMsg {
    Line(String),
    /// A run of back-to-back ticks the writer thread makes itself.
    Ticks(Ticks),
    /// Whole lines, newline-terminated, written with one write; the permit holds their share
    /// of the output budget until they are written.
    Burst(Vec<u8>, Option<OwnedSemaphorePermit>),
    Exit(i32),
}

/// `tick N 0` of one session, made by the writer thread: each round of its loop stamps one
/// chunk of every running run with the clock, writes the round in one `write`, and only then
/// makes the next. So a chunk is still made once the one before it is written (the stamp
/// measures the reader, not a queue in this agent), without a wake-up of the turn's task and
/// of this thread per chunk: 1 000 sessions ticking cost one `write` per round, not 1 000.
pub struct Ticks {
    /// The line up to the text, which is `tick UNIX_NS`; then `mid`, the chunk's number, `tail`.
    pub head: Vec<u8>,
    pub mid: &'static [u8],
    pub tail: &'static [u8],
    /// The next chunk's number, and how many are left to make.
    pub n: u64,
    pub left: u64,
    pub cancel: CancellationToken,
    /// How many were written, once the run ends (all of them, or fewer when cancelled).
    pub done: oneshot::Sender<u64>,
    pub written: u64,
}

/// One chunk of every run in `ticks`, all stamped `now`, appended to `out`.
fn tick_round(ticks: &mut [Ticks], out: &mut Vec<u8>) {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let stamp = format!("tick {ns}");
    for t in ticks
        .iter_mut()
        .filter(|t| t.left > 0 && !t.cancel.is_cancelled())
    {
        out.extend_from_slice(&t.head);
        out.extend_from_slice(stamp.as_bytes());
        out.extend_from_slice(t.mid);
        write!(out, "{}", t.n).expect("writing to a Vec never fails");
        out.extend_from_slice(t.tail);
        t.n += 1;
        t.left -= 1;
        t.written += 1;
    }
}

/// Ends the runs that are done or cancelled (after their last chunk is written).
fn retire(ticks: &mut Vec<Ticks>) {
    let mut i = 0;
    while i < ticks.len() {
        if ticks[i].left == 0 || ticks[i].cancel.is_cancelled() {
            let t = ticks.swap_remove(i);
            let _ = t.done.send(t.written);
        } else {
            i += 1;
        }
    }
}

/// A failed write to stdout: the client is gone.
fn gone<T>(_: std::io::Error) -> T {
    std::process::exit(0)
}

/// Bytes of bursts queued for stdout and not yet written: a stream waits for the reader
/// instead of piling up in memory.
const OUT_BUDGET: usize = 8 * 1024 * 1024;

/// Cloneable handle to the single stdout writer. Going through one writer keeps every message
/// on its own line and keeps the order in which callers queued them.
#[derive(Clone)]
pub struct Out {
    tx: mpsc::UnboundedSender<OutMsg>,
    budget: Arc<Semaphore>,
}

impl Out {
    /// Starts the writer thread. A failed write means the client is gone: exit quietly.
    ///
    /// A thread of its own, writing to the raw stdout: a burst of many updates leaves in one
    /// `write`, without the copy and the blocking-pool hop of tokio's stdout, while the turn
    /// builds the next burst.
    pub fn start() -> Out {
        let (tx, mut rx) = mpsc::unbounded_channel::<OutMsg>();
        std::thread::spawn(move || {
            let stdout = std::io::stdout();
            let mut stdout = stdout.lock();
            // Small messages queued together go out in one write.
            let mut lines: Vec<u8> = Vec::with_capacity(64 * 1024);
            let mut ticks: Vec<Ticks> = Vec::new();
            loop {
                // Blocks only when no run of ticks is going on.
                let mut next = match ticks.is_empty() {
                    true => match rx.blocking_recv() {
                        Some(msg) => Some(msg),
                        None => return,
                    },
                    false => rx.try_recv().ok(),
                };
                while let Some(msg) = next {
                    match msg {
                        OutMsg::Line(line) => {
                            lines.extend_from_slice(line.as_bytes());
                            lines.push(b'\n');
                        }
                        OutMsg::Ticks(t) => ticks.push(t),
                        OutMsg::Burst(bytes, permit) => {
                            if !lines.is_empty() {
                                stdout.write_all(&lines).unwrap_or_else(gone);
                                lines.clear();
                            }
                            stdout.write_all(&bytes).unwrap_or_else(gone);
                            drop(permit);
                        }
                        OutMsg::Exit(code) => {
                            let _ = stdout.write_all(&lines);
                            let _ = stdout.flush();
                            eprintln!(
                                "scripted-agent[{}]: exiting with status {code}",
                                std::process::id()
                            );
                            std::process::exit(code);
                        }
                    }
                    // Flush only when the queue is drained: big streams go out in large
                    // writes, single messages still leave at once.
                    next = match rx.try_recv() {
                        Ok(next) if lines.len() < 256 * 1024 => Some(next),
                        Ok(next) => {
                            stdout.write_all(&lines).unwrap_or_else(gone);
                            lines.clear();
                            Some(next)
                        }
                        Err(_) => None,
                    };
                }
                // A chunk of every run, after whatever was queued before it.
                tick_round(&mut ticks, &mut lines);
                stdout.write_all(&lines).unwrap_or_else(gone);
                lines.clear();
                stdout.flush().unwrap_or_else(gone);
                retire(&mut ticks);
            }
        });
        Out {
            tx,
            budget: Arc::new(Semaphore::new(OUT_BUDGET)),
        }
    }

    pub fn send(&self, msg: &Value) {
        let line = serde_json::to_string(msg).expect("JSON values always serialize");
        let _ = self.tx.send(OutMsg::Line(line));
    }

    /// Waits until `bytes` more bytes of bursts may be queued (at most the whole budget).
    pub async fn reserve(&self, bytes: usize) -> OwnedSemaphorePermit {
        let n = bytes.clamp(1, OUT_BUDGET) as u32;
        self.budget
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("the output budget is never closed")
    }

    /// Hands a run of ticks to the writer thread; its `done` says when it ended.
    pub fn ticks(&self, ticks: Ticks) {
        let _ = self.tx.send(OutMsg::Ticks(ticks));
    }

    /// Queues newline-terminated lines to be written at once.
    pub fn burst(&self, bytes: Vec<u8>, permit: Option<OwnedSemaphorePermit>) {
        let _ = self.tx.send(OutMsg::Burst(bytes, permit));
    }

    pub fn respond(&self, id: Value, result: Result<Value, RpcError>) {
        let msg = match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(err) => json!({ "jsonrpc": "2.0", "id": id, "error": err.to_json() }),
        };
        self.send(&msg);
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// Writes out everything queued before, then ends the process with `code`.
    pub fn exit(&self, code: i32) {
        let _ = self.tx.send(OutMsg::Exit(code));
    }
}

/// How a request the agent sent to the client ended.
pub enum CallOutcome {
    Ok(Value),
    Err(RpcError),
    /// The turn was cancelled first; the client was sent `$/cancel_request`.
    Cancelled,
}

/// Requests sent to the client, by numeric id, waiting for their responses.
pub struct Peer {
    next_id: AtomicI64,
    pending: Mutex<HashMap<i64, oneshot::Sender<Result<Value, RpcError>>>>,
}

impl Peer {
    pub fn new() -> Peer {
        Peer {
            next_id: AtomicI64::new(1),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Sends a request and waits for its response or for `cancel`, whichever comes first.
    pub async fn call(
        &self,
        out: &Out,
        method: &str,
        params: Value,
        cancel: &CancellationToken,
    ) -> CallOutcome {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        out.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        tokio::select! {
            res = rx => match res {
                Ok(Ok(v)) => CallOutcome::Ok(v),
                Ok(Err(e)) => CallOutcome::Err(e),
                Err(_) => CallOutcome::Err(RpcError::new(-32603, "response channel dropped")),
            },
            _ = cancel.cancelled() => {
                // The answer is not waited for: withdraw the request and forget it, so a late
                // answer is dropped as unknown.
                self.pending.lock().unwrap().remove(&id);
                out.notify("$/cancel_request", json!({ "requestId": id }));
                CallOutcome::Cancelled
            }
        }
    }

    /// Sends a request whose answer nobody waits for (cleanup after a cancelled turn).
    pub fn fire_and_forget(&self, out: &Out, method: &str, params: Value) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        out.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
    }

    /// Routes a response from the client to whoever waits for it; unknown ids are dropped.
    pub fn resolve(&self, msg: &Value) {
        let Some(id) = msg.get("id").and_then(Value::as_i64) else {
            eprintln!("scripted-agent: response with a non-numeric id ignored: {msg}");
            return;
        };
        let Some(tx) = self.pending.lock().unwrap().remove(&id) else {
            return;
        };
        let result = match msg.get("error") {
            Some(err) => Err(RpcError {
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                data: err.get("data").cloned(),
            }),
            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        };
        let _ = tx.send(result);
    }
}

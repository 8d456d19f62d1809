//! The editor side of ACP as a test client plays it: answers the agent's requests on the
//! real filesystem and with real processes, and answers permissions as the test configured.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::client::RpcError;

/// How the editor answers `session/request_permission`.
#[derive(Debug, Clone, PartialEq)]
pub enum PermissionChoice {
    /// `{"outcome":{"outcome":"selected","optionId":ID}}`
    Select(String),
    /// `{"outcome":{"outcome":"cancelled"}}`
    Cancelled,
}

pub struct Editor {
    pub permission: PermissionChoice,
    /// Methods whose requests are not answered automatically but kept for the test to answer
    /// (or never answer) with `Client::respond`.
    pub hold: HashSet<String>,
    /// What `_scripted/ping` gets.
    pub ping_result: Value,
    terminals: HashMap<String, Terminal>,
    next_terminal: u64,
}

/// What `Editor::handle` decided.
pub enum Handled {
    Answer(Result<Value, RpcError>),
    Hold,
}

struct Terminal {
    output: Arc<Mutex<Vec<u8>>>,
    exit: watch::Receiver<Option<Value>>,
    kill: Option<oneshot::Sender<()>>,
    readers: Vec<JoinHandle<()>>,
}

impl Default for Editor {
    fn default() -> Editor {
        Editor {
            permission: PermissionChoice::Select("allow-once".into()),
            hold: HashSet::new(),
            ping_result: json!({ "pong": true }),
            terminals: HashMap::new(),
            next_terminal: 1,
        }
    }
}

fn not_found(what: &str) -> RpcError {
    RpcError {
        code: -32002,
        message: "Resource not found".into(),
        data: Some(json!({ "uri": what })),
    }
}

fn invalid(message: String) -> RpcError {
    RpcError {
        code: -32602,
        message,
        data: None,
    }
}

fn str_param<'a>(params: &'a Value, key: &str) -> Result<&'a str, RpcError> {
    params[key]
        .as_str()
        .ok_or_else(|| invalid(format!("{key} is required")))
}

impl Editor {
    pub fn hold(&mut self, method: &str) {
        self.hold.insert(method.to_string());
    }

    /// Answers one agent→client request.
    pub async fn handle(&mut self, method: &str, params: &Value) -> Handled {
        if self.hold.contains(method) {
            return Handled::Hold;
        }
        Handled::Answer(match method {
            "session/request_permission" => Ok(match &self.permission {
                PermissionChoice::Select(id) => {
                    json!({ "outcome": { "outcome": "selected", "optionId": id } })
                }
                PermissionChoice::Cancelled => json!({ "outcome": { "outcome": "cancelled" } }),
            }),
            "fs/read_text_file" => self.read(params).await,
            "fs/write_text_file" => self.write(params).await,
            "terminal/create" => self.create_terminal(params),
            "terminal/wait_for_exit" => self.wait_for_exit(params).await,
            "terminal/output" => self.output(params),
            "terminal/kill" => self.kill(params, false),
            "terminal/release" => self.kill(params, true),
            "_scripted/ping" => Ok(self.ping_result.clone()),
            _ => Err(RpcError {
                code: -32601,
                message: format!("Method not found: {method}"),
                data: None,
            }),
        })
    }

    async fn read(&self, params: &Value) -> Result<Value, RpcError> {
        let path = str_param(params, "path")?;
        let content = tokio::fs::read_to_string(path)
            .await
            .map_err(|_| not_found(path))?;
        Ok(json!({ "content": content }))
    }

    async fn write(&self, params: &Value) -> Result<Value, RpcError> {
        let path = str_param(params, "path")?;
        let content = str_param(params, "content")?;
        if let Some(parent) = std::path::Path::new(path).parent() {
            let _ = tokio::fs::create_dir_all(parent).await;
        }
        tokio::fs::write(path, content)
            .await
            .map_err(|e| invalid(format!("write {path}: {e}")))?;
        Ok(json!({}))
    }

    fn create_terminal(&mut self, params: &Value) -> Result<Value, RpcError> {
        let command = str_param(params, "command")?;
        let mut cmd = tokio::process::Command::new(command);
        if let Some(args) = params["args"].as_array() {
            cmd.args(args.iter().filter_map(Value::as_str));
        }
        if let Some(env) = params["env"].as_array() {
            for var in env {
                cmd.env(
                    var["name"].as_str().unwrap_or_default(),
                    var["value"].as_str().unwrap_or_default(),
                );
            }
        }
        if let Some(cwd) = params["cwd"].as_str() {
            cmd.current_dir(cwd);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| invalid(format!("spawn {command}: {e}")))?;

        let output = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let pipes: [Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>; 2] = [
            child.stdout.take().map(|p| Box::new(p) as _),
            child.stderr.take().map(|p| Box::new(p) as _),
        ];
        for mut pipe in pipes.into_iter().flatten() {
            let output = output.clone();
            readers.push(tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    output.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }));
        }
        let (exit_tx, exit_rx) = watch::channel(None);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status,
                _ = kill_rx => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            let exit = match status {
                Ok(s) => json!({
                    "exitCode": s.code(),
                    "signal": s.signal().map(|n| format!("signal {n}")),
                }),
                Err(_) => json!({ "exitCode": null, "signal": null }),
            };
            let _ = exit_tx.send(Some(exit));
        });

        let id = format!("term-{}", self.next_terminal);
        self.next_terminal += 1;
        self.terminals.insert(
            id.clone(),
            Terminal {
                output,
                exit: exit_rx,
                kill: Some(kill_tx),
                readers,
            },
        );
        Ok(json!({ "terminalId": id }))
    }

    fn terminal(&mut self, params: &Value) -> Result<&mut Terminal, RpcError> {
        let id = str_param(params, "terminalId")?;
        self.terminals.get_mut(id).ok_or_else(|| not_found(id))
    }

    async fn wait_for_exit(&mut self, params: &Value) -> Result<Value, RpcError> {
        let term = self.terminal(params)?;
        let mut exit = term.exit.clone();
        let waited =
            tokio::time::timeout(Duration::from_secs(30), exit.wait_for(Option::is_some)).await;
        let status = match waited {
            Ok(Ok(status)) => status.clone().unwrap_or(Value::Null),
            _ => panic!("terminal command did not exit within 30 s"),
        };
        // The process is gone; its pipes end right after. Waiting for the readers makes the
        // following `terminal/output` complete.
        for reader in term.readers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        Ok(status)
    }

    fn output(&mut self, params: &Value) -> Result<Value, RpcError> {
        let term = self.terminal(params)?;
        let output = String::from_utf8_lossy(&term.output.lock().unwrap()).into_owned();
        let mut result = json!({ "output": output, "truncated": false });
        if let Some(exit) = term.exit.borrow().clone() {
            result["exitStatus"] = exit;
        }
        Ok(result)
    }

    fn kill(&mut self, params: &Value, release: bool) -> Result<Value, RpcError> {
        let term = self.terminal(params)?;
        if let Some(kill) = term.kill.take() {
            let _ = kill.send(());
        }
        if release {
            let id = str_param(params, "terminalId")?.to_string();
            self.terminals.remove(&id);
        }
        Ok(json!({}))
    }
}

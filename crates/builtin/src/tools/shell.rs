//! The shell tool: through the client's terminal (`terminal/create`, `wait_for_exit`,
//! `output`, `release`) when it offers one, so the user watches it run in the editor; else
//! as `sh -c` on the host in the session's cwd, in its own process group so a cancel or a
//! timeout kills everything it started.

use acpd_protocol::method;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::{Outcome, ToolEnv, ToolError, sandbox};

/// How long cleanup requests (kill, release) may take after the turn was cancelled.
const CLEANUP: Duration = Duration::from_secs(5);

pub async fn shell(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let command = input
        .get("command")
        .and_then(Value::as_str)
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| ToolError::BadInput("`command` (string) is required".into()))?;
    let timeout = input
        .get("timeout_secs")
        .and_then(Value::as_u64)
        .map(Duration::from_secs)
        .unwrap_or(env.config.shell_timeout)
        .min(env.config.shell_timeout);
    if env.config.client_terminal && env.caps.terminal {
        client_terminal(env, command, timeout).await
    } else if env.config.host_shell {
        host(env, command, timeout).await
    } else {
        Err(ToolError::Unavailable("shell"))
    }
}

async fn client_terminal(
    env: &ToolEnv<'_>,
    command: &str,
    timeout: Duration,
) -> Result<Outcome, ToolError> {
    let created = env
        .client
        .request(
            method::TERMINAL_CREATE,
            json!({
                "command": "sh",
                "args": ["-c", command],
                "env": [],
                "cwd": env.roots.cwd(),
                "outputByteLimit": env.config.output_limit,
            }),
            env.cancel,
        )
        .await?;
    let Some(tid) = created.get("terminalId").and_then(Value::as_str) else {
        return Err(ToolError::Failed(
            "terminal/create gave no terminalId".into(),
        ));
    };
    let tid = tid.to_owned();
    // The user sees the terminal live in the tool call while it runs.
    env.client
        .update(json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": env.tool_call_id,
            "status": "in_progress",
            "content": [{ "type": "terminal", "terminalId": tid }],
        }))
        .await;
    let waited = tokio::time::timeout(
        timeout,
        env.client.request(
            method::TERMINAL_WAIT_FOR_EXIT,
            json!({ "terminalId": tid }),
            env.cancel,
        ),
    )
    .await;
    let never = tokio_util::sync::CancellationToken::new();
    let cleanup = |method: &'static str| {
        let client = env.client.clone();
        let tid = tid.clone();
        let never = never.clone();
        async move {
            tokio::time::timeout(
                CLEANUP,
                client.request(method, json!({ "terminalId": tid }), &never),
            )
            .await
            .ok()
            .and_then(Result::ok)
        }
    };
    let (status, why) = match waited {
        Ok(Ok(s)) => (Some(s), None),
        Ok(Err(super::super::client::ClientError::Cancelled)) => {
            cleanup(method::TERMINAL_KILL).await;
            (None, Some(ToolError::Cancelled))
        }
        Ok(Err(e)) => (None, Some(ToolError::from(e))),
        Err(_) => {
            cleanup(method::TERMINAL_KILL).await;
            (None, None)
        }
    };
    let output = cleanup(method::TERMINAL_OUTPUT).await;
    cleanup(method::TERMINAL_RELEASE).await;
    if let Some(e) = why {
        return Err(e);
    }
    Ok(terminal_outcome(tid, status, output, timeout))
}

/// What the client's terminal reported: its output, and how the command ended (`status`:
/// its `wait_for_exit` answer; `None` when it timed out and was killed).
fn terminal_outcome(
    tid: String,
    status: Option<Value>,
    output: Option<Value>,
    timeout: Duration,
) -> Outcome {
    let text = output
        .as_ref()
        .and_then(|o| o.get("output"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let truncated = output
        .as_ref()
        .and_then(|o| o.get("truncated"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let exit = status
        .as_ref()
        .or_else(|| output.as_ref().and_then(|o| o.get("exitStatus")))
        .cloned();
    let code = exit
        .as_ref()
        .and_then(|e| e.get("exitCode"))
        .and_then(Value::as_i64);
    let signal = exit
        .as_ref()
        .and_then(|e| e.get("signal"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let summary = summarize(
        &text,
        truncated,
        code,
        signal.as_deref(),
        status.is_none(),
        timeout,
    );
    Outcome {
        text: summary,
        is_error: code != Some(0),
        content: vec![json!({ "type": "terminal", "terminalId": tid })],
        raw_output: json!({ "exitCode": code, "signal": signal, "output": text }),
    }
}

fn summarize(
    output: &str,
    truncated: bool,
    code: Option<i64>,
    signal: Option<&str>,
    timed_out: bool,
    timeout: Duration,
) -> String {
    let mut s = output.to_owned();
    if truncated {
        s.insert_str(0, "[output truncated]\n");
    }
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    if timed_out {
        s.push_str(&format!(
            "[timed out after {}s and was killed]",
            timeout.as_secs()
        ));
    } else if let Some(sig) = signal {
        s.push_str(&format!("[killed by signal {sig}]"));
    } else {
        s.push_str(&format!("[exit code {}]", code.unwrap_or(-1)));
    }
    s
}

async fn host(env: &ToolEnv<'_>, command: &str, timeout: Duration) -> Result<Outcome, ToolError> {
    if env.roots.reach_data_dir() {
        return Err(ToolError::DataDir(env.roots.cwd().to_owned()));
    }
    let mut cmd = host_command(env, command)?;
    let mut child = cmd.spawn().map_err(|e| ToolError::Io("sh".into(), e))?;
    let pid = child.id();
    let limit = env.config.output_limit;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let read = async move {
        tokio::join!(
            read_bounded(stdout.as_mut(), limit),
            read_bounded(stderr.as_mut(), limit)
        )
    };
    let run = async {
        let (out, err) = read.await;
        let status = child.wait().await;
        (out, err, status)
    };
    let kill_group = || {
        if let Some(pid) = pid {
            // SAFETY: plain syscall on the process group this tool created.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
        }
    };
    let result = tokio::select! {
        r = run => Some(r),
        _ = tokio::time::sleep(timeout) => None,
        _ = env.cancel.cancelled() => {
            kill_group();
            return Err(ToolError::Cancelled);
        }
    };
    let Some((out, err, status)) = result else {
        kill_group();
        return Ok(Outcome {
            text: format!("[timed out after {}s and was killed]", timeout.as_secs()),
            is_error: true,
            content: vec![],
            raw_output: json!({ "timedOut": true }),
        });
    };
    let mut text = String::from_utf8_lossy(&out).into_owned();
    if !err.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&String::from_utf8_lossy(&err));
    }
    let truncated = text.len() > limit;
    let text = env.truncate(text);
    let code = status.as_ref().ok().and_then(|s| s.code()).map(i64::from);
    let summary = summarize(&text, truncated, code, None, false, timeout);
    Ok(Outcome {
        is_error: code != Some(0),
        content: vec![
            json!({ "type": "content", "content": { "type": "text", "text": format!("```\n{summary}\n```") } }),
        ],
        raw_output: json!({ "exitCode": code, "output": text }),
        text: summary,
    })
}

/// `sh -c command` in the session's cwd, in its own process group, with a clean environment,
/// confined by Landlock when the sandbox is on.
fn host_command(env: &ToolEnv<'_>, command: &str) -> Result<tokio::process::Command, ToolError> {
    let mut cmd = tokio::process::Command::new("sh");
    crate::child_env::clean(cmd.as_std_mut()).envs(&env.config.shell_env);
    cmd.arg("-c")
        .arg(command)
        .current_dir(env.roots.cwd())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if env.config.shell_sandbox {
        let confinement = sandbox::Confinement {
            write: env
                .roots
                .lexical
                .iter()
                .cloned()
                .chain(env.config.shell_sandbox_write.iter().cloned())
                .collect(),
            read: env.config.shell_sandbox_read.clone(),
        };
        match sandbox::ruleset(&confinement) {
            Ok(Some(ruleset)) => sandbox::apply(&mut cmd, ruleset),
            Ok(None) => {}
            Err(e) => {
                return Err(ToolError::Failed(format!(
                    "cannot confine the shell (Landlock): {e}"
                )));
            }
        }
    }
    Ok(cmd)
}

/// Reads a pipe to its end, keeping the first `limit` bytes: the rest is drained so the
/// command never blocks on a full pipe, but not kept.
async fn read_bounded<R: tokio::io::AsyncRead + Unpin>(r: Option<&mut R>, limit: usize) -> Vec<u8> {
    let Some(r) = r else { return vec![] };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = (limit + 1).saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    kept
}

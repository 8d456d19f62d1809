//! Logging a hosted agent in on acpd's host: `acpd agent login NAME`, and the hint that
//! names it in an agent's "authentication required" error.
//!
//! Remote editors must not run an agent's terminal login themselves (through acp-shim acpd
//! offers `crate::login`, which runs `command_for` here too), so the login runs here,
//! attached to the operator's terminal, with the profile's
//! command, environment, cwd and HOME — the same credentials the hosted agent will read. The
//! command is the profile's `login = [...]` if given; else the agent is asked (`initialize`
//! with `auth.terminal`) and its terminal auth method is run: the agent's own command with
//! the method's `args` and `env` (ACP auth methods), or the legacy
//! `_meta["terminal-auth"] = {command, args, env}`.

use acpd_protocol::method;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::AgentProfile;
use acpd_wire::{ResponseError, code};

/// Longest the agent may take to answer `initialize` when asked for its auth methods.
const ASK_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the agent did not answer initialize: {0}")]
    NoAnswer(String),
    #[error(
        "agent {profile:?} advertises no terminal login (auth methods: {methods}); set \
         `login = [\"COMMAND\", ...]` in [agents.{profile}] (the agent's docs say how it logs in)"
    )]
    NoTerminalMethod { profile: String, methods: String },
}

/// A command to run for the login.
#[derive(Debug, Clone, PartialEq)]
pub struct LoginCommand {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// The command `acpd agent login` shows in errors and runs.
pub fn login_hint(profile: &str) -> String {
    format!("acpd agent login {profile}")
}

/// A hosted agent's "authentication required" answer, relayed with the command that logs it
/// in on acpd's host (`data.acpd.login`, and in the message). The built-in agent's is left
/// as it is: its credentials are acpd's own configuration.
pub fn auth_hint(mut e: ResponseError, profile: &str) -> ResponseError {
    if e.code != code::AUTH_REQUIRED || profile == crate::config::BUILTIN_AGENT {
        return e;
    }
    let hint = login_hint(profile);
    e.message = format!(
        "{} (the agent runs on the acpd host: log it in there with `{hint}`)",
        e.message
    );
    let mut data = match e.data.take() {
        Some(Value::Object(m)) => m,
        Some(other) => {
            let mut m = serde_json::Map::new();
            m.insert("agent".into(), other);
            m
        }
        None => serde_json::Map::new(),
    };
    data.insert("acpd".into(), json!({ "login": hint }));
    e.data = Some(Value::Object(data));
    e
}

/// Which command logs the agent in: `login = [...]`, else what the agent advertises.
pub async fn command_for(profile: &AgentProfile) -> Result<LoginCommand, LoginError> {
    if let Some((program, args)) = profile.login.split_first() {
        return Ok(LoginCommand {
            program: program.clone(),
            args: args.to_vec(),
            env: vec![],
        });
    }
    let init = ask_initialize(profile).await?;
    from_auth_methods(profile, &init)
}

/// The terminal auth method of an `initialize` result, as a command.
pub fn from_auth_methods(profile: &AgentProfile, init: &Value) -> Result<LoginCommand, LoginError> {
    let methods = init
        .get("authMethods")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let env_of = |v: Option<&Value>| -> Vec<(String, String)> {
        v.and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    };
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    for m in &methods {
        if m.get("type").and_then(Value::as_str) == Some("terminal") {
            let mut args = profile.args.clone();
            args.extend(strings(m.get("args")));
            return Ok(LoginCommand {
                program: profile.program.clone(),
                args,
                env: env_of(m.get("env")),
            });
        }
        let legacy = m.get("_meta").and_then(|meta| meta.get("terminal-auth"));
        if let Some(cmd) = legacy
            .and_then(|t| t.get("command"))
            .and_then(Value::as_str)
        {
            let t = legacy.unwrap_or(&Value::Null);
            return Ok(LoginCommand {
                program: cmd.to_owned(),
                args: strings(t.get("args")),
                env: env_of(t.get("env")),
            });
        }
    }
    let names: Vec<String> = methods
        .iter()
        .map(|m| {
            m.get("id")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned()
        })
        .collect();
    Err(LoginError::NoTerminalMethod {
        profile: profile.name.clone(),
        methods: if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        },
    })
}

/// Runs the agent once, as acpd would, and asks for its auth methods the way a local editor
/// that can run terminal logins would.
async fn ask_initialize(profile: &AgentProfile) -> Result<Value, LoginError> {
    let mut cmd = tokio::process::Command::new(&profile.program);
    super::home::apply(cmd.as_std_mut(), profile);
    cmd.args(&profile.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(cwd) = &profile.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().map_err(|source| LoginError::Spawn {
        program: profile.program.clone(),
        source,
    })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(LoginError::NoAnswer("no pipes".into()));
    };
    // The agent is spoken to with acpd's own peer, as `hosted` does.
    let cancel = tokio_util::sync::CancellationToken::new();
    let (link, pump) =
        acpd_wire::lines::pump(stdout, stdin, super::hosted::MAX_AGENT_LINE, cancel.clone());
    let pump = tokio::spawn(pump);
    let (peer, mut incoming, peer_task) = acpd_wire::spawn(link, cancel.clone());
    // Whatever else the agent sends meanwhile is dropped (its requests answered -32603), so
    // the peer keeps reading.
    let drain = tokio::spawn(async move { while incoming.recv().await.is_some() {} });
    let params = json!({
        "protocolVersion": 1,
        "clientCapabilities": { "auth": { "terminal": true }, "_meta": { "terminal-auth": true } },
        "clientInfo": { "name": "acpd-login", "version": env!("CARGO_PKG_VERSION") },
    });
    let result =
        match tokio::time::timeout(ASK_TIMEOUT, peer.request(method::INITIALIZE, Some(params)))
            .await
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(acpd_wire::PeerError::Remote(e))) => Err(format!("it answered {e}")),
            Ok(Err(acpd_wire::PeerError::Disconnected)) => Err("it closed its stdout".to_owned()),
            Err(_) => Err("no answer within 60 s".to_owned()),
        };
    cancel.cancel();
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = tokio::join!(pump, peer_task, drain);
    result.map_err(LoginError::NoAnswer)
}

/// `acpd agent login NAME`: prints the command, runs it on this terminal, exits as it did.
pub async fn run(profile: &AgentProfile) -> ExitCode {
    let login = match command_for(profile).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("acpd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shown = shell_words::join(std::iter::once(&login.program).chain(&login.args));
    match &profile.home {
        Some(home) => eprintln!("acpd: running `{shown}` with HOME={}", home.display()),
        None => eprintln!("acpd: running `{shown}`"),
    }
    if let Some(home) = &profile.home
        && let Err(e) = super::home::prepare(home)
    {
        eprintln!("acpd: cannot create {}: {e}", home.display());
        return ExitCode::FAILURE;
    }
    let mut cmd = std::process::Command::new(&login.program);
    super::home::apply(&mut cmd, profile)
        .args(&login.args)
        .envs(login.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &profile.cwd {
        cmd.current_dir(cwd);
    }
    // Blocking on purpose: the login owns the terminal until it ends.
    match tokio::task::block_in_place(|| cmd.status()) {
        Ok(status) => match status.code() {
            Some(0) => {
                eprintln!(
                    "acpd: login finished; new sessions of {:?} use it",
                    profile.name
                );
                ExitCode::SUCCESS
            }
            Some(c) => {
                eprintln!("acpd: the login command exited with {c}");
                ExitCode::from(c as u8)
            }
            None => {
                eprintln!("acpd: the login command ended by {status}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("acpd: cannot run {:?}: {e}", login.program);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> AgentProfile {
        AgentProfile {
            name: "x".into(),
            program: "agent".into(),
            args: vec!["--acp".into()],
            env: vec![],
            pass_env: vec![],
            cwd: None,
            home: None,
            login: vec![],
            login_principals: vec![],
            login_timeout: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn a_terminal_method_reruns_the_agent_with_its_args_and_env() {
        let init = json!({ "authMethods": [
            { "id": "key", "name": "Key" },
            { "id": "t", "name": "T", "type": "terminal", "args": ["--login"], "env": { "A": "1" } },
        ]});
        let c = from_auth_methods(&profile(), &init).unwrap();
        assert_eq!(c.program, "agent");
        assert_eq!(c.args, ["--acp", "--login"]);
        assert_eq!(c.env, [("A".to_owned(), "1".to_owned())]);
    }

    #[test]
    fn the_legacy_meta_convention_names_its_own_command() {
        let init = json!({ "authMethods": [{ "id": "claude-login", "name": "Log in",
            "_meta": { "terminal-auth": { "command": "/usr/bin/node", "args": ["cli.js", "/login"], "label": "x" } } }]});
        let c = from_auth_methods(&profile(), &init).unwrap();
        assert_eq!(c.program, "/usr/bin/node");
        assert_eq!(c.args, ["cli.js", "/login"]);
    }

    #[test]
    fn no_terminal_method_says_what_there_is() {
        let init = json!({ "authMethods": [{ "id": "api-key", "name": "Key" }] });
        let e = from_auth_methods(&profile(), &init).unwrap_err();
        assert!(e.to_string().contains("api-key"), "{e}");
        assert!(e.to_string().contains("login = "), "{e}");
    }

    #[test]
    fn only_auth_required_gets_the_hint() {
        let e = auth_hint(
            ResponseError::new(-32000, "Authentication required"),
            "claude",
        );
        assert!(
            e.message.contains("acpd agent login claude"),
            "{}",
            e.message
        );
        assert_eq!(e.data.unwrap()["acpd"]["login"], "acpd agent login claude");
        let boom = ResponseError::internal("boom");
        assert_eq!(auth_hint(boom.clone(), "claude"), boom);
        let builtin = ResponseError::new(-32000, "no key");
        assert_eq!(auth_hint(builtin.clone(), "builtin"), builtin);
    }
}

//! Support for the built-in agent's tests: the real `acpd` binary with a `[builtin]` config
//! pointing at a scripted model server, and an editor-like client over WebSocket.

pub mod editor;
pub mod mcp;
pub mod model;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

pub use editor::Editor;
pub use model::ModelServer;

/// Matches a `session/update` of one kind.
pub fn is(kind: &'static str) -> impl Fn(&serde_json::Value) -> bool {
    move |u| u["sessionUpdate"] == kind
}

/// The tool_call_updates seen in a final state (completed or failed).
pub fn finished_updates(seen: &[serde_json::Value]) -> Vec<serde_json::Value> {
    seen.iter()
        .map(|u| u["update"].clone())
        .filter(|u| {
            u["sessionUpdate"] == "tool_call_update"
                && (u["status"] == "completed" || u["status"] == "failed")
        })
        .collect()
}

/// Client capabilities of an editor that offers files and terminals (like Zed).
pub fn full_caps() -> serde_json::Value {
    serde_json::json!({ "fs": { "readTextFile": true, "writeTextFile": true }, "terminal": true })
}

pub fn no_caps() -> serde_json::Value {
    serde_json::json!({})
}

/// The `[builtin]` table: an Anthropic model "claude" and an OpenAI one "gpt", both served
/// by `model`; `extra` is appended inside `[builtin]`.
pub fn builtin_config(model: SocketAddr, extra: &str) -> String {
    format!(
        r#"[builtin]
default_model = "claude"
retry_base_ms = 10
shell_timeout_secs = 60
{extra}

[builtin.models.claude]
provider = "anthropic"
model = "claude-test"
base_url = "http://{model}"
api_key = "anthropic-test-key"
context_window = 200000

[builtin.models.gpt]
provider = "openai"
model = "gpt-test"
name = "GPT test"
base_url = "http://{model}/v1"
api_key = "openai-test-key"
reasoning = true
"#
    )
}

pub struct Acpd {
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
    child: Option<Child>,
    env: Vec<(String, String)>,
}

impl Drop for Acpd {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}

impl Acpd {
    /// Starts `acpd serve --no-auth` with `config` as its config file.
    pub async fn start(config: &str) -> Acpd {
        Acpd::start_with_env(config, &[]).await
    }

    /// Like `start`, with extra environment variables for acpd.
    pub async fn start_with_env(config: &str, env: &[(&str, &str)]) -> Acpd {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("work")).expect("work dir");
        std::fs::write(dir.path().join("acpd.toml"), config).expect("config file");
        let mut d = Acpd {
            dir,
            // Known once the daemon says where it listens (`spawn`).
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.spawn().await;
        d
    }

    pub fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().and_then(|c| c.id()).expect("acpd runs") as i32
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("acpd.log"))
            .expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_acpd"));
        cmd.arg("serve")
            .arg("--no-auth")
            // Port 0: a port picked before the daemon binds it could be taken meanwhile by
            // another test on the box.
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--config")
            .arg(self.dir.path().join("acpd.toml"))
            .env("ACPD_LOG", "info,acpd=debug,acpd_builtin=debug")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        // Hermetic: no provider settings from the environment running the tests.
        for k in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            "ACPD_MODEL",
            "ACPD_CONFIG",
            "ACPD_DEFAULT_AGENT",
        ] {
            cmd.env_remove(k);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        // The log is appended to across restarts: this start's lines come after `from`.
        let from = self.log().len();
        self.child = Some(cmd.spawn().expect("spawn acpd"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            let this_start = log.get(from..).unwrap_or_default();
            if let Some(addr) = crate::support::listening_addr(this_start, "acpd listening: ") {
                self.addr = addr;
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("acpd exited with {status}; log:\n{log}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "acpd did not listen; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("acpd.log")).unwrap_or_default()
    }

    /// SIGTERM, wait for the exit, start again on the same data directory (on a new port).
    pub async fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                // SAFETY: signalling the child this test spawned.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            let _ = tokio::time::timeout(Duration::from_secs(20), c.wait()).await;
            let _ = c.kill().await;
        }
        self.spawn().await;
    }

    pub async fn editor(&self, caps: serde_json::Value) -> Editor {
        Editor::connect(self.addr, caps).await.0
    }
}

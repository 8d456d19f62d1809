//! The scripted agent spawned directly (no daemon), spoken to over its stdio with the same
//! `Client` the e2e tests use.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::client::Client;
use super::conn::Conn;
use super::scripted_agent_bin;

pub struct ScriptedAgent {
    pub child: Child,
    /// Holds the agent's stderr log; printed when the test panics.
    dir: tempfile::TempDir,
}

impl ScriptedAgent {
    /// Spawns `acpd-scripted-agent ARGS` and connects a client to its stdio.
    pub fn spawn(args: &[&str]) -> (ScriptedAgent, Client) {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log file");
        let mut child = Command::new(scripted_agent_bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn acpd-scripted-agent");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        (
            ScriptedAgent { child, dir },
            Client::new(Conn::lines(stdout, stdin)),
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("agent still running")
    }

    /// Waits for the process to end and returns its exit code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("scripted agent did not exit within 10 s")
            .expect("wait for scripted agent");
        status.code()
    }
}

impl Drop for ScriptedAgent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
            eprintln!("----- scripted agent stderr -----\n{log}----- end -----");
        }
    }
}

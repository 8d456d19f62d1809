//! Hosted agents: an ACP agent program run as a child process, spoken to over its stdio.
//!
//! The process runs under its supervisor (`acpd _supervise`, `supervisor.rs`), which owns its
//! whole process tree and dies with acpd; its stderr goes to acpd's log, each line capped
//! (`hosted/stderr.rs`). One router task owns the map from the agent's session ids to
//! session actors and forwards what the agent sends.
//! The router (`hosted/router.rs`) never waits on one session.

use acpd_protocol::method;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod held;
mod router;
mod stderr;

pub use held::Held;

use super::{AgentError, AgentEvent, AgentHandle, home, supervisor};
use crate::config::AgentProfile;
use acpd_wire::{self, Link};
use router::Router;

/// Longest an agent may take to answer `initialize`.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages kept for a session id the agent used before acpd knew it.
pub(super) const EARLY_LIMIT: usize = 1024;
/// Grace between SIGTERM and SIGKILL when acpd stops an agent (the supervisor's).
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long acpd waits for a supervisor to stop its tree before it SIGKILLs the supervisor.
const SUPERVISOR_GRACE: Duration = Duration::from_secs(5);
/// Commands queued for an agent's router (registrations, hints); see `AgentHandle::to_router`.
pub(super) const ROUTER_QUEUE: usize = 1024;
/// How long a write to an agent's stdin may make no progress (its pipe full, unread) before
/// the agent is cut and restored as after a crash: long, since an agent busy computing may
/// leave its stdin unread for a while, but bounded, so one that stopped reading is let go.
pub(super) const STDIN_DEADLINE: Duration = Duration::from_secs(30);
/// Agents may write long lines (a file's content); the line limit is generous.
pub(super) const MAX_AGENT_LINE: usize = 256 * 1024 * 1024;

pub(super) enum RouterCommand {
    /// Routes in-band answers for `route` (acpd's session id), and the agent's messages about
    /// `agent_session_id` when given, to `events`.
    Register {
        route: String,
        agent_session_id: Option<String>,
        events: mpsc::Sender<AgentEvent>,
    },
    /// Drops `route` if it still leads to `events`: the session that registered it. A session
    /// ended and opened again under the same id registers anew, and the ended one's late
    /// unregister must not take the new one's route (its agent's answers would go nowhere).
    Unregister {
        route: String,
        events: mpsc::Sender<AgentEvent>,
    },
    /// A session just sent the agent a request: it is the active one.
    Active { route: String },
}

/// Spawns the agent under its supervisor, initializes it, and starts its router.
pub(super) async fn start(
    profile: &AgentProfile,
    client_init: &Value,
    generation: u64,
    records: &Path,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    let spawn_error = |source| AgentError::Spawn {
        profile: profile.name.clone(),
        source,
    };
    if let Some(home) = &profile.home {
        home::prepare(home).map_err(spawn_error)?;
    }
    let mut child = spawn_process(profile, records).map_err(spawn_error)?;
    let pid = child.id();
    tracing::info!(agent = %profile.name, pid, generation, "agent process started");
    metrics::counter!(crate::metrics::AGENT_STARTS_TOTAL).increment(1);
    let (stdin, stdout, stderr) =
        match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => unreachable!("all three pipes were requested"),
        };
    let name = profile.name.clone();
    tasks.spawn(stderr::forward(stderr, name));
    let io_cancel = CancellationToken::new();
    let (link, pump) = acpd_wire::lines::pump_with(
        stdout,
        stdin,
        MAX_AGENT_LINE,
        Some(STDIN_DEADLINE),
        io_cancel.clone(),
    );
    tasks.spawn(pump);
    let supervisor = pid.and_then(|p| {
        Some(supervisor::record::Proc {
            pid: p as i32,
            start: supervisor::tree::stat(p as i32)?.start,
        })
    });
    connect(
        &profile.name,
        link,
        Process::Child(Box::new(Supervised {
            child,
            supervisor,
            records: records.to_owned(),
        })),
        io_cancel,
        client_init,
        tasks,
        shutdown,
    )
    .await
}

/// Speaks ACP as a client to an agent over `link`: initializes it and starts its router.
#[allow(clippy::too_many_arguments)]
pub(super) async fn connect(
    name: &str,
    link: Link,
    mut process: Process,
    io_cancel: CancellationToken,
    client_init: &Value,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<AgentHandle, AgentError> {
    let (peer, incoming, peer_task) = acpd_wire::spawn(link, io_cancel.clone());
    tasks.spawn(async move {
        let _ = peer_task.await;
    });
    let init_params = initialize_params(client_init);
    let init = match tokio::time::timeout(
        INITIALIZE_TIMEOUT,
        peer.request(method::INITIALIZE, Some(init_params)),
    )
    .await
    {
        Ok(Ok(v)) => v,
        failed => {
            process.kill().await;
            io_cancel.cancel();
            let message = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer to initialize".into(),
            };
            return Err(AgentError::Initialize {
                profile: name.to_owned(),
                message,
            });
        }
    };
    let (router_tx, router_rx) = mpsc::channel(ROUTER_QUEUE);
    let exited = CancellationToken::new();
    let router = Router::new(name, tasks.clone());
    tasks.spawn(router.run(
        process,
        incoming,
        router_rx,
        exited.clone(),
        io_cancel,
        shutdown,
    ));
    Ok(AgentHandle {
        peer,
        init: Arc::new(init),
        router: router_tx,
        tasks: tasks.clone(),
        exited,
        profile: name.into(),
    })
}

/// What runs the agent: a supervised child process, or a task inside acpd (the built-in
/// agent).
pub(super) enum Process {
    Child(Box<Supervised>),
    Task {
        join: tokio::task::JoinHandle<()>,
        cancel: CancellationToken,
    },
}

/// The supervisor acpd spawned (`acpd _supervise`), which owns the agent's tree.
pub(super) struct Supervised {
    child: Child,
    supervisor: Option<supervisor::record::Proc>,
    records: PathBuf,
}

/// Dropped without `kill` (a task torn down at the end of a shutdown): the supervisor is
/// asked to stop its tree, and stops it on its own time; tokio reaps it.
impl Drop for Supervised {
    fn drop(&mut self) {
        // `id()` is `None` once the supervisor has been waited for: no pid reuse here.
        if let Some(pid) = self.child.id() {
            supervisor::tree::signal(pid as i32, rustix::process::Signal::TERM);
        }
    }
}

impl Supervised {
    /// After the supervisor ended: if it left its record behind it died without cleaning up
    /// (SIGKILL, OOM), so what is left of its tree is killed here.
    async fn sweep_if_abandoned(&self) {
        let Some(sup) = self.supervisor else { return };
        let path = self.records.join(supervisor::record::file_name(sup));
        let Ok(text) = tokio::fs::read_to_string(&path).await else {
            return;
        };
        let Some(record) = supervisor::record::Record::parse(&text) else {
            return;
        };
        let swept = tokio::task::spawn_blocking(move || {
            let n = record.sweep(KILL_GRACE);
            let _ = std::fs::remove_file(&path);
            n
        })
        .await
        .unwrap_or(0);
        if swept > 0 {
            tracing::warn!(
                supervisor = sup.pid,
                processes = swept,
                "an agent's supervisor died without stopping its tree; killed what was left"
            );
        }
    }
}

impl Process {
    /// Waits for the end; says how it ended.
    async fn wait(&mut self) -> String {
        match self {
            Process::Child(s) => {
                let status = match s.child.wait().await {
                    Ok(st) => st.to_string(),
                    Err(e) => e.to_string(),
                };
                s.sweep_if_abandoned().await;
                status
            }
            Process::Task { join, .. } => match join.await {
                Ok(()) => "the built-in agent stopped".into(),
                Err(e) => format!("the built-in agent failed: {e}"),
            },
        }
    }

    /// Stops it: SIGTERM to the supervisor (which stops the tree), SIGKILL if it does not
    /// end in time; or cancels the task.
    async fn kill(&mut self) {
        match self {
            Process::Child(s) => {
                stop_supervisor(&mut s.child).await;
                s.sweep_if_abandoned().await;
            }
            Process::Task { join, cancel } => {
                cancel.cancel();
                if tokio::time::timeout(KILL_GRACE, &mut *join).await.is_err() {
                    join.abort();
                }
            }
        }
    }
}

/// What acpd tells a hosted agent in `initialize`: the first client's capabilities, with
/// terminal auth (both its forms) said true whatever that client said: acpd runs an agent's
/// terminal login itself, on this host (`acpd agent login`, or `/acp/login` for acp-shim),
/// and an agent such as claude-agent-acp lists its terminal methods only to a client that
/// can run them. Clients never see those methods as the agent wrote them
/// (`acp::initialize::auth_methods`).
fn initialize_params(client_init: &Value) -> Value {
    let mut caps = client_init
        .get("clientCapabilities")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    match caps.get_mut("auth").and_then(Value::as_object_mut) {
        Some(auth) => {
            auth.insert("terminal".into(), json!(true));
        }
        None => caps["auth"] = json!({ "terminal": true }),
    }
    match caps.get_mut("_meta").and_then(Value::as_object_mut) {
        Some(meta) => {
            meta.insert("terminal-auth".into(), json!(true));
        }
        None => caps["_meta"] = json!({ "terminal-auth": true }),
    }
    let mut params = json!({ "protocolVersion": 1, "clientCapabilities": caps });
    if let Some(info) = client_init.get("clientInfo") {
        params["clientInfo"] = info.clone();
    }
    params
}

/// `acpd _supervise -- PROGRAM ARGS`: acpd itself (`/proc/self/exe`, so a binary replaced
/// on disk since acpd started still runs as the same build) between acpd and the agent.
fn spawn_process(profile: &AgentProfile, records: &Path) -> std::io::Result<Child> {
    let owner = std::process::id() as i32;
    let opts = supervisor::Options {
        owner,
        grace: KILL_GRACE,
        records: Some(records.to_owned()),
        program: profile.program.clone().into(),
        args: profile.args.iter().map(Into::into).collect(),
    };
    let mut cmd = Command::new("/proc/self/exe");
    // The supervisor passes its environment on to the agent unchanged.
    home::apply(cmd.as_std_mut(), profile);
    cmd.arg0("acpd")
        .arg(supervisor::SUBCOMMAND)
        .args(opts.to_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Not SIGKILL on drop: that would leave the tree behind (`Supervised`'s `Drop`).
        .kill_on_drop(false)
        .process_group(0);
    if let Some(cwd) = &profile.cwd {
        cmd.current_dir(cwd);
    }
    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(move || {
            // SIGTERM, not SIGKILL: the supervisor takes it and stops the agent's tree.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // acpd may have died between fork and prctl.
            if libc::getppid() != owner {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// SIGTERM to the supervisor; SIGKILL if it has not stopped the tree within its own grace
/// twice over (it SIGKILLs what ignores SIGTERM after one grace).
async fn stop_supervisor(child: &mut Child) {
    if let Some(pid) = child.id() {
        let pgid = pid as libc::pid_t;
        // SAFETY: plain syscall on a process group we created.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        if tokio::time::timeout(SUPERVISOR_GRACE, child.wait())
            .await
            .is_err()
        {
            // SAFETY: as above.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
    let _ = child.wait().await;
}

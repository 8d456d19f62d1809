//! The login process in a pseudo-terminal (`portable-pty`): spawned with the profile's
//! environment, cwd and HOME, its output and exit read on threads of their own (the PTY is
//! blocking I/O), its input written on another, and its whole process group killed when the
//! login is ended early.

use std::io::{Read, Write};

use portable_pty::{CommandBuilder, MasterPty, PtySize, native_pty_system};
use tokio::sync::{mpsc, oneshot};

use crate::agent::login::LoginCommand;
use crate::config::AgentProfile;

/// Output chunks buffered between the reader thread and the link.
const OUTPUT_QUEUE: usize = 64;

/// Why a login did not start (its text goes to the client that asked for it).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot create {}: {source}", path.display())]
    Home {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open a pseudo-terminal: {0}")]
    Open(String),
    #[error("cannot start {program:?}: {reason}")]
    Start { program: String, reason: String },
    #[error("pseudo-terminal: {0}")]
    Io(String),
}

/// How the login ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub code: i32,
    pub signal: Option<String>,
}

/// A running login: its terminal, its input and its process.
pub struct Pty {
    /// Behind a lock only to be `Sync` (the link's future holds it across awaits).
    master: std::sync::Mutex<Box<dyn MasterPty + Send>>,
    input: mpsc::Sender<Vec<u8>>,
    pid: Option<i32>,
    /// Terminal output, until the terminal closes.
    pub output: mpsc::Receiver<Vec<u8>>,
    /// The exit status, once.
    pub exited: oneshot::Receiver<Ended>,
}

/// The size of a terminal.
pub fn size(cols: u16, rows: u16) -> PtySize {
    PtySize {
        rows: rows.max(1),
        cols: cols.max(1),
        pixel_width: 0,
        pixel_height: 0,
    }
}

/// `acpd _login-exec PROGRAM ARGS…`: what runs in the login's terminal. It drops the
/// capabilities that read other processes' `/proc` (the bounding set, as for hosted agents),
/// then becomes PROGRAM (same pid, terminal and environment).
pub const EXEC_SUBCOMMAND: &str = "_login-exec";

/// The `_login-exec` side: returns only when PROGRAM cannot be started (exit 127, as a shell).
pub fn exec_main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    use std::os::unix::process::CommandExt;
    let Some((program, rest)) = args.split_first() else {
        return std::process::ExitCode::from(64);
    };
    acpd_builtin::child_env::drop_proc_reading_caps();
    let e = std::process::Command::new(program).args(rest).exec();
    // The terminal's reader shows this to the person logging in; no logging is set up here.
    let _ = writeln!(
        std::io::stderr(),
        "cannot start {}: {e}",
        program.to_string_lossy()
    );
    std::process::ExitCode::from(127)
}

/// Starts `login` for `profile` in a new pseudo-terminal of `cols`×`rows`.
pub fn spawn(
    login: &LoginCommand,
    profile: &AgentProfile,
    cols: u16,
    rows: u16,
) -> Result<Pty, SpawnError> {
    if let Some(home) = &profile.home {
        crate::agent::home::prepare(home).map_err(|source| SpawnError::Home {
            path: home.clone(),
            source,
        })?;
    }
    let pair = native_pty_system()
        .openpty(size(cols, rows))
        .map_err(|e| SpawnError::Open(e.to_string()))?;
    // Through acpd itself (`exec_main`): portable-pty has no pre-exec hook, and a login run
    // as root must lose what a hosted agent loses (`child_env::clean`).
    let mut cmd = CommandBuilder::new("/proc/self/exe");
    cmd.arg(EXEC_SUBCOMMAND);
    cmd.arg(&login.program);
    cmd.args(&login.args);
    cmd.env_clear();
    for (k, v) in environment(profile, login) {
        cmd.env(k, v);
    }
    cmd.env("TERM", "xterm-256color");
    match &profile.cwd {
        Some(cwd) => cmd.cwd(cwd),
        None => cmd.cwd(profile.home.clone().unwrap_or_else(std::env::temp_dir)),
    }
    let mut child = pair
        .slave
        .spawn_command(cmd)
        .map_err(|e| SpawnError::Start {
            program: login.program.clone(),
            reason: e.to_string(),
        })?;
    // Only the child holds the terminal's other end: its exit closes our reader.
    drop(pair.slave);
    let pid = child.process_id().map(|p| p as i32);
    let reader = pair
        .master
        .try_clone_reader()
        .map_err(|e| SpawnError::Io(e.to_string()))?;
    let writer = pair
        .master
        .take_writer()
        .map_err(|e| SpawnError::Io(e.to_string()))?;
    let (out_tx, output) = mpsc::channel(OUTPUT_QUEUE);
    let (in_tx, in_rx) = mpsc::channel(OUTPUT_QUEUE);
    let (exit_tx, exited) = oneshot::channel();
    std::thread::spawn(move || read_output(reader, out_tx));
    std::thread::spawn(move || write_input(writer, in_rx));
    std::thread::spawn(move || {
        let ended = match child.wait() {
            Ok(s) => Ended {
                code: s.exit_code() as i32,
                signal: s.signal().map(str::to_owned),
            },
            Err(e) => Ended {
                code: 1,
                signal: Some(e.to_string()),
            },
        };
        let _ = exit_tx.send(ended);
    });
    Ok(Pty {
        master: std::sync::Mutex::new(pair.master),
        input: in_tx,
        pid,
        output,
        exited,
    })
}

/// The login's whole environment: what a hosted agent of the profile gets (`home::apply`'s
/// allowlist, HOME, `pass_env`, `env`), then the login method's own `env`.
fn environment(profile: &AgentProfile, login: &LoginCommand) -> Vec<(String, String)> {
    let lossy = |(k, v): (std::ffi::OsString, std::ffi::OsString)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    };
    let mut env: Vec<(String, String)> = acpd_builtin::child_env::allowed(std::env::vars_os())
        .into_iter()
        .map(lossy)
        .collect();
    env.extend(crate::agent::home::env(profile));
    env.extend(
        acpd_builtin::child_env::passed(&profile.pass_env)
            .into_iter()
            .map(|(k, v)| (k, v.to_string_lossy().into_owned())),
    );
    env.extend(profile.env.iter().cloned());
    env.extend(login.env.iter().cloned());
    env
}

fn read_output(mut reader: Box<dyn Read + Send>, out: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            // EIO once the login (and all that shares its terminal) has gone: the end.
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out.blocking_send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        }
    }
}

fn write_input(mut writer: Box<dyn Write + Send>, mut input: mpsc::Receiver<Vec<u8>>) {
    while let Some(bytes) = input.blocking_recv() {
        if writer
            .write_all(&bytes)
            .and_then(|_| writer.flush())
            .is_err()
        {
            return;
        }
    }
}

impl Pty {
    /// The login's process id (the leader of its process group).
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Types `bytes` into the login's terminal; `false` once its input is gone.
    pub async fn type_in(&self, bytes: Vec<u8>) -> bool {
        self.input.send(bytes).await.is_ok()
    }

    pub fn resize(&self, cols: u16, rows: u16) {
        let master = self.master.lock().unwrap_or_else(|p| p.into_inner());
        let _ = master.resize(size(cols, rows));
    }

    /// Ends the login and everything it started in its terminal (its process group).
    pub fn kill(&self) {
        if let Some(pid) = self.pid.and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        self.kill();
    }
}

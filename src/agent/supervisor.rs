//! The per-agent supervisor: `acpd _supervise [OPTIONS] -- PROGRAM ARGS…`, acpd re-executed
//! between itself and a hosted agent so that the agent's whole process tree ends with it.
//!
//! It dies with acpd (`PR_SET_PDEATHSIG` SIGTERM, and a poll of its parent), is the
//! subreaper of everything below it (`PR_SET_CHILD_SUBREAPER`: a grandchild whose parent
//! exits is reparented here, not to init), and runs the agent in a process group of its own
//! with the stdio it was given (the pipes acpd reads: inherited, never copied). When the
//! agent exits, or acpd stops it (SIGTERM) or dies, it kills the tree — the group and every
//! descendant — with SIGTERM, then SIGKILL after a grace, and exits as the agent did.
//! `record` is its file in the data directory; `tree` reads `/proc` and sends the signals.
//! It runs before the tokio runtime exists: one thread, blocking calls, signals taken
//! synchronously with `sigtimedwait`.
//!
//! Every process a hosted agent starts is in this subtree or the agent's group, and ends when
//! the agent ends, acpd stops it or acpd dies (tests/it
//! `agent_supervision::no_process_of_a_wrapped_agent_tree_outlives_acpd_killed_with_sigkill`).

pub mod record;
pub mod tree;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitStatus};

use record::{Proc, Record};

/// A line on stderr (acpd's log while acpd lives). Never `eprintln!`, which panics when
/// the pipe is gone — exactly when acpd has died and the tree must still be stopped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "acpd supervisor: {}", format_args!($($arg)*));
    }};
}

/// The hidden subcommand (argv\[1\]) that runs this mode.
pub const SUBCOMMAND: &str = "_supervise";

/// What acpd passes on the supervisor's command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// acpd's pid: the supervisor stops when its parent is no longer this one.
    pub owner: i32,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Where the tree's record goes (`None`: no record).
    pub records: Option<PathBuf>,
    pub program: OsString,
    pub args: Vec<OsString>,
}

impl Options {
    /// The supervisor's arguments (after the subcommand).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            "--owner".into(),
            self.owner.to_string().into(),
            "--grace-ms".into(),
            self.grace.as_millis().to_string().into(),
        ];
        if let Some(dir) = &self.records {
            v.push("--records".into());
            v.push(dir.clone().into());
        }
        v.push("--".into());
        v.push(self.program.clone());
        v.extend(self.args.iter().cloned());
        v
    }

    pub fn parse(args: &[OsString]) -> Result<Options, String> {
        let mut owner = None;
        let mut grace = Duration::from_secs(2);
        let mut records = None;
        let mut it = args.iter();
        loop {
            let Some(a) = it.next() else {
                return Err("missing -- PROGRAM".into());
            };
            let mut value = || it.next().ok_or_else(|| format!("{a:?} needs a value"));
            match a.to_str() {
                Some("--owner") => {
                    owner = value()?.to_str().and_then(|v| v.parse().ok());
                }
                Some("--grace-ms") => {
                    let ms = value()?.to_str().and_then(|v| v.parse().ok());
                    grace = Duration::from_millis(ms.ok_or("--grace-ms needs a number")?);
                }
                Some("--records") => records = Some(PathBuf::from(value()?)),
                Some("--") => break,
                _ => return Err(format!("unknown argument {a:?}")),
            }
        }
        let program = it.next().ok_or("missing PROGRAM after --")?.clone();
        Ok(Options {
            owner: owner.ok_or("--owner PID is required")?,
            grace,
            records,
            program,
            args: it.cloned().collect(),
        })
    }
}

/// Why the supervisor is ending the tree.
enum End {
    Exited(WaitStatus),
    Signal(i32),
    OwnerGone,
}

/// `acpd _supervise …`: runs the agent; returns (or dies) as the agent ended.
pub fn main(args: &[OsString]) -> ExitCode {
    let opts = match Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            say!("{e}");
            return ExitCode::from(64);
        }
    };
    match run(&opts) {
        Ok(status) => exit_as(status),
        Err(e) => {
            say!("{e}");
            ExitCode::from(127)
        }
    }
}

fn run(opts: &Options) -> Result<Option<WaitStatus>, String> {
    let signals = block_signals().map_err(|e| format!("cannot block signals: {e}"))?;
    // Inherited across exec already; set again so it holds whatever exec'd us.
    rustix::process::set_parent_process_death_signal(Some(Signal::TERM))
        .map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    if owner_gone(opts.owner) {
        return Err("acpd is already gone".into());
    }
    let me = Proc::current().ok_or("cannot read /proc/self/stat")?;
    rustix::process::set_child_subreaper(Pid::from_raw(me.pid))
        .map_err(|e| format!("PR_SET_CHILD_SUBREAPER: {e}"))?;
    let agent = spawn_agent(opts, me)?;
    release_stdio();
    let record_path = write_record(opts, me, agent);
    let mut status = None;
    let end = watch(opts, agent, &signals, &mut status);
    match &end {
        End::Exited(_) => {}
        End::Signal(sig) => say!("signal {sig}: stopping the agent"),
        End::OwnerGone => say!("acpd is gone: stopping the agent"),
    }
    let mut members = || {
        let procs = tree::all();
        tree::descendants(&procs, me.pid)
            .into_iter()
            .filter(|p| procs.get(p).is_some_and(|s| !s.zombie))
            .collect()
    };
    let stubborn = tree::kill_tree(&mut members, &[agent], opts.grace, true, &mut |pid, s| {
        if pid == agent {
            status = Some(s);
        }
    });
    if stubborn > 0 {
        say!(
            "{stubborn} process(es) ignored SIGTERM for {} ms: SIGKILLed",
            opts.grace.as_millis()
        );
    }
    if let Some(p) = record_path {
        let _ = std::fs::remove_file(p);
    }
    Ok(match end {
        End::Exited(s) => Some(s),
        _ => status,
    })
}

/// Starts the agent in its own process group, marked as this tree's, with the signal mask
/// cleared and a parent-death signal; returns its pid.
fn spawn_agent(opts: &Options, me: Proc) -> Result<i32, String> {
    let marker = record::marker(me);
    let mut cmd = std::process::Command::new(&opts.program);
    cmd.args(&opts.args)
        .env(tree::MARKER_VAR, &marker)
        .process_group(0);
    let supervisor = me.pid;
    // SAFETY: only async-signal-safe calls (sigprocmask, prctl, getppid, kill, getpid)
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // The signals the supervisor blocked for `sigtimedwait` must reach the agent:
            // a blocked mask is inherited across exec (and by everything the agent starts).
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The agent itself dies if the supervisor is SIGKILLed (its descendants are
            // what the record is for).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != supervisor {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", opts.program))?;
    let agent = child.id() as i32;
    // The std handle is not used to wait: `tree::reap` collects every child, the agent too.
    drop(child);
    Ok(agent)
}

/// The tree's record in `--records` (acpd kills what it names after a crash); its path.
fn write_record(opts: &Options, me: Proc, agent: i32) -> Option<std::path::PathBuf> {
    let record = Record {
        owner: Proc {
            pid: opts.owner,
            start: tree::stat(opts.owner).map_or(0, |s| s.start),
        },
        supervisor: me,
        group: agent,
    };
    opts.records
        .as_ref()
        .and_then(|dir| match record.write(dir) {
            Ok(p) => Some(p),
            Err(e) => {
                say!("cannot write the tree record in {dir:?}: {e}");
                None
            }
        })
}

/// Waits for the agent to exit, a signal, or acpd to be gone; `status` takes the agent's exit.
fn watch(
    opts: &Options,
    agent: i32,
    signals: &libc::sigset_t,
    status: &mut Option<WaitStatus>,
) -> End {
    loop {
        tree::reap(|pid, s| {
            if pid == agent {
                *status = Some(s);
            }
        });
        if let Some(s) = *status {
            break End::Exited(s);
        }
        if owner_gone(opts.owner) {
            break End::OwnerGone;
        }
        match wait_signal(signals, Duration::from_millis(500)) {
            Some(libc::SIGCHLD) | None => {}
            Some(sig) => break End::Signal(sig),
        }
    }
}

/// The supervisor keeps no copy of the agent's stdin/stdout: acpd sees their end when the
/// tree lets go of them. Its stderr stays (its own messages go to acpd's log).
fn release_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto our own standard descriptors.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

fn owner_gone(owner: i32) -> bool {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get()) != owner
}

/// Blocks the signals the supervisor takes with `sigtimedwait`.
fn block_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: plain libc calls on a set we own; single-threaded at this point.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGCHLD,
        ] {
            libc::sigaddset(&mut set, s);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(set)
    }
}

fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the set and timespec outlive the call; a null siginfo is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

/// Ends the supervisor the way the agent ended: its exit code, or its signal re-raised.
fn exit_as(status: Option<WaitStatus>) -> ExitCode {
    let Some(status) = status else {
        return ExitCode::from(1);
    };
    if let Some(code) = status.exit_status() {
        return ExitCode::from(code as u8);
    }
    if let Some(sig) = status.terminating_signal() {
        // SAFETY: restoring the default action and unblocking, then raising it at ourselves.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        return ExitCode::from(128u8.wrapping_add(sig as u8));
    }
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_through_the_command_line() {
        let opts = Options {
            owner: 42,
            grace: Duration::from_millis(1500),
            records: Some("/data/agent-trees".into()),
            program: "sh".into(),
            args: vec!["-c".into(), "exec agent --flag -- x".into()],
        };
        assert_eq!(Options::parse(&opts.to_args()), Ok(opts.clone()));
        let none = Options {
            records: None,
            ..opts
        };
        assert_eq!(Options::parse(&none.to_args()), Ok(none));
        assert!(Options::parse(&["--owner".into(), "1".into()]).is_err());
        assert!(Options::parse(&["--".into(), "x".into()]).is_err());
    }
}

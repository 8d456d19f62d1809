//! Process trees from `/proc`: who descends from whom, who carries a tree's marker, and
//! killing a whole tree (SIGTERM, a grace, SIGKILL) while reaping what becomes a zombie.
//!
//! No I/O beyond `/proc` reads and signals; used by the supervisor (its own tree) and by acpd
//! at start (trees an earlier acpd left behind).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

/// The environment variable every process of a supervised tree inherits: `<supervisor
/// pid>:<its start time>`, so a tree is recognisable after its supervisor is gone.
pub const MARKER_VAR: &str = "ACPD_AGENT_TREE";

/// What `/proc/PID/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: i32,
    pub pgrp: i32,
    /// Clock ticks after boot; with the pid, it names one process for good.
    pub start: u64,
    pub zombie: bool,
}

/// Parses the text of `/proc/PID/stat` (the command name may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        zombie: matches!(*fields.first()?, "Z" | "X"),
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

pub fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` is a live (not zombie) process that started at `start`.
pub fn alive_as(pid: i32, start: u64) -> bool {
    stat(pid).is_some_and(|s| s.start == start && !s.zombie)
}

/// Every process visible in `/proc` with its stat.
pub fn all() -> HashMap<i32, Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// The descendants of `root` in `procs` (not `root` itself), parents before children.
pub fn descendants(procs: &HashMap<i32, Stat>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, s) in procs {
        children.entry(s.ppid).or_default().push(*pid);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for c in children.get(&p).into_iter().flatten() {
            if seen.insert(*c) {
                out.push(*c);
                next.push(*c);
            }
        }
    }
    out
}

/// Whether the environment of `pid` holds `MARKER_VAR=marker` (readable only for our own
/// user's processes, which is all a tree of ours can hold).
pub fn has_marker(pid: i32, marker: &str) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{MARKER_VAR}={marker}");
    env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

pub fn signal(pid: i32, sig: Signal) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

pub fn signal_group(pgid: i32, sig: Signal) {
    if let Some(pgid) = Pid::from_raw(pgid) {
        let _ = rustix::process::kill_process_group(pgid, sig);
    }
}

/// Reaps every child that has ended; calls `on_exit` with each one's pid and status.
pub fn reap(mut on_exit: impl FnMut(i32, WaitStatus)) {
    while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
        on_exit(pid.as_raw_nonzero().get(), status);
    }
}

/// Which processes make up a tree, asked again at every step of a kill (it may still fork).
pub trait Members {
    fn members(&mut self) -> Vec<i32>;
}

impl<F: FnMut() -> Vec<i32>> Members for F {
    fn members(&mut self) -> Vec<i32> {
        self()
    }
}

/// SIGTERM to every member, SIGKILL to what is left after `grace`, until none is left (or
/// `grace` more has passed after the SIGKILL: a process in uninterruptible sleep dies when
/// it wakes). `groups` are signalled too (a member may be between fork and exec). Zombies
/// are reaped on the way when `reap_children` (we are their parent or subreaper).
/// Returns how many were still there when SIGKILL went out.
pub fn kill_tree(
    tree: &mut dyn Members,
    groups: &[i32],
    grace: Duration,
    reap_children: bool,
    on_exit: &mut dyn FnMut(i32, WaitStatus),
) -> usize {
    if send(Signal::TERM, tree, groups) == 0
        && groups.iter().all(|g| !group_exists(*g, reap_children))
    {
        return 0;
    }
    let left = wait_gone(Instant::now() + grace, tree, groups, reap_children, on_exit);
    if left == 0 {
        return 0;
    }
    send(Signal::KILL, tree, groups);
    wait_gone(Instant::now() + grace, tree, groups, reap_children, on_exit);
    left
}

fn send(sig: Signal, tree: &mut dyn Members, groups: &[i32]) -> usize {
    for g in groups {
        signal_group(*g, sig);
    }
    let members = tree.members();
    for p in &members {
        signal(*p, sig);
    }
    members.len()
}

/// Polls until the tree and the groups are empty or `until`; returns how many are left.
fn wait_gone(
    until: Instant,
    tree: &mut dyn Members,
    groups: &[i32],
    reap_children: bool,
    on_exit: &mut dyn FnMut(i32, WaitStatus),
) -> usize {
    loop {
        if reap_children {
            reap(&mut *on_exit);
        }
        let left = tree.members().len()
            + groups
                .iter()
                .filter(|g| group_exists(**g, reap_children))
                .count();
        if left == 0 || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process group still has a member. A group of zombies only we could reap counts
/// as gone when we are not reaping (`reaping` false: someone else's children).
fn group_exists(pgid: i32, reaping: bool) -> bool {
    let Some(pid) = Pid::from_raw(pgid) else {
        return false;
    };
    if rustix::process::test_kill_process_group(pid).is_err() {
        return false;
    }
    // kill(2) succeeds on zombies: look for a member that is not one.
    reaping || all().values().any(|s| s.pgrp == pgid && !s.zombie)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_an_awkward_command_name() {
        let text = "4242 (sh -c (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(text).expect("parses");
        assert_eq!(
            s,
            Stat {
                ppid: 17,
                pgrp: 4242,
                start: 987654,
                zombie: false
            }
        );
        assert!(
            parse_stat("1 (x) Z 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 5")
                .unwrap()
                .zombie
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn descendants_walk_the_whole_tree_and_nothing_else() {
        let p = |ppid| Stat {
            ppid,
            pgrp: 1,
            start: 0,
            zombie: false,
        };
        let procs: HashMap<i32, Stat> = [
            (10, p(1)),
            (11, p(10)),
            (12, p(11)),
            (13, p(10)),
            (20, p(1)),
            (21, p(20)),
        ]
        .into();
        let mut d = descendants(&procs, 10);
        d.sort();
        assert_eq!(d, [11, 12, 13]);
        assert!(descendants(&procs, 12).is_empty());
    }
}

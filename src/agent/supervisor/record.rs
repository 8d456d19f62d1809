//! The record of one supervised tree, a small file in `<data_dir>/agent-trees/`: which acpd
//! owns it, its supervisor, the agent's process group and the marker its processes carry.
//!
//! The supervisor writes it once the agent runs and removes it when the tree is gone. A
//! record left behind means a supervisor died without cleaning up (SIGKILLed, OOM); the next
//! acpd (`reap_stale`) and the owning acpd, when it sees its supervisor die, kill what is left.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tree;

/// One process, named for good: its pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub start: u64,
}

impl Proc {
    pub fn current() -> Option<Proc> {
        let pid = std::process::id() as i32;
        Some(Proc {
            pid,
            start: tree::stat(pid)?.start,
        })
    }

    pub fn alive(&self) -> bool {
        tree::alive_as(self.pid, self.start)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub owner: Proc,
    pub supervisor: Proc,
    pub group: i32,
}

impl Record {
    /// The value of `tree::MARKER_VAR` in the tree's processes.
    pub fn marker(&self) -> String {
        marker(self.supervisor)
    }

    pub fn file_name(&self) -> String {
        file_name(self.supervisor)
    }

    pub fn to_text(&self) -> String {
        format!(
            "owner {} {}\nsupervisor {} {}\ngroup {}\n",
            self.owner.pid,
            self.owner.start,
            self.supervisor.pid,
            self.supervisor.start,
            self.group
        )
    }

    pub fn parse(text: &str) -> Option<Record> {
        let mut owner = None;
        let mut supervisor = None;
        let mut group = None;
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let proc_of = |w: &[&str]| {
                Some(Proc {
                    pid: w.get(1)?.parse().ok()?,
                    start: w.get(2)?.parse().ok()?,
                })
            };
            match words.first() {
                Some(&"owner") => owner = proc_of(&words),
                Some(&"supervisor") => supervisor = proc_of(&words),
                Some(&"group") => group = words.get(1).and_then(|g| g.parse().ok()),
                _ => {}
            }
        }
        Some(Record {
            owner: owner?,
            supervisor: supervisor?,
            group: group?,
        })
    }

    /// Written whole or not at all (a temporary file renamed into place).
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(self.file_name());
        let tmp = dir.join(format!(".{}.tmp", self.file_name()));
        std::fs::write(&tmp, self.to_text())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The processes of the tree still alive, the supervisor aside: those carrying its
    /// marker, and those in the agent's process group that started after the supervisor (a
    /// process that cleared its environment stays in the group unless it left it on purpose).
    pub fn leftovers(&self) -> Vec<i32> {
        let marker = self.marker();
        let me = std::process::id() as i32;
        tree::all()
            .into_iter()
            .filter(|(pid, s)| *pid != me && *pid != self.supervisor.pid && !s.zombie)
            .filter(|(pid, s)| {
                (s.pgrp == self.group && s.start >= self.supervisor.start)
                    || tree::has_marker(*pid, &marker)
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Kills what is left of a tree whose supervisor is gone (SIGTERM, `grace`, SIGKILL);
    /// returns how many processes there were.
    pub fn sweep(&self, grace: Duration) -> usize {
        let found = self.leftovers().len();
        if found > 0 {
            let mut members = || self.leftovers();
            tree::kill_tree(&mut members, &[], grace, false, &mut |_, _| {});
        }
        found
    }
}

/// The record's file name: the supervisor's pid and start time.
pub fn file_name(supervisor: Proc) -> String {
    format!("{}-{}.tree", supervisor.pid, supervisor.start)
}

pub fn marker(supervisor: Proc) -> String {
    format!("{}:{}", supervisor.pid, supervisor.start)
}

/// At acpd's start: every tree whose owning acpd is gone is stopped — its supervisor asked
/// to stop (it kills its tree), then whatever is left killed — and its record removed.
/// Trees of another live acpd on the same data directory are left alone. Returns the number
/// of processes that were still there.
pub fn reap_stale(dir: &Path, grace: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut reaped = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "tree") {
            continue;
        }
        let Some(record) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| Record::parse(&t))
        else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if record.owner.alive() {
            continue;
        }
        if record.supervisor.alive() {
            reaped += 1;
            tree::signal(record.supervisor.pid, rustix::process::Signal::TERM);
            let until = std::time::Instant::now() + grace * 2 + Duration::from_secs(1);
            while record.supervisor.alive() && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            if record.supervisor.alive() {
                tree::signal(record.supervisor.pid, rustix::process::Signal::KILL);
            }
        }
        reaped += record.sweep(grace);
        tracing::warn!(record = %path.display(), owner = record.owner.pid, supervisor = record.supervisor.pid, "stopped an agent process tree an earlier acpd left behind");
        let _ = std::fs::remove_file(&path);
    }
    reaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let r = Record {
            owner: Proc { pid: 10, start: 99 },
            supervisor: Proc {
                pid: 11,
                start: 100,
            },
            group: 12,
        };
        assert_eq!(Record::parse(&r.to_text()), Some(r.clone()));
        assert_eq!(r.file_name(), "11-100.tree");
        assert_eq!(r.marker(), "11:100");
        assert_eq!(Record::parse("owner 1 2\ngroup 3\n"), None);
    }
}

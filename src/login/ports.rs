//! The loopback TCP ports a login's process tree listens on, read from `/proc`.
//!
//! Why `/proc` (through the `procfs` crate) and not watching what the login prints: an OAuth
//! login's callback URL is often only inside the browser URL it prints (URL-encoded, or not
//! printed at all), while its listening socket is certain. A socket belongs to the login when
//! one of the tree's processes holds it (`/proc/PID/fd` → `socket:[INODE]`), so another
//! program listening on the same host is never forwarded; the table is read in the login's
//! own network namespace (`/proc/PID/net/tcp{,6}`). No extra privilege is needed: the login
//! runs as acpd's user and is dumpable after its `exec`.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;

use procfs::net::TcpState;
use procfs::process::{FDTarget, Process};

/// The ports on which the processes of the tree rooted at `root` listen on a loopback (or
/// wildcard) address; empty when `/proc` cannot say.
pub fn listening(root: i32) -> BTreeSet<u16> {
    let pids = tree(root);
    let mut inodes = HashSet::new();
    for pid in &pids {
        let Ok(fds) = Process::new(*pid).and_then(|p| p.fd()) else {
            continue;
        };
        for fd in fds.flatten() {
            if let FDTarget::Socket(inode) = fd.target {
                inodes.insert(inode);
            }
        }
    }
    let Ok(p) = Process::new(root) else {
        return BTreeSet::new();
    };
    let mut table = Vec::new();
    for entries in [p.tcp(), p.tcp6()].into_iter().flatten() {
        table.extend(
            entries
                .into_iter()
                .map(|e| (e.local_address, e.state == TcpState::Listen, e.inode)),
        );
    }
    loopback_listeners(&table, &inodes)
}

/// `root` and every process descended from it.
fn tree(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = match procfs::process::all_processes() {
        Ok(all) => all
            .flatten()
            .filter_map(|p| p.stat().ok().map(|s| (s.pid, s.ppid)))
            .collect(),
        Err(_) => vec![],
    };
    descendants(root, &parents)
}

/// `root` and its descendants, from `(pid, ppid)` pairs.
fn descendants(root: i32, parents: &[(i32, i32)]) -> Vec<i32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(
            parents
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && !out.contains(pid))
                .map(|(pid, _)| *pid)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    out
}

/// The listening sockets among `table` (`(local address, listening, inode)`) that are ours
/// (`inodes`) and reachable on loopback.
fn loopback_listeners(table: &[(SocketAddr, bool, u64)], inodes: &HashSet<u64>) -> BTreeSet<u16> {
    table
        .iter()
        .filter(|(addr, listen, inode)| {
            *listen
                && inodes.contains(inode)
                && (addr.ip().is_loopback() || addr.ip().is_unspecified())
        })
        .map(|(addr, _, _)| addr.port())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_listening_loopback_sockets_count() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let table = [
            (a("127.0.0.1:8085"), true, 1),
            (a("[::1]:9000"), true, 2),
            (a("0.0.0.0:7000"), true, 3),
            (a("10.0.0.5:7001"), true, 4),
            (a("127.0.0.1:5000"), false, 5),
            (a("127.0.0.1:6000"), true, 99),
        ];
        let ours = HashSet::from([1, 2, 3, 4, 5]);
        let got: Vec<u16> = loopback_listeners(&table, &ours).into_iter().collect();
        assert_eq!(got, [7000, 8085, 9000]);
    }

    #[test]
    fn the_tree_is_every_descendant() {
        let parents = [(2, 1), (3, 2), (4, 3), (5, 1), (9, 8)];
        let mut t = descendants(2, &parents);
        t.sort();
        assert_eq!(t, [2, 3, 4]);
    }

    #[test]
    fn a_real_listener_of_this_process_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(std::process::id() as i32).contains(&port));
    }
}

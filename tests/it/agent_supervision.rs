//! A hosted agent's whole process tree ends with it: an agent started through a shell
//! wrapper (not `exec`) that leaves a grandchild ignoring SIGTERM and stdin EOF, and an
//! orphan whose parent already exited — like the npm `codex-acp` wrapper and its native
//! binary. Whether acpd is SIGKILLed, stopped with SIGTERM, or the agent exits, no process
//! of the tree survives (checked in `/proc` for every pid the tree recorded); a tree whose
//! supervisor was SIGKILLed along with acpd is reaped by the next acpd at start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::daemon::{process_alive, wait_all_dead};
use crate::support::{Client, Daemon, DaemonOptions, scripted_agent_bin};

/// How long a tree may take to go (the supervisor's grace is 2 s before SIGKILL).
const GONE_WITHIN: Duration = Duration::from_secs(8);

/// A wrapper script that records every pid of its tree as a file in `pids`: the wrapper
/// itself, a grandchild that ignores SIGTERM (and holds the agent's stdout, never reading
/// stdin), an orphan (its parent exits at once) that ignores SIGTERM, and the agent.
pub fn tree_wrapper(dir: &Path, pids: &Path) -> PathBuf {
    std::fs::create_dir_all(pids).unwrap();
    let script = format!(
        r#"P='{pids}'
touch "$P/$$"
(trap '' TERM; exec sleep 1000) &
touch "$P/$!"
(sh -c "trap '' TERM; exec sleep 1000" & touch "$P/$!")
'{agent}' --pid-dir "$P"
status=$?
exit $status
"#,
        pids = pids.display(),
        agent = scripted_agent_bin(),
    );
    let path = dir.join("wrapper.sh");
    std::fs::write(&path, script).unwrap();
    path
}

fn pids_in(dir: &Path) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort();
    pids
}

struct Tree {
    _dir: tempfile::TempDir,
    pids: PathBuf,
    daemon: Daemon,
}

/// A daemon whose `tree` profile runs the wrapper.
async fn daemon_with_tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let wrapper = tree_wrapper(dir.path(), &pids);
    let daemon = Daemon::start_with(
        DaemonOptions::default().arg("--agent", format!("tree=sh '{}'", wrapper.display())),
    )
    .await;
    Tree {
        _dir: dir,
        pids,
        daemon,
    }
}

/// Starts the tree (one turn on it) and returns its recorded pids, all alive.
async fn start_tree(t: &Tree) -> (Client, String, Vec<i32>) {
    let mut client = Client::connect_ws(&format!("{}?agent=tree", t.daemon.ws_url()))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    client.initialize().await;
    let sid = client.open_session(&t.daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "echo hi").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
    let mut pids = pids_in(&t.pids);
    for _ in 0..100 {
        if pids.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        pids = pids_in(&t.pids);
    }
    assert_eq!(
        pids.len(),
        4,
        "wrapper, grandchild, orphan, agent: {pids:?}"
    );
    let dead: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|p| !process_alive(*p))
        .collect();
    assert!(dead.is_empty(), "tree processes already gone: {dead:?}");
    (client, sid, pids)
}

/// The signals `pid` blocks, as `/proc/PID/status` shows them.
fn blocked_signals(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("SigBlk:")).unwrap();
    line.split_whitespace().nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn the_agent_starts_with_no_signal_blocked() {
    // The supervisor blocks the signals it takes with sigtimedwait; an agent run directly
    // (no shell in between, which would reset its mask) must not inherit that mask, or it
    // could never be stopped with SIGTERM.
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    client.prompt(&sid, "echo hi").await.1.unwrap();
    let pids = daemon.agent_pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    assert_eq!(blocked_signals(pids[0]), "0000000000000000");
}

fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test]
async fn no_process_of_a_wrapped_agent_tree_outlives_acpd_killed_with_sigkill() {
    let mut t = daemon_with_tree().await;
    let (_client, _, pids) = start_tree(&t).await;
    t.daemon.kill().await;
    let alive = wait_all_dead(&pids, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "processes of the agent's tree outlived acpd (SIGKILL): {alive:?}"
    );
}

#[tokio::test]
async fn sigterm_to_acpd_stops_the_whole_tree() {
    let mut t = daemon_with_tree().await;
    let (_client, _, pids) = start_tree(&t).await;
    let status = t.daemon.sigterm().await;
    assert!(status.success(), "acpd exited with {status} on SIGTERM");
    let alive = wait_all_dead(&pids, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "processes of the agent's tree outlived acpd (SIGTERM): {alive:?}"
    );
}

#[tokio::test]
async fn an_agent_that_exits_takes_its_tree_with_it() {
    let t = daemon_with_tree().await;
    let (mut client, sid, pids) = start_tree(&t).await;
    let (_, result) = client.prompt(&sid, "crash").await;
    assert!(result.is_err(), "a crashed agent fails the turn");
    let alive = wait_all_dead(&pids, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "processes of the agent's tree outlived the agent: {alive:?}"
    );
    // The next turn starts a new tree.
    let (_, result) = client.prompt(&sid, "echo again").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

#[tokio::test]
async fn a_tree_whose_supervisor_was_sigkilled_is_swept_by_acpd() {
    let t = daemon_with_tree().await;
    let (_client, _, pids) = start_tree(&t).await;
    let wrapper = pids[0];
    let supervisor = ppid(wrapper).expect("the wrapper's parent");
    assert_eq!(
        ppid(supervisor),
        Some(t.daemon.pid()),
        "acpd → supervisor → wrapper"
    );
    // SAFETY: plain syscall on a process of the daemon under test.
    unsafe { libc::kill(supervisor, libc::SIGKILL) };
    let alive = wait_all_dead(&pids, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "what a SIGKILLed supervisor left was not swept: {alive:?}"
    );
}

#[tokio::test]
async fn the_next_acpd_reaps_a_tree_left_behind() {
    let mut t = daemon_with_tree().await;
    let (_client, _, pids) = start_tree(&t).await;
    let supervisor = ppid(pids[0]).expect("the wrapper's parent");
    // Freeze acpd so it cannot sweep, kill the supervisor, then acpd: nothing stops the tree.
    // SAFETY: plain syscalls on processes of the daemon under test.
    unsafe {
        libc::kill(t.daemon.pid(), libc::SIGSTOP);
        libc::kill(supervisor, libc::SIGKILL);
    }
    t.daemon.kill().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left: Vec<i32> = pids.iter().copied().filter(|p| process_alive(*p)).collect();
    assert!(
        left.len() >= 2,
        "the SIGTERM-ignoring grandchild and orphan should be left behind: {left:?} of {pids:?}"
    );
    t.daemon.restart().await;
    let alive = wait_all_dead(&left, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "the next acpd did not reap the tree left behind: {alive:?}"
    );
}

#[tokio::test]
async fn an_idle_agent_stops_with_its_tree_when_its_last_session_closes() {
    let dir = tempfile::tempdir().unwrap();
    let pids_dir = dir.path().join("pids");
    let wrapper = tree_wrapper(dir.path(), &pids_dir);
    let t = Tree {
        daemon: Daemon::start_with(
            DaemonOptions::default()
                .arg("--agent", format!("tree=sh '{}'", wrapper.display()))
                .arg("--agent-idle-stop-secs", 1),
        )
        .await,
        pids: pids_dir,
        _dir: dir,
    };
    let (mut client, sid, pids) = start_tree(&t).await;
    // A session still holds the agent: idle or not, it keeps running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dead: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|p| !process_alive(*p))
        .collect();
    assert!(dead.is_empty(), "stopped under a live session: {dead:?}");
    client
        .request("session/close", serde_json::json!({ "sessionId": sid }))
        .await
        .expect("session/close");
    let alive = wait_all_dead(&pids, GONE_WITHIN).await;
    assert!(
        alive.is_empty(),
        "an idle agent without sessions kept (part of) its tree: {alive:?}"
    );
    // The next session starts it again.
    let sid = client.open_session(&t.daemon.work_dir()).await;
    let (_, result) = client.prompt(&sid, "echo back").await;
    assert_eq!(result.unwrap()["stopReason"], "end_turn");
}

//! Replicas on one Postgres (`--replicas`): a live session is owned by one replica through
//! a lease; another replica refuses it (-32012, naming the owner) while the lease lives,
//! takes it over once the owner is dead and its lease expired (journal whole, seqs going
//! on), fences a paused owner that comes back, and gets it at once from a draining one. A
//! token revoked in the shared store is cut off on every replica.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::support::{
    Client, Daemon, DaemonOptions, RpcError, agent_texts, assert_consecutive, seqs,
};

/// The code of "this session is live on another replica".
const OWNED_ELSEWHERE: i64 = -32012;

/// A cluster's shared secret, in a file of the test's own.
pub(super) struct Secret {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub(super) fn secret() -> Secret {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cluster-secret");
    std::fs::write(&path, "test-cluster-secret-0123456789\n").expect("write secret");
    Secret { _dir: dir, path }
}

/// Options of replica `name` with leases of `ttl_ms`.
pub(super) fn replica(name: &str, ttl_ms: u64, secret: &Path) -> DaemonOptions {
    let mut opts = DaemonOptions::default()
        .arg("--replica-id", name)
        .arg("--lease-ttl-ms", ttl_ms)
        .arg("--cluster-secret-file", secret.display());
    opts.args.push("--replicas".into());
    opts
}

/// `session/load` until it is not refused as owned elsewhere (the owner's lease has to
/// expire first), at most `within`; the replay and the answer.
pub(super) async fn load_when_free(
    client: &mut Client,
    sid: &str,
    cwd: &Path,
    within: Duration,
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let deadline = Instant::now() + within;
    loop {
        let (replay, answer) = client.load(sid, cwd).await;
        match answer {
            Ok(answer) => return (replay, answer),
            Err(RpcError { code, .. }) if code == OWNED_ELSEWHERE => {
                assert!(
                    Instant::now() < deadline,
                    "the session was not taken over within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("load failed: {e}"),
        }
    }
}

/// A load on a replica that does not own the session: refused, naming the owner.
async fn assert_owned_by(client: &mut Client, sid: &str, cwd: &Path, owner: &str) {
    let (_, answer) = client.load(sid, cwd).await;
    let err = answer.expect_err("another replica owns the session");
    assert_eq!(err.code, OWNED_ELSEWHERE, "{err}");
    let data = err.data.expect("error data");
    assert_eq!(data["acpd"]["owner"], owner, "{data}");
}

/// A long turn: a chunk every 150 ms.
fn slow_script(prefix: &str, n: usize) -> String {
    (1..=n)
        .map(|i| format!("echo {prefix}{i}\nsleep 150"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn an_owner_killed_mid_turn_is_taken_over_after_its_lease_with_the_journal_whole() {
    let s = secret();
    let opts = |name| replica(name, 1500, &s.path).advertise();
    let mut a = Daemon::start_with(opts("a").postgres()).await;
    let b = Daemon::start_beside(&a, opts("b")).await;
    let c = Daemon::start_beside(&a, opts("c")).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;
    let (_, first) = on_a.prompt(&sid, "echo one").await;
    assert_eq!(first.expect("turn on a")["stopReason"], "end_turn");

    // A owns it; B serves it by forwarding to A.
    let mut on_b = b.client().await;
    let (replay, loaded) = on_b.load(&sid, &cwd).await;
    loaded.expect("load through b");
    assert_eq!(agent_texts(&replay), ["one"]);

    // kill -9 in the middle of a turn.
    on_a.send_prompt(&sid, &slow_script("mid", 40)).await;
    on_a.updates_until_text("mid2").await;
    a.kill().await;

    // C takes it over once A's lease has expired (until then A is unreachable: -32012): the
    // journal is whole, seqs 1..n.
    let mut on_c = c.client().await;
    load_when_free(&mut on_c, &sid, &cwd, Duration::from_secs(15)).await;
    let mut reader = c.client().await;
    let replay = super::attach_all(&mut reader, &sid).await;
    assert_consecutive(&replay);
    assert_eq!(seqs(&replay).first(), Some(&1));
    let texts = agent_texts(&replay);
    assert_eq!(texts[0], "one");
    assert!(texts.contains(&"mid2".to_owned()), "{texts:?}");
    let mut uniq = texts.clone();
    uniq.dedup();
    assert_eq!(uniq, texts, "no entry twice");

    // C's turns go on from there.
    let last = *seqs(&replay).last().expect("a replay");
    let (updates, after) = on_c.prompt(&sid, "echo after").await;
    assert_eq!(after.expect("turn on c")["stopReason"], "end_turn");
    // `last + 1` is the prompt itself, journaled but not echoed to the client that sent it.
    assert_eq!(seqs(&updates).first(), Some(&(last + 2)), "{updates:?}");
    assert_consecutive(&updates);

    // Re-attaching anywhere shows the same journal: B now forwards to C.
    let mut again = b.client().await;
    let whole = super::attach_all(&mut again, &sid).await;
    assert_consecutive(&whole);
    let mut expected = texts.clone();
    expected.push("after".into());
    assert_eq!(agent_texts(&whole), expected);
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_paused_owner_resumed_after_a_takeover_is_fenced_and_lets_go() {
    let s = secret();
    let a = Daemon::start_with(replica("a", 1000, &s.path).postgres()).await;
    let b = Daemon::start_beside(&a, replica("b", 1000, &s.path)).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;
    let (_, first) = on_a.prompt(&sid, "echo one").await;
    assert_eq!(first.expect("turn on a")["stopReason"], "end_turn");

    // A streams a long turn and is paused in the middle of it; its agent streams on.
    let turn = on_a.send_prompt(&sid, &slow_script("p", 20)).await;
    on_a.updates_until_text("p1").await;
    // SAFETY: plain syscalls on the daemon's own pid.
    unsafe { libc::kill(a.pid(), libc::SIGSTOP) };
    let mut on_b = b.client().await;
    let took = load_when_free(&mut on_b, &sid, &cwd, Duration::from_secs(15)).await;
    let taken = super::words(&super::history(&took.0));
    unsafe { libc::kill(a.pid(), libc::SIGCONT) };

    // A comes back, finds its lease gone or its appends fenced, and lets the session go:
    // the turn is answered "moved", never end_turn.
    let answer = on_a.wait_response(&turn).await;
    let err = answer.expect_err("a fenced owner cannot finish the turn");
    assert_eq!(err.code, OWNED_ELSEWHERE, "{err}");

    // Nothing of A after the takeover is in the journal: B's turn follows straight on.
    let (_, after) = on_b.prompt(&sid, "echo after-b").await;
    assert_eq!(after.expect("turn on b")["stopReason"], "end_turn");
    let mut reader = b.client().await;
    let replay = super::attach_all(&mut reader, &sid).await;
    assert_consecutive(&replay);
    assert_eq!(super::words(&replay), format!("{taken}after-b"));
    let log = std::fs::read_to_string(a.log_path()).unwrap_or_default();
    assert!(
        log.contains("letting the session go") || log.contains("letting it go"),
        "a says it let go"
    );
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn sigterm_hands_the_sessions_over_without_waiting_for_the_lease() {
    let s = secret();
    // A lease far longer than the test: only a hand-off can move the session in time.
    let mut a = Daemon::start_with(replica("a", 120_000, &s.path).postgres()).await;
    let b = Daemon::start_beside(&a, replica("b", 120_000, &s.path)).await;
    let cwd = a.work_dir();
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&cwd).await;
    let (_, first) = on_a.prompt(&sid, "echo one").await;
    assert_eq!(first.expect("turn on a")["stopReason"], "end_turn");
    let mut on_b = b.client().await;
    assert_owned_by(&mut on_b, &sid, &cwd, "a").await;

    assert!(a.sigterm().await.success(), "a drains cleanly");
    let (replay, _) = load_when_free(&mut on_b, &sid, &cwd, Duration::from_secs(5)).await;
    assert_eq!(agent_texts(&replay), ["one"]);
    let (_, next) = on_b.prompt(&sid, "echo two").await;
    assert_eq!(next.expect("turn on b")["stopReason"], "end_turn");
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn a_token_revoked_once_cuts_its_connections_on_every_replica() {
    use crate::support::security_support::{self as sec, acpd, bearer};
    let s = secret();
    let a = Daemon::start_with(replica("a", 1500, &s.path).postgres().auth()).await;
    // A's first-start token first: a daemon accepts connections before its auth setup, and
    // B, seeing A's token in the store, writes none of its own (and vice versa).
    sec::local_token(&a).await;
    let b = Daemon::start_beside(&a, replica("b", 1500, &s.path).auth()).await;
    let token = sec::token_create(&a, "mallory").await;
    let (h, v) = bearer(&token);
    let mut on_a = sec::client(&a.ws_url(), &[(h, &v)], None).await;
    let mut on_b = sec::client(&b.ws_url(), &[(h, &v)], None).await;

    let data = a.dir().join("data").display().to_string();
    let store = a.store_url();
    let list = acpd(&["token", "list", "--data-dir", &data, "--store", &store]).await;
    let id = list
        .stdout
        .lines()
        .find(|l| l.split('\t').nth(1) == Some("mallory"))
        .and_then(|l| l.split('\t').next())
        .expect("mallory's token")
        .to_owned();
    let run = acpd(&[
        "token",
        "revoke",
        &id,
        "--data-dir",
        &data,
        "--store",
        &store,
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Announced by the CLI (NOTIFY), heard by every replica; the 2 s polls are the backstop.
    let within = Duration::from_secs(10);
    let cut = tokio::time::timeout(within, async {
        tokio::join!(on_a.wait_closed(), on_b.wait_closed())
    });
    cut.await.expect("both replicas cut the revoked token off");
    // Heard through Postgres (LISTEN/NOTIFY), not only found by a poll.
    for replica in [&a, &b] {
        let log = std::fs::read_to_string(replica.log_path()).unwrap_or_default();
        assert!(
            log.contains("revocation signalled by the store"),
            "the revocation was announced to every replica"
        );
    }
}

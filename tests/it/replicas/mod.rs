//! Several acpd on one store. Without `replicas = true` a second daemon must never lose an
//! entry silently: on SQLite it refuses to start, on Postgres a journal append at a seq
//! another daemon already wrote is an error, never a no-op. With it (`takeover.rs`), sessions
//! are leased: one owner at a time, a dead owner taken over, a paused one fenced; with
//! `--advertise-url` (`forwarding.rs`) a non-owner forwards a session to its owner (joined
//! mid-turn, across a dropped link: `mid_turn.rs`), over TLS
//! when the owner advertises `wss://` (`tls.rs`).

mod forwarding;
mod mid_turn;
mod takeover;
mod tls;

use serde_json::Value;

use crate::support::{
    Client, Daemon, DaemonOptions, agent_texts, assert_consecutive, assert_increasing, chunk_text,
    kind,
};

#[tokio::test]
async fn a_second_daemon_on_the_same_sqlite_file_refuses_to_start() {
    let mut first = Daemon::start_with(DaemonOptions::default().sqlite()).await;
    let (status, stderr) = Daemon::run_beside_to_exit(&first).await;
    assert!(
        !status.success(),
        "the second daemon must not run: {status}"
    );
    assert!(
        stderr.contains("already serves the SQLite store")
            && stderr.contains(&format!("pid {}", first.pid())),
        "one clear line naming the holder: {stderr}"
    );
    // The first daemon is untouched.
    let mut client = first.client().await;
    client.open_session(&first.work_dir()).await;
    // The lock dies with its process, however it dies: a restart after SIGKILL takes it.
    first.restart().await;
    let mut client = first.client().await;
    client.open_session(&first.work_dir()).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn on_postgres_a_second_daemon_writing_a_taken_seq_fails_the_turn_instead_of_dropping_it() {
    let a = Daemon::start_with(DaemonOptions::default().postgres()).await;
    let b = Daemon::start_beside(&a, DaemonOptions::default()).await;
    let mut on_a = a.client().await;
    let sid = on_a.open_session(&a.work_dir()).await;
    let (_, first) = on_a.prompt(&sid, "echo one").await;
    assert_eq!(first.expect("turn on a")["stopReason"], "end_turn");

    // B opens the session (its next seq is the journal's end now), then A moves on.
    let mut on_b = b.client().await;
    let (_, loaded) = on_b.load(&sid, &a.work_dir()).await;
    loaded.expect("b loads the session");
    let (_, second) = on_a.prompt(&sid, "echo two-from-a").await;
    assert_eq!(second.expect("second turn on a")["stopReason"], "end_turn");

    // B's turn lands on seqs A already holds: an error, not a silent end_turn.
    let (_, on_b_result) = on_b.prompt(&sid, "echo three-from-b").await;
    // Which error depends on where the refused entry lands: mid-turn it is "rejected update";
    // when the turn's very first entry (its prompt) is refused, before the turn is under way,
    // the session ends and the prompt is answered with a generic internal error. Either way
    // it is an error, never `end_turn` over entries that were not stored.
    let err = on_b_result.expect_err("b's turn cannot be journaled");
    assert_eq!(err.code, -32603, "{err}");

    // The journal holds A's turns whole and none of B's.
    let mut reader = a.client().await;
    let (replay, reloaded) = reader.load(&sid, &a.work_dir()).await;
    reloaded.expect("reload on a");
    let texts: Vec<&str> = replay
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .filter_map(|u| chunk_text(u))
        .collect();
    assert_eq!(texts, ["one", "two-from-a"]);
}

#[tokio::test]
async fn replicas_without_postgres_or_a_secret_is_a_bad_config() {
    use crate::support::security_support::acpd;
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().display().to_string();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123").expect("write secret");
    let secret = secret.display().to_string();
    let pg = "postgres://postgres@127.0.0.1:5432/none";
    let cases: [(&[&str], &str); 3] = [
        (
            &["--cluster-secret-file", &secret],
            "needs a Postgres store",
        ),
        (&["--store", pg], "cluster secret"),
        (
            &[
                "--store",
                pg,
                "--cluster-secret-file",
                &secret,
                "--lease-ttl-ms",
                "10",
            ],
            "lease_ttl_ms",
        ),
    ];
    for (extra, why) in cases {
        let mut args = vec!["check-config", "--data-dir", &data, "--replicas"];
        args.extend_from_slice(extra);
        let run = acpd(&args).await;
        assert_eq!(run.code, Some(64), "{extra:?}: {}", run.stderr);
        assert!(run.stderr.contains(why), "{extra:?}: {}", run.stderr);
    }
    let ok = acpd(&[
        "check-config",
        "--data-dir",
        &data,
        "--replicas",
        "--store",
        pg,
        "--cluster-secret-file",
        &secret,
    ])
    .await;
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
}

/// Prompts `n` echo lines on `sid` through `client` (a replica that does not own the session):
/// the turn ends normally and every chunk comes once, in order, under consecutive seqs.
async fn prompt_through(client: &mut Client, sid: &str, n: usize) -> Vec<Value> {
    let script: String = (1..=n)
        .map(|i| format!("echo chunk-{i}"))
        .collect::<Vec<_>>()
        .join("\n");
    let (updates, answer) = client.prompt(sid, &script).await;
    assert_eq!(
        answer.expect("the turn through a non-owner")["stopReason"],
        "end_turn"
    );
    let expected: Vec<String> = (1..=n).map(|i| format!("chunk-{i}")).collect();
    assert_eq!(
        agent_texts(&updates),
        expected,
        "every update once, in order"
    );
    assert_consecutive(&updates);
    updates
}

/// A `session/load` replay's history: what precedes the session's state updates that end it
/// (commands, mode, config options, each once), in seq order.
fn history(replay: &[Value]) -> Vec<Value> {
    const STATE: [&str; 3] = [
        "available_commands_update",
        "current_mode_update",
        "config_option_update",
    ];
    let n = replay
        .iter()
        .rev()
        .take_while(|u| STATE.contains(&kind(u)))
        .count();
    let history = &replay[..replay.len() - n];
    assert!(
        !history.iter().any(|u| STATE.contains(&kind(u))),
        "the state comes after the history"
    );
    assert_increasing(history);
    history.to_vec()
}

/// The agent's words in `updates`, in order (a load merges each message's chunks into one).
fn words(updates: &[Value]) -> String {
    agent_texts(updates).concat()
}

/// Every update of `sid` in the journal, one per seq: `_acpd/session/attach` from the start
/// (a load merges messages).
async fn attach_all(client: &mut Client, sid: &str) -> Vec<Value> {
    let params = serde_json::json!({ "sessionId": sid, "afterSeq": 0 });
    let id = client.send_request("_acpd/session/attach", params).await;
    let (all, result) = client.collect_updates_until_response(&id).await;
    result.expect("attach from the start");
    all
}

//! Child environments are explicit: a hosted agent (and its supervisor) and a built-in
//! shell command see none of acpd's secrets — not in their own environment, not through
//! `/proc/<acpd>/environ` — while a profile's `env` and `pass_env` (and `[builtin]
//! shell_env`) reach them. A hosted agent's over-long stderr line does not grow acpd.

use std::time::Duration;

use serde_json::json;

use crate::builtin_support::model::{text, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};
use crate::support::scripted_agent_bin;

/// What acpd is started with: each value must stay inside acpd.
const SECRETS: [(&str, &str); 4] = [
    ("ANTHROPIC_API_KEY", "anthropic-secret-7d1f"),
    ("OPENAI_API_KEY", "openai-secret-91ac"),
    ("ACPD_CLUSTER_SECRET", "cluster-secret-5be2-5be2-5be2"),
    ("ACPD_TEST_TOKEN", "token-secret-c0de"),
];

fn env_with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    SECRETS
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

fn assert_no_secret(what: &str, seen: &str) {
    for (name, value) in SECRETS {
        assert!(!seen.contains(value), "{what} sees {name}:\n{seen}");
    }
}

fn read(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).replace('\0', "\n")
}

/// A hosted-agent profile: `sh -c` that records its environment, the supervisor's and
/// acpd's (`/proc/<pid>/environ`) into `dir`, then becomes the scripted agent.
fn recording_profile(dir: &std::path::Path) -> String {
    let d = dir.display();
    let script = format!(
        "env > {d}/agent-env; \
         cat /proc/$PPID/environ > {d}/supervisor-environ 2>/dev/null; \
         acpd=$(cut -d' ' -f4 /proc/$PPID/stat); echo $acpd > {d}/acpd-pid; \
         cat /proc/$acpd/environ > {d}/acpd-environ 2>/dev/null; \
         exec {}",
        scripted_agent_bin()
    );
    format!(
        "default_agent = \"rec\"\n[agents.rec]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\n\
         env = {{ GIVEN = \"from-profile\" }}\npass_env = [\"PASSED\"]\n"
    )
}

#[tokio::test]
async fn a_hosted_agent_sees_none_of_acpds_secrets_but_its_profile_env() {
    let rec = tempfile::tempdir().expect("tempdir");
    let env = env_with(&[("PASSED", "passed-by-name"), ("LC_TIME", "C")]);
    let acpd = Acpd::start_with_env(&recording_profile(rec.path()), &env).await;
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let r = ed.prompt(&sid, "echo still works").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");

    let agent_env = read(&rec.path().join("agent-env"));
    assert_no_secret("the agent's environment", &agent_env);
    for wanted in [
        "GIVEN=from-profile",
        "PASSED=passed-by-name",
        "LC_TIME=C",
        "PATH=",
    ] {
        assert!(agent_env.contains(wanted), "{wanted} missing:\n{agent_env}");
    }
    assert_no_secret(
        "the supervisor's environ",
        &read(&rec.path().join("supervisor-environ")),
    );
    let pid = read(&rec.path().join("acpd-pid"));
    assert_eq!(pid.trim(), acpd.pid().to_string(), "the agent found acpd");
    assert_no_secret(
        "acpd's /proc environ",
        &read(&rec.path().join("acpd-environ")),
    );
}

#[tokio::test]
async fn a_builtin_shell_command_sees_none_of_acpds_secrets_but_shell_env() {
    let model = ModelServer::start().await;
    let config = builtin_config(model.addr, "shell_env = { GIVEN = \"from-config\" }");
    let acpd = Acpd::start_with_env(&config, &env_with(&[])).await;
    let command = "env; echo ---; cat /proc/$PPID/environ | tr '\\0' '\\n'; echo parent=$PPID";
    model.push_stream(vec![tool("shell", json!({ "command": command }))]);
    model.push_stream(vec![text("done")]);
    let mut ed = acpd.editor(no_caps()).await;
    ed.answer_permissions(&["allow_once"]);
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let r = ed.prompt(&sid, "look around").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let output = model.wait_requests(2).await[1].text();
    assert!(
        output.contains(&format!("parent={}", acpd.pid())),
        "{output}"
    );
    assert!(output.contains("GIVEN=from-config"), "{output}");
    assert!(output.contains("PATH="), "{output}");
    assert_no_secret("a shell command", &output);
}

#[tokio::test]
async fn an_endless_agent_stderr_line_does_not_grow_acpd() {
    let d = "head -c 104857600 /dev/zero | tr '\\0' x >&2; echo >&2; echo after-the-long-line >&2";
    let script = format!("{d}; exec {}", scripted_agent_bin());
    let config = format!(
        "default_agent = \"loud\"\n[agents.loud]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\n"
    );
    let acpd = Acpd::start(&config).await;
    let kib = |field: &str| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", acpd.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let before = kib("VmRSS:");
    let mut ed = acpd.editor(no_caps()).await;
    // The agent answers `initialize` only after the whole line went through acpd.
    let (sid, _) = tokio::time::timeout(
        Duration::from_secs(60),
        ed.new_session(&acpd.work(), json!({})),
    )
    .await
    .expect("session/new in time");
    let r = ed.prompt(&sid, "echo fine").await.expect("prompt");
    assert_eq!(r["stopReason"], "end_turn");
    let peak = kib("VmHWM:");
    assert!(
        peak < before + 60 * 1024,
        "acpd grew from {before} KiB to a peak of {peak} KiB"
    );
    let log = acpd.log();
    assert!(log.contains("more bytes discarded"), "the cut is logged");
    assert!(
        log.contains("after-the-long-line"),
        "the next line is logged"
    );
}

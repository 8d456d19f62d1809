//! What `acpd serve` says at start for a person who just installed it: where editors
//! connect, the token file, a console sign-in link that works, a warning when the default
//! (built-in) agent has no model; and the demo model, which answers a whole turn without a key.

use tokio::io::BufReader;

use crate::logging::{sigterm, spawn_piped, until_listening};
use crate::support::http::request_path;
use crate::support::{Client, agent_texts};

#[tokio::test]
async fn serve_prints_a_console_sign_in_link_and_warns_of_a_missing_model_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = spawn_piped(dir.path(), &["--default-agent", "builtin"], &[]);
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (addr, seen) = until_listening(&mut stderr).await;

    assert!(
        seen.contains(&format!("editors connect to ws://{addr}/acp")),
        "{seen}"
    );
    assert!(
        seen.contains("data/token"),
        "the token file is named:\n{seen}"
    );
    let warning = seen
        .lines()
        .find(|l| l.contains("WARN") && l.contains("the built-in agent"))
        .unwrap_or_else(|| panic!("no warning about the built-in agent:\n{seen}"));
    for hint in [
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "ACPD_MODEL=demo",
        "--agent",
    ] {
        assert!(warning.contains(hint), "{hint} missing from {warning:?}");
    }

    let prefix = format!("http://{addr}/login#code=");
    let code: String = seen
        .split_once(&prefix)
        .unwrap_or_else(|| panic!("no sign-in link {prefix}… in the start log:\n{seen}"))
        .1
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || "-_".contains(*c))
        .collect();
    let body = serde_json::json!({ "code": code }).to_string();
    let origin = format!("http://{addr}");
    let headers = [("Content-Type", "application/json"), ("Origin", &origin)];
    let signed_in = request_path(addr, "POST", "/web/api/login", &headers, &body).await;
    assert_eq!(
        signed_in.status, 200,
        "the link signs in: {}",
        signed_in.body
    );
    let again = request_path(addr, "POST", "/web/api/login", &headers, &body).await;
    assert_ne!(again.status, 200, "and only once");

    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
}

#[tokio::test]
async fn the_demo_model_answers_a_whole_turn_without_a_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The session's cwd: beside the data directory, never around it.
    let work = tempfile::tempdir().expect("temp dir");
    let args = ["--no-auth", "--default-agent", "builtin"];
    let mut child = spawn_piped(dir.path(), &args, &[("ACPD_MODEL", "demo")]);
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (addr, seen) = until_listening(&mut stderr).await;
    assert!(
        !seen.contains("the built-in agent will refuse") && !seen.contains("has no model"),
        "no warning with the demo model:\n{seen}"
    );
    // The log goes on being read, so it never fills the pipe.
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
    });

    let mut client = Client::connect_ws(&format!("ws://{addr}/acp"))
        .await
        .expect("connect to acpd");
    client.initialize().await;
    let sid = client.new_session(work.path()).await;
    let (updates, result) = client.prompt(&sid, "hello, demo").await;
    assert_eq!(result.expect("prompt")["stopReason"], "end_turn");
    let texts = agent_texts(&updates);
    assert!(texts.len() > 1, "the answer streams in pieces: {texts:?}");
    let text = texts.concat();
    assert!(text.starts_with("[acpd demo model]"), "{text}");
    assert!(text.contains("hello, demo"), "{text}");
    assert!(text.contains("not an AI model"), "{text}");

    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
}

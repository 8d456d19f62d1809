//! Hosted agents that fail, and logging them in: an agent that fails at start is started a
//! handful of times a minute however often clients ask (crash-loop backoff), and the error
//! says when the next start is and where its stderr went; an agent's "authentication
//! required" names `acpd agent login NAME`, which runs the agent's terminal login (or the
//! profile's `login`) with the profile's HOME; a profile's `home` is the agent's HOME.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::support::{Client, Daemon, DaemonOptions, acpd_bin, scripted_agent_bin};

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn an_agent_that_fails_at_start_is_started_a_handful_of_times_and_told_when_next() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let script = dir.path().join("broken.sh");
    write(
        &script,
        &format!(
            "echo start >> '{}'\necho 'broken agent: no configuration' >&2\nexit 1\n",
            starts.display()
        ),
    );
    let daemon = Daemon::start_with(
        DaemonOptions::default().arg("--agent", format!("broken=sh '{}'", script.display())),
    )
    .await;
    let mut client = Client::connect_ws(&format!("{}?agent=broken", daemon.ws_url()))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    let params = json!({ "protocolVersion": 1, "clientCapabilities": {} });
    let until = Instant::now() + Duration::from_secs(5);
    let mut errors = vec![];
    while Instant::now() < until {
        let e = client
            .request("initialize", params.clone())
            .await
            .expect_err("a broken agent cannot initialize");
        errors.push(e);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = std::fs::read_to_string(&starts).unwrap().lines().count();
    // Starts at 0 s, 0 s, 2 s (then 6 s): three in five seconds, whatever the request rate.
    assert!(
        (2..=4).contains(&started),
        "{started} starts for {} requests in 5 s",
        errors.len()
    );
    assert!(errors.len() > 10, "only {} requests", errors.len());
    let first = &errors[0];
    assert!(
        first.message.contains("acpd::agent_stderr"),
        "a failed start says where the agent's stderr is: {first}"
    );
    let backing_off = errors
        .iter()
        .find(|e| e.message.contains("starts it again at"))
        .unwrap_or_else(|| panic!("no error said when the next start is: {:?}", errors[1]));
    assert!(
        backing_off.message.contains("acpd::agent_stderr"),
        "{backing_off}"
    );
    let data = &backing_off.data.as_ref().expect("error data")["acpd"];
    assert!(
        crate::support::is_rfc3339(data["nextStart"].as_str().unwrap_or_default()),
        "{data}"
    );
    assert!(
        data["retryAfterMs"].as_u64().is_some_and(|ms| ms <= 60_000),
        "{data}"
    );
    assert!(data["failures"].as_u64().is_some_and(|n| n >= 2), "{data}");
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(
        log.contains("broken agent: no configuration"),
        "the agent's stderr is in acpd's log"
    );
    let (_, metrics) = crate::operations::http_get(daemon.addr, "/metrics").await;
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}")) as u64
    };
    assert_eq!(value("acpd_agent_start_failures_total"), started as u64);
    assert!(value("acpd_agent_backoff_refusals_total") >= errors.len() as u64 - started as u64 - 1);
    assert!(value("acpd_agent_backoffs_total") >= 1);
}

#[tokio::test]
async fn auth_required_from_an_agent_names_the_login_command() {
    let daemon = Daemon::start().await;
    let mut client = daemon.client().await;
    let sid = client.open_session(&daemon.work_dir()).await;
    let (_, result) = client
        .prompt(&sid, "error -32000 Authentication required")
        .await;
    let e = result.expect_err("the agent refused");
    assert_eq!(e.code, -32000, "{e}");
    assert!(
        e.message.contains("acpd agent login scripted"),
        "the error names the login command: {e}"
    );
    assert_eq!(
        e.data.as_ref().unwrap()["acpd"]["login"],
        "acpd agent login scripted"
    );
}

/// Runs `acpd agent login NAME ARGS`; returns its exit code and stderr.
async fn login(name: &str, args: &[String]) -> (Option<i32>, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(acpd_bin())
            .args(["agent", "login", name])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("acpd agent login ended")
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn agent_login_runs_the_agents_terminal_auth_method() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let agent = format!(
        "scripted='{}' --pid-dir '{}'",
        scripted_agent_bin(),
        pids.display()
    );
    let data = dir.path().join("data").display().to_string();
    let (code, stderr) = login(
        "scripted",
        &["--data-dir".into(), data, "--agent".into(), agent],
    )
    .await;
    // The scripted agent advertises a terminal method with args ["--login"]: its scripted
    // login, which gets no code here (no terminal input) and exits 2; acpd ran it, and passed
    // its exit code on.
    assert!(
        stderr.contains("--pid-dir") && stderr.contains("--login`"),
        "acpd shows the command it runs: {stderr}"
    );
    assert_eq!(code, Some(2), "{stderr}");
}

#[tokio::test]
async fn agent_login_runs_the_profiles_login_with_its_home() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("acpd.toml");
    write(
        &config,
        r#"
[agents.mine]
command = "sh"
args = ["-c", "exit 3"]
home = "homes/mine"
login = ["sh", "-c", "echo \"$HOME\" > \"$HOME/login-ran\""]
"#,
    );
    let (code, stderr) = login(
        "mine",
        &[
            "--config".into(),
            config.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let home = data.join("homes/mine");
    let ran = std::fs::read_to_string(home.join("login-ran")).expect("the login ran in HOME");
    assert_eq!(ran.trim(), home.display().to_string());
    let (code, stderr) = login("nope", &["--config".into(), config.display().to_string()]).await;
    assert_eq!(code, Some(64), "{stderr}");
}

#[tokio::test]
async fn each_profile_home_is_its_agents_home() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("acpd.toml");
    let mut text = String::new();
    for name in ["a", "b"] {
        let out = dir.path().join(format!("{name}.home"));
        text.push_str(&format!(
            "[agents.{name}]\ncommand = \"sh\"\nargs = [\"-c\", \"echo \\\"$HOME $XDG_CONFIG_HOME\\\" > '{}'; exec '{}'\"]\nhome = \"homes/{name}\"\n\n",
            out.display(),
            scripted_agent_bin()
        ));
    }
    write(&config, &text);
    let daemon =
        Daemon::start_with(DaemonOptions::default().arg("--config", config.display())).await;
    for name in ["a", "b"] {
        let mut client = Client::connect_ws(&format!("{}?agent={name}", daemon.ws_url()))
            .await
            .unwrap();
        client.initialize().await;
        let seen = std::fs::read_to_string(dir.path().join(format!("{name}.home"))).unwrap();
        let home = daemon.dir().join("data/homes").join(name);
        assert_eq!(
            seen.trim(),
            format!("{} {}/.config", home.display(), home.display())
        );
        let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", home.display());
    }
}

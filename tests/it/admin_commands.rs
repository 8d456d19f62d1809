//! The admin commands as a container runs them: `docker exec … acpd token create` inherits
//! the image's `ACPD_LISTEN=0.0.0.0:7420` (no TLS in the environment), and must still work
//! against the store, since it opens no listener. `serve` keeps refusing that listener.

use tokio::process::Command;

use crate::support::http::request_path;
use crate::support::security_support::{
    RawDaemon, Run, bearer, read_token, run_to_end, upgrade_status,
};

/// The container's listener: every interface, no certificate.
const CONTAINER_LISTEN: &str = "0.0.0.0:7420";

/// `acpd ARGS` to completion with the container's environment over `data_dir`, and none of
/// the test runner's own `ACPD_*` settings.
async fn in_container(data_dir: &std::path::Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_acpd"));
    cmd.args(args)
        .env("ACPD_LISTEN", CONTAINER_LISTEN)
        .env("ACPD_DATA_DIR", data_dir);
    for key in [
        "ACPD_CONFIG",
        "ACPD_STORE",
        "ACPD_TLS_CERT",
        "ACPD_TLS_KEY",
        "ACPD_INSECURE",
        "ACPD_NO_AUTH",
        "ACPD_TCP_LISTEN",
    ] {
        cmd.env_remove(key);
    }
    run_to_end(cmd, args).await
}

#[tokio::test]
async fn token_create_and_web_login_work_where_the_serve_listener_would_be_refused() {
    // The daemon that serves this store (loopback here; in the container, behind TLS).
    let (daemon, addrs) =
        RawDaemon::start(&["--listen", "127.0.0.1:0"], &["acpd listening: "]).await;
    let addr = addrs[0];
    let data = daemon.data_dir();
    // Its migrations are done once its first-start token is written.
    read_token(&data).await;

    let created = in_container(&data, &["token", "create", "--name", "alice"]).await;
    assert_eq!(
        created.code,
        Some(0),
        "token create with ACPD_LISTEN={CONTAINER_LISTEN}: {}",
        created.stderr
    );
    let secret = created.stdout.trim();
    let url = format!("ws://{addr}/acp");
    let (status, body) = upgrade_status(&url, &[(bearer(secret).0, &bearer(secret).1)], None).await;
    assert_eq!(
        status, 101,
        "the new token is accepted by the daemon: {body}"
    );

    let login = in_container(&data, &["web-login", "--principal", "alice"]).await;
    assert_eq!(login.code, Some(0), "web-login: {}", login.stderr);
    let link = login.stdout.trim();
    // The link names the container's port on loopback (a `docker run -p` maps it there).
    let code = link
        .strip_prefix("http://127.0.0.1:7420/login#code=")
        .unwrap_or_else(|| panic!("unexpected link {link:?}"));
    let body = serde_json::json!({ "code": code }).to_string();
    let origin = format!("http://{addr}");
    let headers = [("Content-Type", "application/json"), ("Origin", &origin)];
    let signed_in = request_path(addr, "POST", "/web/api/login", &headers, &body).await;
    assert_eq!(
        signed_in.status, 200,
        "the code signs in: {}",
        signed_in.body
    );

    let listed = in_container(&data, &["token", "list"]).await;
    assert_eq!(listed.code, Some(0), "token list: {}", listed.stderr);
    assert!(listed.stdout.contains("\talice\t"), "{}", listed.stdout);
}

#[tokio::test]
async fn serve_and_check_config_still_refuse_a_public_listener_without_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    for command in ["serve", "check-config"] {
        let run = in_container(&data, &[command]).await;
        assert_eq!(run.code, Some(64), "{command}: {}", run.stderr);
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(
            lines,
            [format!(
                "acpd: refusing to serve {CONTAINER_LISTEN} without TLS: give --tls-cert/--tls-key (or --insecure)"
            )],
            "{command} says why in one line"
        );
    }
    assert!(!data.exists(), "a refused serve touches no data directory");
}

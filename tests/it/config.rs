//! Configuration: the documented defaults (the book's reference, config/acpd.toml) are the code's,
//! the data directory is private to its owner, and acp-shim finds a loopback daemon's token
//! where `ACPD_DATA_DIR` says.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use acpd::{Setting, config_reference};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::security_support::{RawDaemon, acpd, bearer, client, read_token};
use crate::support::{DEFAULT_TIMEOUT, shim_bin};

/// Where the settings are documented, one row each.
const REFERENCE: &str = "docs/src/configuration.md";

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A default as the reference's table writes it.
fn cell(default: &Option<toml::Value>) -> String {
    match default {
        None => "—".to_owned(),
        Some(toml::Value::String(s)) => format!("`{s}`"),
        Some(v) => format!("`{v}`"),
    }
}

/// The book's configuration reference (docs/src/configuration.md): the table before its first
/// `##` section, key -> (flag, env, default) cells. A row may name two keys (`tls_cert` /
/// `tls_key`); its flag and env cells then split the same way.
fn reference_rows() -> BTreeMap<String, (String, String, String)> {
    let page = repo_file(REFERENCE);
    let section = page
        .strip_prefix("# Configuration\n")
        .and_then(|s| s.split("\n## ").next())
        .expect("the configuration reference starts with its title");
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (keys, flags, envs, default) = (cells[1], cells[2], cells[3], cells[4]);
        let keys: Vec<&str> = keys.split(" / ").collect();
        let split = |c: &str| -> Vec<String> {
            let parts: Vec<String> = c.split(" / ").map(str::to_owned).collect();
            if parts.len() == keys.len() {
                parts
            } else {
                vec![c.to_owned(); keys.len()]
            }
        };
        for ((key, flag), env) in keys.iter().zip(split(flags)).zip(split(envs)) {
            let key = key.trim_matches('`').to_owned();
            let old = rows.insert(key.clone(), (flag, env, default.to_owned()));
            assert!(old.is_none(), "{REFERENCE} names {key} twice");
        }
    }
    rows
}

#[test]
fn configuration_reference_has_every_key_with_the_codes_flag_env_and_default() {
    let reference = config_reference();
    assert!(reference.len() > 20, "{reference:?}");
    let mut rows = reference_rows();
    for Setting {
        key,
        flag,
        env,
        default,
    } in &reference
    {
        let (f, e, d) = rows
            .remove(key)
            .unwrap_or_else(|| panic!("{REFERENCE} has no row for `{key}`"));
        match flag {
            Some(flag) => assert!(
                f.starts_with(&format!("`{flag}")),
                "`{key}`: {REFERENCE} flag {f:?}, the code's is {flag}"
            ),
            None => assert!(f.is_empty(), "`{key}` has no flag, {REFERENCE} says {f:?}"),
        }
        match env {
            Some(env) => assert!(
                e.contains(&format!("`{env}`")),
                "`{key}`: {REFERENCE} env {e:?}, the code's is {env}"
            ),
            None => assert!(
                e.is_empty(),
                "`{key}` has no variable, {REFERENCE} says {e:?}"
            ),
        }
        assert_eq!(
            d,
            cell(default),
            "`{key}`: {REFERENCE}'s default vs the code's"
        );
    }
    assert!(
        rows.is_empty(),
        "{REFERENCE} documents keys the code does not have: {:?}",
        rows.keys()
    );
}

#[test]
fn shipped_config_file_has_every_key_with_the_codes_default() {
    let text = repo_file("config/acpd.toml");
    let active: toml::Table = toml::from_str(&text).expect("config/acpd.toml parses");
    // Keys before the first table, commented out: those without a fixed default.
    let top = text.split("\n[").next().unwrap_or_default();
    let commented: Vec<String> = top
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, _)| k.to_owned())
        .collect();
    let reference = config_reference();
    let known = |k: &str| reference.iter().any(|s| s.key == k);
    for Setting { key, default, .. } in &reference {
        match default {
            Some(d) => assert_eq!(
                active.get(key),
                Some(d),
                "config/acpd.toml: `{key}` must be set to the default"
            ),
            None if key == "agents" || key == "builtin" || key == "budgets" => assert!(
                text.contains(&format!("[{key}")),
                "config/acpd.toml does not mention [{key}]"
            ),
            None => {
                assert!(
                    !active.contains_key(key),
                    "config/acpd.toml sets `{key}`, which has no default: comment it out"
                );
                assert!(
                    commented.contains(key),
                    "config/acpd.toml does not show `# {key} = ...`"
                );
            }
        }
    }
    for k in active.keys().chain(&commented) {
        assert!(
            known(k),
            "config/acpd.toml has `{k}`, which the code does not know"
        );
    }
}

#[tokio::test]
async fn shipped_config_file_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/acpd.toml");
    let data = dir.path().display().to_string();
    let run = acpd(&[
        "check-config",
        "--config",
        file.to_str().unwrap(),
        "--data-dir",
        &data,
    ])
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("127.0.0.1:7420"), "{}", run.stderr);
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every directory and file under `dir` (itself included), with its mode.
fn modes(dir: &Path) -> Vec<(PathBuf, bool, u32)> {
    let mut out = vec![(dir.to_owned(), true, mode(dir))];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(modes(&path));
        } else {
            out.push((path.clone(), false, mode(&path)));
        }
    }
    out
}

/// `acpd serve` with auth on, the default SQLite store and the built-in agent (its model
/// unreachable: a new session needs none) in a data directory that does not exist yet.
async fn serve_builtin(dir: &Path) -> (RawDaemon, String) {
    let config = dir.join("acpd.toml");
    let unreachable = "127.0.0.1:9".parse().unwrap();
    std::fs::write(
        &config,
        crate::builtin_support::builtin_config(unreachable, ""),
    )
    .unwrap();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--config",
        config.to_str().unwrap(),
    ];
    let (daemon, addrs) = RawDaemon::start(&args, &["acpd listening: "]).await;
    let addr = addrs[0];
    (daemon, format!("ws://{addr}/acp"))
}

#[tokio::test]
async fn data_dir_and_every_file_in_it_are_private_after_a_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, url) = serve_builtin(dir.path()).await;
    let data = daemon.data_dir();
    let token = read_token(&data).await;
    let (header, value) = bearer(&token);
    let mut c = client(&url, &[(header, &value)], None).await;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    c.new_session(&work).await;

    let all = modes(&data);
    let names: Vec<String> = all
        .iter()
        .filter_map(|(p, _, _)| p.strip_prefix(&data).ok())
        .map(|p| p.display().to_string())
        .collect();
    for expected in ["token", "acpd.db", "acpd.db-wal", "acpd.db-shm"] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("builtin/") && n.ends_with(".json")),
        "a built-in transcript: {names:?}\n{}",
        daemon.log()
    );
    for (path, is_dir, m) in all {
        let want = if is_dir { 0o700 } else { 0o600 };
        assert_eq!(m, want, "{}: mode {m:o}", path.display());
    }
}

#[tokio::test]
async fn an_existing_data_dir_open_to_others_is_tightened() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A database an older acpd left world-readable (empty: SQLite takes it as new).
    let db = data.join("acpd.db");
    std::fs::write(&db, b"").unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();

    let run = acpd(&["migrate", "--data-dir", data.to_str().unwrap()]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&db), 0o600);
    assert!(
        run.stderr.contains("tightened to 700") && run.stderr.contains("tightened to 600"),
        "a warning for each: {}",
        run.stderr
    );
}

/// acp-shim on `url` with `env` (and no token of its own): sends `initialize`, returns the
/// first stdout line, or the exit code when it ends without one.
async fn shim_initialize(url: &str, env: &[(&str, &Path)]) -> Result<serde_json::Value, i32> {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(shim_bin());
    cmd.arg(url)
        .env_remove("ACPD_TOKEN")
        .env_remove("ACPD_DATA_DIR")
        .env_remove("XDG_DATA_HOME")
        .env("HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn acp-shim");
    let mut stdin = child.stdin.take().unwrap();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;
    let _ = stdin.write_all(format!("{init}\n").as_bytes()).await;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(DEFAULT_TIMEOUT, lines.next_line())
        .await
        .expect("acp-shim answered nothing in time");
    match line {
        Ok(Some(l)) => Ok(serde_json::from_str(&l).expect("a JSON line")),
        _ => {
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .expect("acp-shim did not exit")
                .unwrap();
            Err(status.code().unwrap_or(-1))
        }
    }
}

#[tokio::test]
async fn shim_finds_a_loopback_daemons_token_under_acpd_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (daemon, url) = serve_builtin(dir.path()).await;
    let data = daemon.data_dir();
    read_token(&data).await;

    let answer = shim_initialize(&url, &[("ACPD_DATA_DIR", &data)]).await;
    let answer = answer.unwrap_or_else(|code| panic!("acp-shim exited {code}"));
    assert!(answer["result"]["protocolVersion"].is_number(), "{answer}");

    // Without it the shim looks under HOME, finds nothing, and the daemon refuses it.
    assert_eq!(shim_initialize(&url, &[]).await.err(), Some(77));
}

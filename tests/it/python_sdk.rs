//! The official Python SDK (PyPI `agent-client-protocol`, module `acp`) as a single client:
//! an SDK-built editor launching `acp-shim` as its stdio agent, against a real daemon with the
//! scripted agent (`tests/interop/python-client.py` does the session and checks each step).

use anyhow::{Context, Result};

use crate::shim_support::{Daemon, WAIT};

/// What the script prints for each step it checked (see its docstring).
const STEPS: [&str; 4] = [
    "ok: initialize with SDK",
    "permission answered allow-once",
    "ok: session/load replayed",
    "ok: session/cancel ended the turn with stopReason cancelled",
];

/// initialize, session/new, a prompt that streams and asks a permission the SDK client
/// answers, session/load on a new connection replaying the journal, session/cancel →
/// `cancelled`. Needs `ACPD_TEST_PYSDK_PYTHON`: a Python interpreter with
/// `agent-client-protocol` 0.12.1 installed (`.ci/run` makes a venv under `target/`);
/// ignored without.
#[tokio::test]
#[cfg_attr(
    not(acpd_pysdk),
    ignore = "set ACPD_TEST_PYSDK_PYTHON to a Python with agent-client-protocol installed"
)]
async fn the_official_python_sdk_runs_a_session_through_the_shim() -> Result<()> {
    let python = std::env::var("ACPD_TEST_PYSDK_PYTHON")?;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/python-client.py"
    );
    let d = Daemon::start(true).await?;
    // The session's directory is outside acpd's data directory (acpd refuses those).
    let work = tempfile::tempdir()?;
    let cwd = work.path();
    let shim_log = d.dir.path().join("shim-python.log");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .env("ACPD_SHIM", crate::support::shim_bin())
        .env("ACPD_URL", d.url())
        .env("ACPD_TOKEN_FILE", d.token_file())
        .env("ACPD_CWD", cwd)
        .env("ACPD_SHIM_LOG", &shim_log)
        .env("XDG_DATA_HOME", d.dir.path().join("no-such-dir"))
        .env_remove("ACPD_TOKEN")
        .kill_on_drop(true)
        .output();
    // The script bounds itself at 30 s; this is the backstop.
    let out = tokio::time::timeout(2 * WAIT, run)
        .await
        .context("python in time")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs = || {
        format!(
            "{stderr}\n--- shim:\n{}\n--- acpd:\n{}",
            std::fs::read_to_string(&shim_log).unwrap_or_default(),
            d.log()
        )
    };
    assert!(out.status.success(), "{}: {}", out.status, logs());
    for step in STEPS {
        assert!(stderr.contains(step), "missing `{step}`: {}", logs());
    }
    Ok(())
}

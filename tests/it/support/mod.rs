//! Test harness: the daemon under test, a scripted agent spoken to directly, and a client
//! that plays the editor. Only `daemon.rs` knows which store the e2e tests run against.

pub mod agent;
pub mod client;
pub mod conn;
pub mod daemon;
pub mod editor;
pub mod http;
pub mod security_support;
pub mod source;

use std::time::Duration;

use serde_json::Value;

pub use client::{Client, RpcError};
pub use daemon::{Daemon, DaemonOptions, listening_addr};
pub use editor::PermissionChoice;

/// Deadline of a single wait unless a test sets another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The params of a `session/update` notification, or `None` for any other message.
pub fn session_update_params(msg: &Value) -> Option<&Value> {
    (msg["method"] == "session/update").then(|| &msg["params"])
}

/// `update.sessionUpdate` of `session/update` params.
pub fn kind(params: &Value) -> &str {
    params["update"]["sessionUpdate"]
        .as_str()
        .unwrap_or_default()
}

/// The text of a message/thought chunk, if `params` is one with a text block.
pub fn chunk_text(params: &Value) -> Option<&str> {
    params["update"]["content"]["text"].as_str()
}

/// The `agent_message_chunk`s among `updates`, in order.
pub fn agent_chunks(updates: &[Value]) -> Vec<Value> {
    updates
        .iter()
        .filter(|p| kind(p) == "agent_message_chunk")
        .cloned()
        .collect()
}

/// Texts of the `agent_message_chunk`s among `updates`, in order.
pub fn agent_texts(updates: &[Value]) -> Vec<String> {
    updates
        .iter()
        .filter(|p| kind(p) == "agent_message_chunk")
        .filter_map(|p| chunk_text(p).map(str::to_string))
        .collect()
}

/// The `sessionUpdate` kinds that state a session's state: `session/load` replays the latest
/// of each once, in this order, after the history.
pub const STATE_KINDS: [&str; 3] = [
    "available_commands_update",
    "current_mode_update",
    "config_option_update",
];

/// `live` updates in the order a `session/load` replays them: the history, then the latest
/// update of each `STATE_KINDS` kind. (A load also merges each message's chunks into one
/// update; callers with multi-chunk messages compare texts.)
pub fn as_replayed(live: &[Value]) -> Vec<Value> {
    let is_state = |u: &Value| STATE_KINDS.contains(&kind(u));
    let mut out: Vec<Value> = live.iter().filter(|u| !is_state(u)).cloned().collect();
    for k in STATE_KINDS {
        if let Some(u) = live.iter().rev().find(|u| kind(u) == k) {
            out.push(u.clone());
        }
    }
    out
}

/// `_meta.acpd.seq` of `session/update` params; panics when missing, as the contract says it
/// is on every update acpd sends.
pub fn seq(params: &Value) -> i64 {
    params["_meta"]["acpd"]["seq"]
        .as_i64()
        .unwrap_or_else(|| panic!("session/update without integer _meta.acpd.seq: {params}"))
}

pub fn seqs(updates: &[Value]) -> Vec<i64> {
    updates.iter().map(seq).collect()
}

/// Asserts that seqs increase by exactly one from each update to the next.
pub fn assert_consecutive(updates: &[Value]) {
    let seqs = seqs(updates);
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "seqs not consecutive: {seqs:?}");
    }
}

/// Asserts that seqs strictly increase.
pub fn assert_increasing(updates: &[Value]) {
    let seqs = seqs(updates);
    for pair in seqs.windows(2) {
        assert!(pair[1] > pair[0], "seqs not strictly increasing: {seqs:?}");
    }
}

/// Whether `s` is an RFC 3339 date-time (`2026-01-02T03:04:05[.frac](Z|±hh:mm)`).
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape {
        return false;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    matches!(rest, "Z" | "z")
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest[1..3].bytes().all(|c| c.is_ascii_digit())
            && &rest[3..4] == ":"
            && rest[4..6].bytes().all(|c| c.is_ascii_digit()))
}

/// Path of the scripted agent binary.
pub fn scripted_agent_bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| workspace_bin("acpd-scripted-agent"))
}

/// Path of the scripted stdio MCP server (`acpd-scripted-mcp`).
pub fn scripted_mcp_bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| workspace_bin("acpd-scripted-mcp"))
}

/// Path of the acp-shim binary.
pub fn shim_bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| workspace_bin("acp-shim"))
}

/// A binary of another workspace member, beside this test binary's `deps/` folder. Cargo
/// builds it for `cargo test` because its crate has an integration test of its own
/// (`crates/*/tests/`); `CARGO_BIN_EXE_*` only names binaries of this package.
fn workspace_bin(name: &str) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` at the workspace root \
         (or `cargo build --workspace` first)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// Path of the acpd binary.
pub fn acpd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_acpd")
}

/// A daemon with one more profile `profile`: the scripted agent with `flags` (e.g. `--fork`).
pub async fn daemon_with_profile(profile: &str, flags: &str) -> Daemon {
    let agent = format!("{profile}={} {flags}", scripted_agent_bin());
    Daemon::start_with(DaemonOptions::default().arg("--agent", agent)).await
}

/// A WebSocket client of `profile` (`?agent=NAME`) after `initialize`, and that answer.
pub async fn client_of(daemon: &Daemon, profile: &str) -> (Client, Value) {
    let url = format!("{}?agent={profile}", daemon.ws_url());
    let mut client = Client::connect_ws(&url).await.expect("connect");
    let init = client.initialize().await;
    (client, init)
}

//! Where a daemon on this machine keeps its files. The daemon (its default `data_dir`) and
//! acp-shim (which reads the local user's token from there) must agree, so the rule is
//! written once, here.

use std::path::PathBuf;

/// The file in the data directory that holds the first-start token's secret.
pub const TOKEN_FILE: &str = "token";

/// `$ACPD_DATA_DIR`, else `$XDG_DATA_HOME/acpd`, else `~/.local/share/acpd`, else
/// `./acpd-data`.
pub fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ACPD_DATA_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("acpd");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(h) => PathBuf::from(h).join(".local/share/acpd"),
        None => PathBuf::from("acpd-data"),
    }
}

/// The first-start token of a daemon that uses the default data directory: what acp-shim
/// reads for a loopback URL when given no token. A daemon run with `--data-dir` elsewhere
/// needs `ACPD_DATA_DIR` (or `--token-file`) on the shim's side too.
pub fn token_file() -> PathBuf {
    data_dir().join(TOKEN_FILE)
}

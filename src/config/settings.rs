//! The settings, written once: every key of the config file with its default (`Settings`),
//! and the same keys as flags with their `ACPD_*` variables (`Args`).
//!
//! Layers, lowest first: `Settings::default()`, the TOML file (serde fills what the file
//! leaves out from the defaults), then whatever clap found on the command line or in the
//! environment (clap itself puts a flag above its variable). The last layer is applied as a
//! whole table: `Args` serializes only what was given, under the field names `Settings` uses.
//! `reference()` reads keys, flags, variables and defaults back out of these two types, so the
//! documentation can be checked against them (tests/it/config.rs).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Every key of the config file, with its default. `None`: no fixed default (off, or
/// derived from other settings when the `Config` is built).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub listen: SocketAddr,
    pub tcp_listen: Option<SocketAddr>,
    /// Default: SQLite in the data directory.
    pub store: Option<String>,
    /// Default: `acpd_wire::local::data_dir()`, the lookup acp-shim shares.
    pub data_dir: Option<PathBuf>,
    /// Default: the only hosted agent, else the built-in one.
    pub default_agent: Option<String>,
    pub no_auth: bool,
    pub max_message_bytes: usize,
    pub pending_request_timeout_ms: u64,
    pub cancel_grace_ms: u64,
    pub cancel_abandon_ms: u64,
    pub bootstrap_delay_ms: u64,
    pub slow_client_cutoff_ms: u64,
    pub list_page_size: u32,
    pub shutdown_grace_secs: u64,
    pub journal_max_entries: u64,
    pub journal_max_bytes: u64,
    pub max_connections: usize,
    pub max_connections_per_principal: usize,
    pub max_sessions_per_principal: usize,
    pub max_requests_per_second: u32,
    pub resume_grace_secs: u64,
    pub agent_idle_stop_secs: u64,
    pub keepalive_ms: u64,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub insecure: bool,
    pub allowed_origins: Vec<String>,
    pub header_read_timeout_ms: u64,
    pub max_pending_connections: usize,
    pub max_pending_per_source: usize,
    pub max_streams_per_principal: usize,
    /// Default: `/metrics` on the main listener, behind a token.
    pub metrics_listen: Option<SocketAddr>,
    pub mcp_stdio: String,
    pub mcp_stdio_allow: Vec<String>,
    pub busy_prompts: String,
    pub web_console: bool,
    pub web_session_ttl_secs: u64,
    /// Several replicas on one Postgres (leases, fencing, takeover); needs a cluster secret.
    pub replicas: bool,
    /// Default: `HOSTNAME-PID`.
    pub replica_id: Option<String>,
    /// Default: none (peers cannot reach this replica).
    pub advertise_url: Option<String>,
    pub lease_ttl_ms: u64,
    /// Default: the `ACPD_CLUSTER_SECRET` variable.
    pub cluster_secret_file: Option<PathBuf>,
    /// Default: the web PKI roots alone.
    pub cluster_ca_file: Option<PathBuf>,
    /// The directories each principal (by name) may use; see `roots::FsRoots`.
    pub roots: BTreeMap<String, Vec<PathBuf>>,
    pub default_roots: Vec<PathBuf>,
    pub agents: BTreeMap<String, FileAgent>,
    /// Spending limits per principal and profile (`budgets.rs`).
    pub budgets: super::budgets::BudgetsFile,
    /// The built-in agent's own table, checked by `acpd_builtin::BuiltinConfig::parse`.
    pub builtin: toml::Table,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            tcp_listen: None,
            store: None,
            data_dir: None,
            default_agent: None,
            no_auth: false,
            max_message_bytes: 16 * 1024 * 1024,
            pending_request_timeout_ms: 15 * 60 * 1000,
            cancel_grace_ms: 3_000,
            cancel_abandon_ms: 60_000,
            bootstrap_delay_ms: 100,
            slow_client_cutoff_ms: 10_000,
            list_page_size: 50,
            shutdown_grace_secs: 30,
            journal_max_entries: 100_000,
            journal_max_bytes: 256 * 1024 * 1024,
            max_connections: 1024,
            max_connections_per_principal: 64,
            max_sessions_per_principal: 256,
            max_requests_per_second: 200,
            resume_grace_secs: 120,
            agent_idle_stop_secs: 1800,
            keepalive_ms: 15_000,
            tls_cert: None,
            tls_key: None,
            insecure: false,
            allowed_origins: Vec::new(),
            header_read_timeout_ms: 10_000,
            max_pending_connections: 4096,
            max_pending_per_source: 1024,
            max_streams_per_principal: 1024,
            metrics_listen: None,
            mcp_stdio: "ask".to_owned(),
            mcp_stdio_allow: Vec::new(),
            busy_prompts: "queue".to_owned(),
            web_console: true,
            web_session_ttl_secs: 7 * 24 * 3600,
            replicas: false,
            replica_id: None,
            advertise_url: None,
            lease_ttl_ms: 10_000,
            cluster_secret_file: None,
            cluster_ca_file: None,
            roots: BTreeMap::new(),
            default_roots: Vec::new(),
            agents: BTreeMap::new(),
            budgets: super::budgets::BudgetsFile::default(),
            builtin: toml::Table::new(),
        }
    }
}

/// One `[agents.NAME]` table of the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAgent {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// acpd's own variables passed to the agent by name (its environment is otherwise only
    /// the `child_env` allowlist).
    #[serde(default)]
    pub pass_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// The agent's own HOME (relative: to the data directory).
    pub home: Option<PathBuf>,
    /// The command `acpd agent login NAME` runs (default: the agent's terminal auth method).
    #[serde(default)]
    pub login: Vec<String>,
    /// `"reads"`: read-only tool calls are approved `allow_once` automatically.
    pub approve: Option<String>,
    /// Principals (by name) who may run the login from an editor or the console (default:
    /// `["local"]`).
    pub login_principals: Option<Vec<String>>,
    /// A remote login running longer is ended (default 600).
    pub login_timeout_secs: Option<u64>,
}

/// Options shared by `serve`, `stdio` and the admin subcommands. Each field is named like
/// the `Settings` key it overrides and serializes only when given; no defaults here.
#[derive(Debug, Clone, Default, clap::Args, Serialize)]
pub struct Args {
    /// TOML config file.
    #[arg(long, env = "ACPD_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address of the HTTP/WebSocket listener.
    #[arg(long, env = "ACPD_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Address of the newline-delimited TCP listener (off unless given).
    #[arg(long, env = "ACPD_TCP_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_listen: Option<SocketAddr>,
    /// `sqlite://PATH` or `postgres://URL` (default: SQLite in the data directory).
    #[arg(long, env = "ACPD_STORE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Directory for the SQLite store and the generated token.
    #[arg(long, env = "ACPD_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// An agent profile: NAME=COMMAND (COMMAND split like a shell would; no shell is run).
    /// Added to the file's `[agents]` rather than replacing them, so not serialized.
    #[arg(long = "agent", value_name = "NAME=COMMAND")]
    #[serde(skip)]
    pub agents: Vec<String>,
    /// The profile used when a client does not pick one.
    #[arg(long, env = "ACPD_DEFAULT_AGENT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_agent: Option<String>,
    /// Accept clients without a token (loopback only; warns at every start).
    #[arg(long, env = "ACPD_NO_AUTH")]
    #[serde(skip_serializing_if = "is_false")]
    pub no_auth: bool,
    /// Largest JSON-RPC message a client may send, in bytes.
    #[arg(long, env = "ACPD_MAX_MESSAGE_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<usize>,
    /// How long an agent request waits for a client to attach, in milliseconds.
    #[arg(long, env = "ACPD_PENDING_REQUEST_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_request_timeout_ms: Option<u64>,
    /// After `session/cancel`, how long the agent has to end the turn before acpd answers it
    /// `cancelled` itself, in milliseconds.
    #[arg(long, env = "ACPD_CANCEL_GRACE_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_grace_ms: Option<u64>,
    /// After acpd answered a cancelled turn itself, how long it drops that turn's late output
    /// (and holds the session's next prompt) waiting for the agent's answer, in milliseconds.
    #[arg(long, env = "ACPD_CANCEL_ABANDON_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_abandon_ms: Option<u64>,
    /// How long updates of a new/loaded session are held after its response, in milliseconds.
    #[arg(long, env = "ACPD_BOOTSTRAP_DELAY_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_delay_ms: Option<u64>,
    /// How long a client that has fallen behind may take nothing before it is cut off, in
    /// milliseconds.
    #[arg(long, env = "ACPD_SLOW_CLIENT_CUTOFF_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow_client_cutoff_ms: Option<u64>,
    /// Sessions per `session/list` page.
    #[arg(long, env = "ACPD_LIST_PAGE_SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list_page_size: Option<u32>,
    /// Most live client connections in total (0: no limit).
    #[arg(long, env = "ACPD_MAX_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Most live client connections per user (0: no limit).
    #[arg(long, env = "ACPD_MAX_CONNECTIONS_PER_PRINCIPAL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_principal: Option<usize>,
    /// Most live sessions per user (0: no limit).
    #[arg(long, env = "ACPD_MAX_SESSIONS_PER_PRINCIPAL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_principal: Option<usize>,
    /// Requests and notifications per second per connection (0: no limit).
    #[arg(long, env = "ACPD_MAX_REQUESTS_PER_SECOND")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests_per_second: Option<u32>,
    /// Retention: most journal entries kept per session (0: no cap).
    #[arg(long, env = "ACPD_JOURNAL_MAX_ENTRIES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_max_entries: Option<u64>,
    /// Retention: most journal bytes kept per session (0: no cap).
    #[arg(long, env = "ACPD_JOURNAL_MAX_BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_max_bytes: Option<u64>,
    /// How long a drain waits for running turns, in seconds.
    #[arg(long, env = "ACPD_SHUTDOWN_GRACE_SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_secs: Option<u64>,
    /// How long a resumable link waits for its client to reconnect, in seconds.
    #[arg(long, env = "ACPD_RESUME_GRACE_SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_grace_secs: Option<u64>,
    /// A hosted agent nothing asked for this long is stopped once its last live session
    /// ends, in seconds (0: never).
    #[arg(long, env = "ACPD_AGENT_IDLE_STOP_SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_idle_stop_secs: Option<u64>,
    /// Keepalive ping interval on resumable links, in milliseconds.
    #[arg(long, env = "ACPD_KEEPALIVE_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive_ms: Option<u64>,
    /// PEM certificate chain for TLS (with --tls-key); re-read on SIGHUP.
    #[arg(long, env = "ACPD_TLS_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (with --tls-cert); re-read on SIGHUP.
    #[arg(long, env = "ACPD_TLS_KEY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Allow a non-loopback --listen without TLS (warns at every start).
    #[arg(long, env = "ACPD_INSECURE")]
    #[serde(skip_serializing_if = "is_false")]
    pub insecure: bool,
    /// A browser Origin allowed to connect (repeatable; env: comma-separated). Replaces the
    /// file's list, like every other setting.
    #[arg(
        long = "allowed-origin",
        env = "ACPD_ALLOWED_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// How long a connection may take to send its request headers (TCP: its first line),
    /// in milliseconds.
    #[arg(long, env = "ACPD_HEADER_READ_TIMEOUT_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_read_timeout_ms: Option<u64>,
    /// Most connections not yet authenticated, on every listener (reading headers, TLS
    /// handshake, TCP first line); over it a new one closes the oldest pending connection of
    /// the busiest source (0: no limit).
    #[arg(long, env = "ACPD_MAX_PENDING_CONNECTIONS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pending_connections: Option<usize>,
    /// Most pending connections from one source address (an IPv6 /64); over it, a new one
    /// from there closes that source's oldest pending one (0: no limit).
    #[arg(long, env = "ACPD_MAX_PENDING_PER_SOURCE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pending_per_source: Option<usize>,
    /// Most open Streamable HTTP SSE streams of one principal; over it, 429 (0: no limit).
    #[arg(long, env = "ACPD_MAX_STREAMS_PER_PRINCIPAL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams_per_principal: Option<usize>,
    /// Serve `/metrics` on this address, without a token, instead of on --listen.
    #[arg(long, env = "ACPD_METRICS_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// Stdio MCP servers from clients: "ask" the client, "allow" all, or "deny" all
    /// (commands in `mcp_stdio_allow` always start); for hosted agents "ask" drops them.
    #[arg(long, env = "ACPD_MCP_STDIO")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_stdio: Option<String>,
    /// A prompt sent while a turn runs in its session (several controllers): "queue" it
    /// until the turn ends, or "refuse" it with an error.
    #[arg(long, env = "ACPD_BUSY_PROMPTS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_prompts: Option<String>,
    /// Do not serve the web console at `/` (it is on by default). Overrides the key
    /// `web_console` (as `false`), hence the id.
    #[arg(id = "web_console", long = "no-web-console")]
    #[serde(
        rename = "web_console",
        skip_serializing_if = "is_false",
        serialize_with = "negated"
    )]
    pub no_web_console: bool,
    /// How long a web console sign-in lasts, in seconds.
    #[arg(long, env = "ACPD_WEB_SESSION_TTL_SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_session_ttl_secs: Option<u64>,
    /// Run as one of several replicas on one Postgres store (session leases, fencing,
    /// takeover); needs a cluster secret.
    #[arg(long, env = "ACPD_REPLICAS")]
    #[serde(skip_serializing_if = "is_false")]
    pub replicas: bool,
    /// This replica's name in the store (default: HOSTNAME-PID); unique among the replicas.
    #[arg(long, env = "ACPD_REPLICA_ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
    /// The URL peers reach this replica at (e.g. `ws://acpd-0.acpd:7420`), recorded in the
    /// store.
    #[arg(long, env = "ACPD_ADVERTISE_URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
    /// How long a session lease lasts without renewal, in milliseconds: a dead replica's
    /// sessions are taken over after it.
    #[arg(long, env = "ACPD_LEASE_TTL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// A file holding the secret the replicas share (else `ACPD_CLUSTER_SECRET`).
    #[arg(long, env = "ACPD_CLUSTER_SECRET_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_secret_file: Option<PathBuf>,
    /// PEM certificates the internal link trusts (beside the web PKI roots) when a peer's
    /// advertise URL is wss:// or https://.
    #[arg(long, env = "ACPD_CLUSTER_CA_FILE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_ca_file: Option<PathBuf>,
}

/// A switch can only be turned on from the command line, as before the layering was generic.
fn is_false(b: &bool) -> bool {
    !*b
}

/// A `--no-…` switch sets its key to `false`.
fn negated<S: serde::Serializer>(b: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bool(!*b)
}

impl Settings {
    /// Defaults < `--config` file < environment < flags.
    pub fn layered(args: &Args) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        file.overridden_by(args)
    }

    /// `self` with every key `args` gives replaced. Both sides are typed already, so a
    /// failure here is a flag whose type disagrees with its key (a test catches that).
    fn overridden_by(self, args: &Args) -> Result<Settings, ConfigError> {
        let internal = |e: &dyn std::fmt::Display| ConfigError::Invalid {
            what: "command line",
            message: e.to_string(),
        };
        let mut table = toml::Table::try_from(&self).map_err(|e| internal(&e))?;
        table.extend(toml::Table::try_from(args).map_err(|e| internal(&e))?);
        table.try_into().map_err(|e| internal(&e))
    }
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.message().to_owned(),
    })
}

/// One key as the documentation must describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// The file's key (`listen`; `agents` and `builtin` are tables).
    pub key: String,
    /// `--listen`, if a flag sets it.
    pub flag: Option<String>,
    /// `ACPD_LISTEN`, if a variable sets it.
    pub env: Option<String>,
    /// The default as the file writes it; `None` when there is no fixed one.
    pub default: Option<toml::Value>,
}

/// Every key, read out of `Settings` (keys, defaults) and `Args` (flags, variables).
pub fn reference() -> Vec<Setting> {
    let defaults = Settings::default();
    // JSON keeps the `None` fields (as null), so it lists every key; TOML has the values.
    let keys = match serde_json::to_value(&defaults) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let values = toml::Table::try_from(&defaults).unwrap_or_default();
    let command = <Args as clap::Args>::augment_args(clap::Command::new("acpd"));
    keys.into_iter()
        .map(|key| {
            let arg = command.get_arguments().find(|a| a.get_id() == key.as_str());
            Setting {
                flag: arg.and_then(|a| a.get_long()).map(|l| format!("--{l}")),
                env: arg
                    .and_then(|a| a.get_env())
                    .map(|e| e.to_string_lossy().into_owned()),
                // An empty table (`agents`, `builtin`) is no default at all.
                default: values
                    .get(&key)
                    .filter(|v| !matches!(v, toml::Value::Table(t) if t.is_empty()))
                    .cloned(),
                key,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_replace_the_keys_they_name_and_nothing_else() {
        let file = Settings {
            list_page_size: 7,
            keepalive_ms: 99,
            allowed_origins: vec!["https://a".into()],
            ..Settings::default()
        };
        let args = Args {
            list_page_size: Some(9),
            allowed_origins: vec!["https://b".into()],
            ..Args::default()
        };
        let merged = file.overridden_by(&args).unwrap();
        assert_eq!(merged.list_page_size, 9);
        assert_eq!(merged.keepalive_ms, 99);
        assert_eq!(merged.allowed_origins, vec!["https://b".to_owned()]);
    }

    #[test]
    fn no_flags_change_nothing() {
        let s = Settings::default();
        assert_eq!(s.clone().overridden_by(&Args::default()).unwrap(), s);
    }

    #[test]
    fn every_flag_lands_on_its_key_with_its_type() {
        let path = || Some(PathBuf::from("/x"));
        let args = Args {
            config: path(),
            listen: Some(SocketAddr::from(([127, 0, 0, 2], 1))),
            tcp_listen: Some(SocketAddr::from(([127, 0, 0, 3], 2))),
            store: Some("sqlite:///x/db".into()),
            data_dir: path(),
            agents: vec!["a=b".into()],
            default_agent: Some("a".into()),
            no_auth: true,
            max_message_bytes: Some(2048),
            pending_request_timeout_ms: Some(1),
            cancel_grace_ms: Some(16),
            cancel_abandon_ms: Some(17),
            bootstrap_delay_ms: Some(2),
            slow_client_cutoff_ms: Some(3),
            list_page_size: Some(4),
            max_connections: Some(5),
            max_connections_per_principal: Some(6),
            max_sessions_per_principal: Some(7),
            max_requests_per_second: Some(8),
            journal_max_entries: Some(9),
            journal_max_bytes: Some(10),
            shutdown_grace_secs: Some(11),
            resume_grace_secs: Some(12),
            agent_idle_stop_secs: Some(16),
            keepalive_ms: Some(13),
            tls_cert: path(),
            tls_key: path(),
            insecure: true,
            allowed_origins: vec!["https://o".into()],
            header_read_timeout_ms: Some(14),
            max_pending_connections: Some(15),
            max_pending_per_source: Some(21),
            max_streams_per_principal: Some(22),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 4], 3))),
            mcp_stdio: Some("deny".into()),
            busy_prompts: Some("refuse".into()),
            no_web_console: true,
            web_session_ttl_secs: Some(18),
            replicas: true,
            replica_id: Some("r1".into()),
            advertise_url: Some("ws://r1:7420".into()),
            lease_ttl_ms: Some(19),
            cluster_secret_file: path(),
            cluster_ca_file: path(),
        };
        let given = toml::Table::try_from(&args).unwrap();
        let merged = Settings::default().overridden_by(&args).unwrap();
        let merged = toml::Table::try_from(&merged).unwrap();
        // All but `config` and `--agent`, which are not keys of their own.
        assert_eq!(given.len(), 42);
        for (k, v) in given {
            assert_eq!(merged.get(&k), Some(&v), "{k}");
        }
    }

    #[test]
    fn every_args_field_overrides_a_settings_key() {
        let keys: Vec<String> = reference().into_iter().map(|s| s.key).collect();
        let command = <Args as clap::Args>::augment_args(clap::Command::new("acpd"));
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            assert!(id == "config" || keys.iter().any(|k| k == id), "{id}");
        }
    }
}

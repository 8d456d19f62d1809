//! `Config`: everything the daemon needs, validated once and passed explicitly.
//!
//! Sources are layered: the TOML file (`--config`), then `ACPD_*` environment variables, then
//! flags. `Args` is the command-line surface; `Config::from_args` merges and validates.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The name of the built-in agent's profile.
pub const BUILTIN_AGENT: &str = "builtin";

/// A bad configuration; `main` prints it as one line and exits 64.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid --agent {0:?}: expected NAME=COMMAND")]
    AgentFlag(String),
    #[error("agent {name:?}: {message}")]
    Agent { name: String, message: String },
    #[error("--default-agent {0:?} names no configured agent")]
    UnknownDefaultAgent(String),
    #[error("invalid {what}: {message}")]
    Invalid { what: &'static str, message: String },
    #[error("--no-auth is only allowed on a loopback address, not {0}")]
    NoAuthNotLoopback(SocketAddr),
    #[error("--tls-cert and --tls-key go together: give both or neither")]
    TlsPair,
    #[error("refusing to serve {0} without TLS: give --tls-cert/--tls-key (or --insecure)")]
    NotLoopbackWithoutTls(SocketAddr),
    #[error("--tcp-listen has no authentication and is loopback only, not {0}")]
    TcpNotLoopback(SocketAddr),
}

/// The PEM files of the TLS listener; re-read on SIGHUP.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// One agent a client can pick with `/acp?agent=NAME`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentProfile {
    pub name: String,
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
}

/// Size limits on what a client may send.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_message_bytes: usize,
    /// Live client connections in total (0: no limit).
    pub max_connections: usize,
    /// Live client connections of one principal (0: no limit).
    pub max_connections_per_principal: usize,
    /// Live sessions of one principal (0: no limit).
    pub max_sessions_per_principal: usize,
    /// Requests per second one connection may send, sustained (0: no limit); bursts of twice
    /// that are allowed.
    pub max_requests_per_second: u32,
}

/// Session behaviour knobs.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// How long an agent's request (permission, fs, terminal) waits for a client to attach.
    pub pending_request_timeout: Duration,
    /// How long updates for a new/loaded/resumed session are held after its response, because
    /// Zed drops updates for sessions it has not registered yet (zed-industries/zed#60199).
    pub bootstrap_delay: Duration,
    /// A client that has fallen behind and takes nothing for this long is cut off.
    pub slow_client_cutoff: Duration,
    pub list_page_size: u32,
    /// A session with no client and no running turn leaves memory after this long.
    pub idle_evict: Duration,
    /// Retention cap per session journal, in entries (0: none). Over it, message chunks are
    /// merged; if that is not enough, the oldest entries go.
    pub journal_max_entries: u64,
    /// Retention cap per session journal, in bytes of message text (0: none).
    pub journal_max_bytes: u64,
    /// Live sessions of one principal (0: no limit); a copy of the limit in `Limits`.
    pub max_live_per_principal: usize,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub tcp_listen: Option<SocketAddr>,
    pub store_url: String,
    pub data_dir: PathBuf,
    pub agents: BTreeMap<String, AgentProfile>,
    pub default_agent: String,
    pub no_auth: bool,
    pub limits: Limits,
    pub sessions: SessionSettings,
    /// How long a drain waits for running work before cancelling it.
    pub shutdown_grace: Duration,
    /// The `[builtin]` table of the config file, for the built-in agent to read.
    pub builtin: toml::Table,
    /// How long a resumable link (`acpd.resume.v1`) waits for its client to reconnect.
    pub resume_grace: Duration,
    /// Ping interval on resumable links; about three silent intervals mean a dead socket.
    pub keepalive: Duration,
    /// TLS on the WebSocket listener (`wss://`), if configured.
    pub tls: Option<TlsFiles>,
    /// Serve a non-loopback address without TLS (warns at every start).
    pub insecure: bool,
    /// Origins a browser client may connect from; requests without `Origin` are unaffected.
    pub allowed_origins: Vec<String>,
}

/// Options shared by `serve`, `stdio` and the admin subcommands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// TOML config file.
    #[arg(long, env = "ACPD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the HTTP/WebSocket listener.
    #[arg(long, env = "ACPD_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Address of the newline-delimited TCP listener (off unless given).
    #[arg(long, env = "ACPD_TCP_LISTEN")]
    pub tcp_listen: Option<SocketAddr>,
    /// `sqlite://PATH` or `postgres://URL` (default: SQLite in the data directory).
    #[arg(long, env = "ACPD_STORE")]
    pub store: Option<String>,
    /// Directory for the SQLite store and the generated token.
    #[arg(long, env = "ACPD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// An agent profile: NAME=COMMAND (COMMAND split like a shell would; no shell is run).
    #[arg(long = "agent", value_name = "NAME=COMMAND")]
    pub agents: Vec<String>,
    /// The profile used when a client does not pick one.
    #[arg(long, env = "ACPD_DEFAULT_AGENT")]
    pub default_agent: Option<String>,
    /// Accept clients without a token (loopback only; warns at every start).
    #[arg(long, env = "ACPD_NO_AUTH")]
    pub no_auth: bool,
    /// Largest JSON-RPC message a client may send, in bytes.
    #[arg(long, env = "ACPD_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
    /// How long an agent request waits for a client to attach, in milliseconds.
    #[arg(long, env = "ACPD_PENDING_REQUEST_TIMEOUT_MS")]
    pub pending_request_timeout_ms: Option<u64>,
    /// How long updates of a new/loaded session are held after its response, in milliseconds.
    #[arg(long, env = "ACPD_BOOTSTRAP_DELAY_MS")]
    pub bootstrap_delay_ms: Option<u64>,
    /// How long a client that has fallen behind may take nothing before it is cut off, in
    /// milliseconds.
    #[arg(long, env = "ACPD_SLOW_CLIENT_CUTOFF_MS")]
    pub slow_client_cutoff_ms: Option<u64>,
    /// Sessions per `session/list` page.
    #[arg(long, env = "ACPD_LIST_PAGE_SIZE")]
    pub list_page_size: Option<u32>,
    /// Most live client connections in total (0: no limit).
    #[arg(long, env = "ACPD_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Most live client connections per user (0: no limit).
    #[arg(long, env = "ACPD_MAX_CONNECTIONS_PER_PRINCIPAL")]
    pub max_connections_per_principal: Option<usize>,
    /// Most live sessions per user (0: no limit).
    #[arg(long, env = "ACPD_MAX_SESSIONS_PER_PRINCIPAL")]
    pub max_sessions_per_principal: Option<usize>,
    /// Requests per second per connection (0: no limit).
    #[arg(long, env = "ACPD_MAX_REQUESTS_PER_SECOND")]
    pub max_requests_per_second: Option<u32>,
    /// Retention: most journal entries kept per session (0: no cap).
    #[arg(long, env = "ACPD_JOURNAL_MAX_ENTRIES")]
    pub journal_max_entries: Option<u64>,
    /// Retention: most journal bytes kept per session (0: no cap).
    #[arg(long, env = "ACPD_JOURNAL_MAX_BYTES")]
    pub journal_max_bytes: Option<u64>,
    /// How long a drain waits for running turns, in seconds.
    #[arg(long, env = "ACPD_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
    /// How long a resumable link waits for its client to reconnect, in seconds.
    #[arg(long, env = "ACPD_RESUME_GRACE_SECS")]
    pub resume_grace_secs: Option<u64>,
    /// Keepalive ping interval on resumable links, in milliseconds.
    #[arg(long, env = "ACPD_KEEPALIVE_MS")]
    pub keepalive_ms: Option<u64>,
    /// PEM certificate chain for TLS (with --tls-key); re-read on SIGHUP.
    #[arg(long, env = "ACPD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (with --tls-cert); re-read on SIGHUP.
    #[arg(long, env = "ACPD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Allow a non-loopback --listen without TLS (warns at every start).
    #[arg(long, env = "ACPD_INSECURE")]
    pub insecure: bool,
    /// A browser Origin allowed to connect (repeatable; env: comma-separated).
    #[arg(
        long = "allowed-origin",
        env = "ACPD_ALLOWED_ORIGIN",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
}

/// The TOML file; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    tcp_listen: Option<SocketAddr>,
    store: Option<String>,
    data_dir: Option<PathBuf>,
    default_agent: Option<String>,
    no_auth: Option<bool>,
    max_message_bytes: Option<usize>,
    pending_request_timeout_ms: Option<u64>,
    bootstrap_delay_ms: Option<u64>,
    slow_client_cutoff_ms: Option<u64>,
    list_page_size: Option<u32>,
    shutdown_grace_secs: Option<u64>,
    journal_max_entries: Option<u64>,
    journal_max_bytes: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_principal: Option<usize>,
    max_sessions_per_principal: Option<usize>,
    max_requests_per_second: Option<u32>,
    resume_grace_secs: Option<u64>,
    keepalive_ms: Option<u64>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    insecure: Option<bool>,
    #[serde(default)]
    allowed_origins: Vec<String>,
    #[serde(default)]
    agents: BTreeMap<String, FileAgent>,
    #[serde(default)]
    builtin: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAgent {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
}

impl Config {
    pub fn from_args(args: &Args) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(acpd_wire::local::data_dir);
        let store_url = args
            .store
            .clone()
            .or(file.store)
            .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("acpd.db").display()));
        if !(store_url.starts_with("sqlite:")
            || store_url.starts_with("postgres://")
            || store_url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid {
                what: "store",
                message: format!("{store_url:?} is neither sqlite:// nor postgres://"),
            });
        }

        let mut agents = BTreeMap::new();
        for (name, a) in file.agents {
            let mut words = split_command(&name, &a.command)?;
            let program = words.remove(0);
            words.extend(a.args);
            let profile = AgentProfile {
                name: name.clone(),
                program,
                args: words,
                env: a.env.into_iter().collect(),
                cwd: a.cwd,
            };
            agents.insert(name, profile);
        }
        for flag in &args.agents {
            let (name, command) = flag
                .split_once('=')
                .ok_or_else(|| ConfigError::AgentFlag(flag.clone()))?;
            let name = name.trim();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(ConfigError::AgentFlag(flag.clone()));
            }
            let mut words = split_command(name, command)?;
            let program = words.remove(0);
            agents.insert(
                name.to_owned(),
                AgentProfile {
                    name: name.to_owned(),
                    program,
                    args: words,
                    env: vec![],
                    cwd: None,
                },
            );
        }
        let default_agent = args
            .default_agent
            .clone()
            .or(file.default_agent)
            .unwrap_or_else(|| {
                // With exactly one hosted agent configured, it is the obvious default.
                if agents.len() == 1 {
                    agents.keys().next().cloned().unwrap_or_default()
                } else {
                    BUILTIN_AGENT.to_owned()
                }
            });
        if default_agent != BUILTIN_AGENT && !agents.contains_key(&default_agent) {
            return Err(ConfigError::UnknownDefaultAgent(default_agent));
        }

        let listen = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7420)));
        let no_auth = args.no_auth || file.no_auth.unwrap_or(false);
        if no_auth && !listen.ip().is_loopback() {
            return Err(ConfigError::NoAuthNotLoopback(listen));
        }
        let tcp_listen = args.tcp_listen.or(file.tcp_listen);
        if let Some(tcp) = tcp_listen
            && no_auth
            && !tcp.ip().is_loopback()
        {
            return Err(ConfigError::NoAuthNotLoopback(tcp));
        }
        let (tls, insecure, allowed_origins) = security(
            args,
            FileSecurity {
                tls_cert: file.tls_cert,
                tls_key: file.tls_key,
                insecure: file.insecure,
                allowed_origins: file.allowed_origins,
            },
            listen,
            tcp_listen,
        )?;
        let max_message_bytes = args
            .max_message_bytes
            .or(file.max_message_bytes)
            .unwrap_or(16 * 1024 * 1024);
        if max_message_bytes < 1024 {
            return Err(ConfigError::Invalid {
                what: "max_message_bytes",
                message: "must be at least 1024".into(),
            });
        }
        let list_page_size = args.list_page_size.or(file.list_page_size).unwrap_or(50);
        if list_page_size == 0 || list_page_size > 1000 {
            return Err(ConfigError::Invalid {
                what: "list_page_size",
                message: "must be between 1 and 1000".into(),
            });
        }
        let ms =
            |a: Option<u64>, f: Option<u64>, d: u64| Duration::from_millis(a.or(f).unwrap_or(d));
        let keepalive = ms(args.keepalive_ms, file.keepalive_ms, 15_000);
        if keepalive < Duration::from_millis(50) {
            return Err(ConfigError::Invalid {
                what: "keepalive_ms",
                message: "must be at least 50".into(),
            });
        }
        Ok(Config {
            listen,
            tcp_listen,
            store_url,
            data_dir,
            agents,
            default_agent,
            no_auth,
            limits: Limits {
                max_message_bytes,
                max_connections: args
                    .max_connections
                    .or(file.max_connections)
                    .unwrap_or(1024),
                max_connections_per_principal: args
                    .max_connections_per_principal
                    .or(file.max_connections_per_principal)
                    .unwrap_or(64),
                max_sessions_per_principal: args
                    .max_sessions_per_principal
                    .or(file.max_sessions_per_principal)
                    .unwrap_or(256),
                max_requests_per_second: args
                    .max_requests_per_second
                    .or(file.max_requests_per_second)
                    .unwrap_or(200),
            },
            sessions: SessionSettings {
                pending_request_timeout: ms(
                    args.pending_request_timeout_ms,
                    file.pending_request_timeout_ms,
                    15 * 60 * 1000,
                ),
                bootstrap_delay: ms(args.bootstrap_delay_ms, file.bootstrap_delay_ms, 100),
                slow_client_cutoff: ms(
                    args.slow_client_cutoff_ms,
                    file.slow_client_cutoff_ms,
                    10_000,
                ),
                list_page_size,
                idle_evict: Duration::from_secs(600),
                journal_max_entries: args
                    .journal_max_entries
                    .or(file.journal_max_entries)
                    .unwrap_or(100_000),
                journal_max_bytes: args
                    .journal_max_bytes
                    .or(file.journal_max_bytes)
                    .unwrap_or(256 * 1024 * 1024),
                max_live_per_principal: args
                    .max_sessions_per_principal
                    .or(file.max_sessions_per_principal)
                    .unwrap_or(256),
            },
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace_secs
                    .or(file.shutdown_grace_secs)
                    .unwrap_or(30),
            ),
            builtin: file.builtin,
            resume_grace: Duration::from_secs(
                args.resume_grace_secs
                    .or(file.resume_grace_secs)
                    .unwrap_or(120),
            ),
            keepalive,
            tls,
            insecure,
            allowed_origins,
        })
    }

    /// The profile a client asked for (`None`: the default one), if it exists.
    pub fn profile(&self, name: Option<&str>) -> Option<&str> {
        let name = name.unwrap_or(&self.default_agent);
        if name == BUILTIN_AGENT || self.agents.contains_key(name) {
            Some(if name == BUILTIN_AGENT {
                BUILTIN_AGENT
            } else {
                self.agents.get_key_value(name).map(|(k, _)| k.as_str())?
            })
        } else {
            None
        }
    }
}

/// TLS, the plain-text escape hatch and the Origin allowlist, checked together: a non-loopback
/// listener needs TLS or `--insecure`; the raw TCP listener, which has no authentication,
/// needs loopback.
/// The file's security settings (moved out of `FileConfig`, which is consumed piecemeal).
struct FileSecurity {
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    insecure: Option<bool>,
    allowed_origins: Vec<String>,
}

fn security(
    args: &Args,
    file: FileSecurity,
    listen: SocketAddr,
    tcp_listen: Option<SocketAddr>,
) -> Result<(Option<TlsFiles>, bool, Vec<String>), ConfigError> {
    let cert = args.tls_cert.clone().or(file.tls_cert);
    let key = args.tls_key.clone().or(file.tls_key);
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
        (None, None) => None,
        _ => return Err(ConfigError::TlsPair),
    };
    let insecure = args.insecure || file.insecure.unwrap_or(false);
    if tls.is_none() && !insecure && !listen.ip().is_loopback() {
        return Err(ConfigError::NotLoopbackWithoutTls(listen));
    }
    if let Some(tcp) = tcp_listen
        && !tcp.ip().is_loopback()
    {
        return Err(ConfigError::TcpNotLoopback(tcp));
    }
    let mut origins = Vec::new();
    // Like every other setting, flags (or the environment) replace the file's list.
    let given = if args.allowed_origins.is_empty() {
        &file.allowed_origins
    } else {
        &args.allowed_origins
    };
    for o in given {
        let norm = normalize_origin(o).ok_or_else(|| ConfigError::Invalid {
            what: "allowed origin",
            message: format!("{o:?} is not scheme://host[:port]"),
        })?;
        if !origins.contains(&norm) {
            origins.push(norm);
        }
    }
    Ok((tls, insecure, origins))
}

fn split_command(name: &str, command: &str) -> Result<Vec<String>, ConfigError> {
    let words = shell_words::split(command).map_err(|e| ConfigError::Agent {
        name: name.to_owned(),
        message: format!("cannot split command: {e}"),
    })?;
    if words.is_empty() {
        return Err(ConfigError::Agent {
            name: name.to_owned(),
            message: "empty command".into(),
        });
    }
    Ok(words)
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.message().to_owned(),
    })
}

/// `scheme://host[:port]` in lower case without a trailing slash, the way browsers send it;
/// `None` for anything else. Default ports are dropped so `https://x:443` equals `https://x`.
pub fn normalize_origin(origin: &str) -> Option<String> {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    if !matches!(scheme, "http" | "https") || rest.is_empty() || rest.contains(['/', '?', '#', '@'])
    {
        return None;
    }
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    let rest = rest.strip_suffix(default_port).unwrap_or(rest);
    Some(format!("{scheme}://{rest}"))
}

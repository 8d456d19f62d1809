//! `Config`: everything the daemon needs, validated once and passed explicitly.
//!
//! `settings` layers the sources into one `Settings` (defaults < file < `ACPD_*` environment
//! < flags); `Config::from_args` derives what depends on other settings and validates
//! (the listener rules only for `Purpose::Serve`).
//! `data_dir` makes the data directory and the SQLite database private to the daemon's user.

mod budgets;
pub mod cluster_tls;
pub mod data_dir;
pub mod roots;
mod settings;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use settings::Settings;
pub use settings::{Args, Setting, reference};

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
    #[error("invalid {at}: {message}")]
    Budget { at: String, message: String },
    #[error("--tcp-listen is loopback only, not {0}")]
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
    /// acpd's own variables the agent gets by name (`pass_env`), e.g. its provider key;
    /// nothing else of acpd's environment but the `child_env` allowlist reaches it.
    pub pass_env: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// The agent's own HOME directory (absolute; created 0700 at start), so that profiles
    /// do not share credentials by accident.
    pub home: Option<PathBuf>,
    /// `login = [...]`: what `acpd agent login NAME` runs instead of the agent's advertised
    /// terminal auth method.
    pub login: Vec<String>,
    /// The principals (by name) who may run this profile's login from an editor or the web
    /// console (`login_principals`; default: `local`, the daemon's own user). The login sets
    /// the credentials every user of the profile shares, so it is the operator's to grant.
    pub login_principals: Vec<String>,
    /// A remote login running longer is ended (`login_timeout_secs`, default 600).
    pub login_timeout: Duration,
}

/// Who may log a profile in remotely unless `login_principals` says otherwise.
pub const DEFAULT_LOGIN_PRINCIPAL: &str = "local";
/// How long a remote login may run unless `login_timeout_secs` says otherwise.
pub const DEFAULT_LOGIN_TIMEOUT: Duration = Duration::from_secs(600);

impl AgentProfile {
    /// May `principal_name` run this profile's login remotely?
    pub fn may_log_in(&self, principal_name: &str) -> bool {
        self.login_principals.iter().any(|p| p == principal_name)
    }
}

/// Size limits on what a client may send.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_message_bytes: usize,
    /// Live client connections in total (0: no limit).
    pub max_connections: usize,
    /// Live client connections of one principal (0: no limit).
    pub max_connections_per_principal: usize,
    /// Requests per second one connection may send, sustained (0: no limit); bursts of twice
    /// that are allowed.
    pub max_requests_per_second: u32,
    /// How long a connection may take to send its HTTP request headers (raw TCP: its first
    /// line) before it is closed.
    pub header_read_timeout: Duration,
    /// Connections accepted but not yet authenticated (0: no limit); over it, the busiest
    /// source's oldest pending one is closed (`transport::gate`).
    pub max_pending_connections: usize,
    /// Pending connections of one source address (0: no limit).
    pub max_pending_per_source: usize,
    /// Open SSE streams of one principal (0: no limit).
    pub max_streams_per_principal: usize,
}

/// `busy_prompts`: what a prompt that comes while a turn runs gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyPrompts {
    /// It waits and runs when the turns before it have ended (the default).
    Queue,
    /// It is answered an error at once.
    Refuse,
}

impl BusyPrompts {
    pub fn parse(s: &str) -> Option<BusyPrompts> {
        match s {
            "queue" => Some(BusyPrompts::Queue),
            "refuse" => Some(BusyPrompts::Refuse),
            _ => None,
        }
    }
}

/// Several replicas on one Postgres (`replicas = true`).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This replica's name in the store: owner of the leases it takes.
    pub replica_id: String,
    /// Where peers reach it, recorded in the `replicas` table.
    pub advertise_url: Option<String>,
    /// How long a lease lasts without renewal; renewed every third of it.
    pub lease_ttl: Duration,
    /// Shared by the replicas (the internal link's credential).
    pub secret: String,
    /// How the internal link checks a `wss://` peer (web PKI roots + `cluster_ca_file`).
    pub tls: std::sync::Arc<rustls::ClientConfig>,
}

/// The shortest cluster secret accepted, in bytes.
const MIN_SECRET: usize = 16;

/// `HOSTNAME-PID`: unique per process, and a restarted pod (same hostname) is a new replica.
fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "acpd".to_owned());
    format!("{host}-{}", std::process::id())
}

/// The cluster settings, validated; `None` unless `replicas` is on.
fn cluster(s: &Settings, store_url: &str) -> Result<Option<ClusterConfig>, ConfigError> {
    if !s.replicas {
        return Ok(None);
    }
    if !(store_url.starts_with("postgres://") || store_url.starts_with("postgresql://")) {
        return Err(invalid(
            "replicas",
            "needs a Postgres store (SQLite is single-replica)",
        ));
    }
    if s.lease_ttl_ms < 300 {
        return Err(invalid("lease_ttl_ms", "must be at least 300"));
    }
    let secret = match &s.cluster_secret_file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.clone(),
            source: e,
        })?,
        None => std::env::var("ACPD_CLUSTER_SECRET").unwrap_or_default(),
    };
    let secret = secret.trim().to_owned();
    if secret.len() < MIN_SECRET {
        return Err(invalid(
            "cluster secret",
            "replicas need cluster_secret_file or ACPD_CLUSTER_SECRET, at least 16 bytes",
        ));
    }
    let replica_id = s.replica_id.clone().unwrap_or_else(default_replica_id);
    if replica_id.is_empty() || replica_id.len() > 200 {
        return Err(invalid("replica_id", "must be 1 to 200 bytes"));
    }
    if let Some(url) = &s.advertise_url
        && !["ws://", "wss://", "http://", "https://"]
            .iter()
            .any(|p| url.starts_with(p))
    {
        return Err(invalid(
            "advertise_url",
            "must be a ws://, wss:// or http(s):// URL",
        ));
    }
    let tls = cluster_tls::client_config(s.cluster_ca_file.as_deref())
        .map_err(|m| invalid("cluster_ca_file", &m))?;
    Ok(Some(ClusterConfig {
        replica_id,
        advertise_url: s.advertise_url.clone(),
        lease_ttl: Duration::from_millis(s.lease_ttl_ms),
        secret,
        tls,
    }))
}

/// Session behaviour knobs.
#[derive(Debug, Clone)]
pub struct SessionSettings {
    /// How long an agent's request (permission, fs, terminal) waits for a client to attach.
    pub pending_request_timeout: Duration,
    /// After `session/cancel`, how long the agent has to end the turn (`cancel_grace_ms`).
    pub cancel_grace: Duration,
    /// How long a turn acpd answered itself may still send late output (`cancel_abandon_ms`).
    pub cancel_abandon: Duration,
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
    /// Live sessions of one principal (0: no limit; `max_sessions_per_principal`). Here
    /// rather than in `Limits` because the session hub, which counts them, enforces it.
    pub max_live_per_principal: usize,
    /// `mcp_stdio` / `mcp_stdio_allow`, applied to what hosted agents are sent
    /// (`session::mcp`).
    pub mcp_policy: acpd_builtin::McpPolicy,
    /// `busy_prompts`: a prompt while a turn runs is queued or refused.
    pub busy_prompts: BusyPrompts,
    /// `[budgets]`, validated.
    pub budgets: crate::budget::Budgets,
    /// The profiles with `approve = "reads"`.
    pub approve_reads: std::collections::BTreeSet<String>,
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
    /// A hosted agent the pool was not asked for this long stops once its last live
    /// session lets go of it (`None`: never).
    pub agent_idle_stop: Option<Duration>,
    /// Ping interval on resumable links; about three silent intervals mean a dead socket.
    pub keepalive: Duration,
    /// TLS on the WebSocket listener (`wss://`), if configured.
    pub tls: Option<TlsFiles>,
    /// Serve a non-loopback address without TLS (warns at every start).
    pub insecure: bool,
    /// Origins a browser client may connect from; requests without `Origin` are unaffected.
    pub allowed_origins: Vec<String>,
    /// A listener of its own for `/metrics` (no token there); `None`: `/metrics` is on
    /// `listen`, behind a token unless `no_auth`.
    pub metrics_listen: Option<SocketAddr>,
    /// Which stdio MCP servers a client's `session/new|load|resume` may start.
    pub mcp_policy: acpd_builtin::McpPolicy,
    /// The directories each principal's sessions may use (`roots`, `default_roots`).
    pub fs_roots: roots::FsRoots,
    /// Serve the web console at `/` (`web_console`).
    pub web_console: bool,
    /// How long a web console sign-in (its cookie) lasts.
    pub web_session_ttl: Duration,
    /// Several replicas on one Postgres, if on.
    pub cluster: Option<ClusterConfig>,
    /// `[budgets]`, validated.
    pub budgets: crate::budget::Budgets,
}

/// What a configuration is for. Only `serve` opens listeners, so only it (and
/// `check-config`, which answers for `serve`) is held to the listener rules; the admin
/// commands and `stdio` share the daemon's settings, and a container's
/// `ACPD_LISTEN=0.0.0.0:7420` must not stop `docker exec … acpd token create`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `serve`, `check-config`: every rule.
    Serve,
    /// Everything else: every rule but the listeners' TLS and bind rules.
    Admin,
}

impl Config {
    pub fn from_args(args: &Args, purpose: Purpose) -> Result<Config, ConfigError> {
        let s = Settings::layered(args)?;
        if purpose == Purpose::Serve {
            listener_rules(&s)?;
        }
        Config::from_settings(s, &args.agents)
    }

    /// Validates layered settings (all but the listener rules); `agent_flags` are the
    /// `--agent NAME=COMMAND` profiles, which join the file's `[agents]` (a flag wins over a
    /// file profile of the same name).
    fn from_settings(s: Settings, agent_flags: &[String]) -> Result<Config, ConfigError> {
        let (data_dir, store_url, cluster) = store(&s)?;
        let (agents, default_agent) = agent_profiles(&s, agent_flags, &data_dir)?;
        let allowed_origins = origins(&s.allowed_origins)?;
        if s.web_session_ttl_secs < 60 {
            return Err(invalid(
                "web_session_ttl_secs",
                "a web console sign-in must last at least 60 s",
            ));
        }
        let limits = limits(&s)?;
        let fs_roots = roots::FsRoots::new(s.roots.clone(), s.default_roots.clone(), &data_dir)
            .map_err(|e| invalid("roots", &e.to_string()))?;
        let mcp_policy = acpd_builtin::McpPolicy::new(&s.mcp_stdio, s.mcp_stdio_allow.clone())
            .map_err(|e| invalid("mcp_stdio", &e.to_string()))?;
        let mut sessions = session_settings(&s, &mcp_policy)?;
        sessions.approve_reads = budgets::approve_presets(
            s.agents
                .iter()
                .map(|(name, a)| (name, a.approve.as_deref())),
        )?;
        let builtin = builtin_table(s.builtin.clone(), &mcp_policy)?;
        let budgets = s.budgets.validate()?;
        let keepalive = Duration::from_millis(s.keepalive_ms);
        if keepalive < Duration::from_millis(50) {
            return Err(invalid("keepalive_ms", "must be at least 50"));
        }
        Ok(Config {
            listen: s.listen,
            tcp_listen: s.tcp_listen,
            store_url,
            data_dir,
            agents,
            default_agent,
            no_auth: s.no_auth,
            limits,
            sessions,
            shutdown_grace: Duration::from_secs(s.shutdown_grace_secs),
            builtin,
            resume_grace: Duration::from_secs(s.resume_grace_secs),
            agent_idle_stop: (s.agent_idle_stop_secs > 0)
                .then(|| Duration::from_secs(s.agent_idle_stop_secs)),
            keepalive,
            tls: tls_files(&s),
            insecure: s.insecure,
            allowed_origins,
            metrics_listen: s.metrics_listen,
            mcp_policy,
            fs_roots,
            web_console: s.web_console,
            web_session_ttl: Duration::from_secs(s.web_session_ttl_secs),
            cluster,
            budgets,
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

fn invalid(what: &'static str, message: &str) -> ConfigError {
    ConfigError::Invalid {
        what,
        message: message.to_owned(),
    }
}

/// What `serve` may bind: no token only on loopback, TLS (or `--insecure`) off loopback, the
/// raw TCP listener on loopback only, and a certificate with its key.
fn listener_rules(s: &Settings) -> Result<(), ConfigError> {
    if s.no_auth
        && let Some(open) = std::iter::once(s.listen)
            .chain(s.tcp_listen)
            .find(|a| !a.ip().is_loopback())
    {
        return Err(ConfigError::NoAuthNotLoopback(open));
    }
    if s.tls_cert.is_some() != s.tls_key.is_some() {
        return Err(ConfigError::TlsPair);
    }
    if s.tls_cert.is_none() && !s.insecure && !s.listen.ip().is_loopback() {
        return Err(ConfigError::NotLoopbackWithoutTls(s.listen));
    }
    if let Some(tcp) = s.tcp_listen
        && !tcp.ip().is_loopback()
    {
        return Err(ConfigError::TcpNotLoopback(tcp));
    }
    Ok(())
}

/// The listener's certificate and key; a half pair is `listener_rules`' error, and means no
/// TLS to a command that opens no listener (`web-login` then prints an `http://` link).
fn tls_files(s: &Settings) -> Option<TlsFiles> {
    match (&s.tls_cert, &s.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    }
}

/// The data directory, the store URL (no store given: SQLite in the data directory) and
/// the cluster settings that depend on it.
fn store(s: &Settings) -> Result<(PathBuf, String, Option<ClusterConfig>), ConfigError> {
    let cluster = cluster(s, s.store.as_deref().unwrap_or("sqlite:"))?;
    let data_dir = s
        .data_dir
        .clone()
        .unwrap_or_else(acpd_wire::local::data_dir);
    let store_url = s
        .store
        .clone()
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
    Ok((data_dir, store_url, cluster))
}

/// The hosted agents and the default profile, which must exist.
fn agent_profiles(
    s: &Settings,
    agent_flags: &[String],
    data_dir: &std::path::Path,
) -> Result<(BTreeMap<String, AgentProfile>, String), ConfigError> {
    let agents = agents(s.agents.clone(), agent_flags, data_dir)?;
    let default_agent = s.default_agent.clone().unwrap_or_else(|| {
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
    Ok((agents, default_agent))
}

/// What a client may send, and how fast.
fn limits(s: &Settings) -> Result<Limits, ConfigError> {
    if s.max_message_bytes < 1024 {
        return Err(invalid("max_message_bytes", "must be at least 1024"));
    }
    if s.header_read_timeout_ms == 0 {
        return Err(invalid("header_read_timeout_ms", "must be at least 1"));
    }
    Ok(Limits {
        max_message_bytes: s.max_message_bytes,
        max_connections: s.max_connections,
        max_connections_per_principal: s.max_connections_per_principal,
        max_requests_per_second: s.max_requests_per_second,
        header_read_timeout: Duration::from_millis(s.header_read_timeout_ms),
        max_pending_connections: s.max_pending_connections,
        max_pending_per_source: s.max_pending_per_source,
        max_streams_per_principal: s.max_streams_per_principal,
    })
}

/// The session knobs; `mcp_policy` is shared with the built-in agent's table.
fn session_settings(
    s: &Settings,
    mcp_policy: &acpd_builtin::McpPolicy,
) -> Result<SessionSettings, ConfigError> {
    if s.list_page_size == 0 || s.list_page_size > 1000 {
        return Err(invalid("list_page_size", "must be between 1 and 1000"));
    }
    let busy_prompts = BusyPrompts::parse(&s.busy_prompts).ok_or_else(|| {
        let message = format!("{:?}: must be \"queue\" or \"refuse\"", s.busy_prompts);
        invalid("busy_prompts", &message)
    })?;
    Ok(SessionSettings {
        pending_request_timeout: Duration::from_millis(s.pending_request_timeout_ms),
        cancel_grace: Duration::from_millis(s.cancel_grace_ms),
        cancel_abandon: Duration::from_millis(s.cancel_abandon_ms),
        bootstrap_delay: Duration::from_millis(s.bootstrap_delay_ms),
        slow_client_cutoff: Duration::from_millis(s.slow_client_cutoff_ms),
        list_page_size: s.list_page_size,
        idle_evict: Duration::from_secs(600),
        journal_max_entries: s.journal_max_entries,
        journal_max_bytes: s.journal_max_bytes,
        max_live_per_principal: s.max_sessions_per_principal,
        mcp_policy: mcp_policy.clone(),
        busy_prompts,
        budgets: s.budgets.validate()?,
        approve_reads: Default::default(),
    })
}

/// The `[builtin]` table with the one MCP policy for every agent written into it (the
/// built-in agent reads it from its own table); the policy keys are top-level only.
fn builtin_table(
    mut builtin: toml::Table,
    mcp_policy: &acpd_builtin::McpPolicy,
) -> Result<toml::Table, ConfigError> {
    for key in acpd_builtin::McpPolicy::KEYS {
        if builtin.contains_key(key) {
            let message = format!("{key} is a top-level key, not one of [builtin]");
            return Err(invalid("[builtin]", &message));
        }
    }
    mcp_policy.insert_into(&mut builtin);
    Ok(builtin)
}

/// The file's `[agents]` plus the `--agent NAME=COMMAND` flags.
fn agents(
    file: BTreeMap<String, settings::FileAgent>,
    flags: &[String],
    data_dir: &std::path::Path,
) -> Result<BTreeMap<String, AgentProfile>, ConfigError> {
    let mut agents = BTreeMap::new();
    for (name, a) in file {
        let mut words = split_command(&name, &a.command)?;
        let program = words.remove(0);
        words.extend(a.args);
        let profile = AgentProfile {
            name: name.clone(),
            program,
            args: words,
            env: a.env.into_iter().collect(),
            pass_env: a.pass_env,
            cwd: a.cwd,
            home: a.home.map(|h| data_dir.join(h)),
            login: a.login,
            login_principals: a
                .login_principals
                .unwrap_or_else(|| vec![DEFAULT_LOGIN_PRINCIPAL.to_owned()]),
            login_timeout: a
                .login_timeout_secs
                .map_or(DEFAULT_LOGIN_TIMEOUT, Duration::from_secs),
        };
        agents.insert(name, profile);
    }
    for flag in flags {
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
                pass_env: vec![],
                cwd: None,
                home: None,
                login: vec![],
                login_principals: vec![DEFAULT_LOGIN_PRINCIPAL.to_owned()],
                login_timeout: DEFAULT_LOGIN_TIMEOUT,
            },
        );
    }
    Ok(agents)
}

/// The Origin allowlist, normalized and without duplicates.
fn origins(given: &[String]) -> Result<Vec<String>, ConfigError> {
    let mut origins = Vec::new();
    for o in given {
        let norm = normalize_origin(o).ok_or_else(|| ConfigError::Invalid {
            what: "allowed origin",
            message: format!("{o:?} is not scheme://host[:port]"),
        })?;
        if !origins.contains(&norm) {
            origins.push(norm);
        }
    }
    Ok(origins)
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

#[cfg(test)]
mod tests {
    use super::{ConfigError, Settings, listener_rules, tls_files};

    fn settings(listen: &str) -> Settings {
        Settings {
            listen: listen.parse().unwrap(),
            ..Settings::default()
        }
    }

    #[test]
    fn listener_rules_hold_the_public_listener_to_tls_or_insecure() {
        assert!(listener_rules(&settings("127.0.0.1:7420")).is_ok());
        let public = settings("0.0.0.0:7420");
        assert!(matches!(
            listener_rules(&public),
            Err(ConfigError::NotLoopbackWithoutTls(_))
        ));
        let insecure = Settings {
            insecure: true,
            ..public.clone()
        };
        assert!(listener_rules(&insecure).is_ok());
        let no_auth = Settings {
            no_auth: true,
            ..insecure
        };
        assert!(matches!(
            listener_rules(&no_auth),
            Err(ConfigError::NoAuthNotLoopback(_))
        ));
        let tcp = Settings {
            tcp_listen: Some("0.0.0.0:7421".parse().unwrap()),
            ..settings("127.0.0.1:7420")
        };
        assert!(matches!(
            listener_rules(&tcp),
            Err(ConfigError::TcpNotLoopback(_))
        ));
    }

    #[test]
    fn half_a_tls_pair_is_a_listener_error_and_no_tls_elsewhere() {
        let half = Settings {
            tls_cert: Some("/c.pem".into()),
            ..settings("127.0.0.1:7420")
        };
        assert!(matches!(listener_rules(&half), Err(ConfigError::TlsPair)));
        assert_eq!(tls_files(&half), None);
        let both = Settings {
            tls_key: Some("/k.pem".into()),
            ..half
        };
        assert!(listener_rules(&both).is_ok());
        assert!(tls_files(&both).is_some());
    }
}

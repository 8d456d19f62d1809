//! `acp-shim`: an ACP agent command for editors that speak stdio, relaying to acpd over a
//! resumable WebSocket link (`acpd.resume.v1`).
//!
//! stdout carries protocol lines only; logs go to stderr (warn by default, `ACPD_LOG` for
//! more). A dropped link is resumed with nothing lost or repeated; a restarted daemon is
//! recovered from its journal. Fatal errors end with one `acp-shim: ...` line on stderr and
//! a distinct exit code (see `Exit`).
//!
//! Three modules read ACP: `editor.rs` (ids, methods, session ids, `_meta.acpd.seq`), `map.rs`
//! (the members that carry paths) and `mcp.rs` (the `mcpServers` of session setup and the
//! `_acpd/mcp/*` calls); the rest moves frames. stdout carries only complete JSON lines, each a
//! message the daemon sent or an answer the shim makes in its place: invalid editor input is
//! answered locally and never framed (tests/it
//! `shim_input::bad_editor_lines_are_answered_locally_and_the_shim_goes_on`).

mod backoff;
mod bad_line;
mod connect;
mod editor;
mod frame;
mod login;
mod map;
mod mcp;
mod pipe;
mod relay;
mod socket;
mod stdin;
mod stdout;
mod tls;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_tungstenite::tungstenite::http::Uri;

/// How the shim ends. Codes follow BSD sysexits.
#[derive(Debug)]
pub enum Exit {
    /// stdin closed: 0.
    Clean,
    /// Bad arguments, token file, URL or agent profile: 64 (`EX_USAGE`).
    Usage(String),
    /// The daemon broke the protocol, or is not acpd: 65 (`EX_DATAERR`).
    Protocol(String),
    /// Cannot reach the daemon on the first connect: 69 (`EX_UNAVAILABLE`).
    Unavailable(String),
    /// stdout to the editor failed: 74 (`EX_IOERR`).
    Io(String),
    /// TLS handshake or certificate check failed: 76 (`EX_PROTOCOL`).
    Tls(String),
    /// The daemon refused the token (401/403): 77 (`EX_NOPERM`).
    Auth(String),
}

impl Exit {
    pub fn code(&self) -> u8 {
        match self {
            Exit::Clean => 0,
            Exit::Usage(_) => 64,
            Exit::Protocol(_) => 65,
            Exit::Unavailable(_) => 69,
            Exit::Io(_) => 74,
            Exit::Tls(_) => 76,
            Exit::Auth(_) => 77,
        }
    }

    fn message(&self) -> Option<String> {
        match self {
            Exit::Clean => None,
            Exit::Usage(m) => Some(m.clone()),
            Exit::Protocol(m) => Some(format!("protocol error: {m}")),
            Exit::Unavailable(m) => Some(format!("cannot reach acpd: {m}")),
            Exit::Io(m) => Some(format!("I/O error: {m}")),
            Exit::Tls(m) => Some(format!("TLS error: {m}")),
            Exit::Auth(m) => Some(m.clone()),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "acp-shim",
    version,
    about = "ACP agent command that relays stdio to an acpd daemon over WebSocket, surviving drops and restarts",
    after_help = "Token: --token-file, else $ACPD_TOKEN, else (loopback URLs only) the daemon's own \
                  token file in $ACPD_DATA_DIR, else $XDG_DATA_HOME/acpd, else ~/.local/share/acpd.\n\
                  Exit codes: 0 stdin closed, 64 usage, 65 protocol, 69 unreachable, 74 stdout, 76 TLS, 77 auth."
)]
struct Cli {
    /// Agent profile on the daemon (sent as `?agent=NAME`).
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    /// File holding the bearer token.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust for wss:// (instead of the web PKI roots).
    #[arg(long, value_name = "FILE", conflicts_with = "pin_sha256")]
    ca: Option<PathBuf>,
    /// Trust exactly the certificate with this SHA-256 fingerprint (hex, colons allowed).
    #[arg(long, value_name = "HEX")]
    pin_sha256: Option<String>,
    /// Keepalive ping interval in milliseconds (about three silent intervals mean a dead link).
    #[arg(
        long,
        hide = true,
        env = "ACP_SHIM_KEEPALIVE_MS",
        default_value_t = 15_000
    )]
    keepalive_ms: u64,
    /// Largest editor line relayed; longer ones are answered with a -32600 error.
    #[arg(
        long,
        hide = true,
        env = "ACP_SHIM_MAX_LINE_BYTES",
        default_value_t = 256 << 20
    )]
    max_line_bytes: usize,
    /// Map a path prefix of the editor's machine to the agent's: LOCAL=REMOTE (repeatable;
    /// longest prefix wins). Rewrites cwd, fs/terminal paths, tool call locations, diffs and
    /// file:// links both ways; other paths pass unchanged.
    #[arg(long = "map", value_name = "LOCAL=REMOTE")]
    maps: Vec<String>,
    /// Where the editor's stdio MCP servers run: local (on this machine, tunnelled to the
    /// agent through acpd), remote (where the agent runs), drop. Default: local.
    #[arg(long, value_enum, value_name = "POLICY")]
    mcp: Option<mcp::Policy>,
    /// TOML file with more settings: `map = ["LOCAL=REMOTE", ...]` (added to --map),
    /// `mcp = "local" | "remote" | "drop"` (--mcp wins).
    #[arg(long, value_name = "FILE", env = "ACP_SHIM_CONFIG")]
    config: Option<PathBuf>,
    /// Run agent NAME's login on the daemon's host, in this terminal, and exit with its
    /// status (what an editor's "log in" runs: acpd offers it as a terminal auth method).
    #[arg(long, value_name = "NAME")]
    login: Option<String>,
    /// The daemon: ws://HOST:PORT[/acp] or wss://HOST[:PORT][/acp].
    url: String,
}

/// The `--config` file: what is better written down once than in every editor's settings.
#[derive(serde::Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    /// `LOCAL=REMOTE` specs, as `--map` takes them.
    map: Vec<String>,
    mcp: Option<mcp::Policy>,
}

/// The settings of flags and `--config` file together.
struct Settings {
    paths: map::PathMap,
    mcp: mcp::Policy,
}

fn settings(cli: &Cli) -> Result<Settings, Exit> {
    let mut specs = Vec::new();
    let mut mcp = None;
    if let Some(path) = &cli.config {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Exit::Usage(format!("cannot read config file {}: {e}", path.display())))?;
        let file: FileConfig = toml::from_str(&text)
            .map_err(|e| Exit::Usage(format!("config file {}: {e}", path.display())))?;
        specs.extend(file.map);
        mcp = file.mcp;
    }
    specs.extend(cli.maps.iter().cloned());
    Ok(Settings {
        paths: map::PathMap::new(&specs).map_err(|e| Exit::Usage(e.to_string()))?,
        mcp: cli.mcp.or(mcp).unwrap_or(mcp::Policy::Local),
    })
}

/// The whole program; `src/bin/acp-shim.rs` only calls this.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 64 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging();
    let exit = match target(&cli).and_then(|t| Ok((t, settings(&cli)?))) {
        Err(e) => e,
        Ok((target, settings)) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => {
                if let Some(agent) = &cli.login {
                    let ended = rt.block_on(login::run(target, agent));
                    rt.shutdown_background();
                    return login_exit(ended);
                }
                let keepalive = Duration::from_millis(cli.keepalive_ms.max(50));
                let max_line = cli.max_line_bytes.max(1024);
                let exit = rt.block_on(relay::run(
                    target,
                    settings.paths,
                    settings.mcp,
                    keepalive,
                    max_line,
                ));
                // stdin is read on a blocking thread that cannot be interrupted: don't wait.
                rt.shutdown_background();
                exit
            }
            Err(e) => Exit::Io(format!("cannot start the runtime: {e}")),
        },
    };
    if let Some(m) = exit.message() {
        tracing::debug!(code = exit.code(), "exiting");
        eprintln!("acp-shim: {m}");
    }
    ExitCode::from(exit.code())
}

/// The shim's exit after `--login`: the login's own status, or the shim's failure.
fn login_exit(ended: login::Ended) -> ExitCode {
    match ended {
        login::Ended::Status(code) => ExitCode::from(code.clamp(0, 255) as u8),
        login::Ended::Failed(exit) => {
            if let Some(m) = exit.message() {
                eprintln!("acp-shim: {m}");
            }
            ExitCode::from(exit.code())
        }
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ACPD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn target(cli: &Cli) -> Result<connect::Target, Exit> {
    let usage = |m: String| Exit::Usage(m);
    let uri: Uri = cli
        .url
        .parse()
        .map_err(|e| usage(format!("invalid URL {:?}: {e}", cli.url)))?;
    let secure = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => {
            return Err(usage(format!(
                "URL {:?} must start with ws:// or wss://",
                cli.url
            )));
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| usage(format!("URL {:?} has no host", cli.url)))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let path = match uri.path() {
        "" | "/" => "/acp",
        p => p,
    };
    let mut query: Vec<String> = uri.query().map(|q| vec![q.to_owned()]).unwrap_or_default();
    if let Some(agent) = &cli.agent {
        if agent.is_empty()
            || !agent
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(usage(format!("invalid --agent {agent:?}")));
        }
        query.push(format!("agent={agent}"));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or(&host);
    let mut full = format!("{}://{authority}{path}", if secure { "wss" } else { "ws" });
    if !query.is_empty() {
        full.push('?');
        full.push_str(&query.join("&"));
    }
    let uri: Uri = full
        .parse()
        .map_err(|e| usage(format!("invalid URL {full:?}: {e}")))?;
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let token = token(cli, loopback)?;
    if token.is_some() && !secure && !loopback {
        tracing::warn!("sending the token over plain ws:// to a non-loopback host; use wss://");
    }
    let tls = tls_config(cli, secure)?;
    let keepalive = Duration::from_millis(cli.keepalive_ms.max(50));
    Ok(connect::Target {
        uri,
        host,
        port,
        tls,
        token,
        // Bounded so a blackholed daemon is retried, not waited on forever.
        handshake_timeout: (keepalive * 3).clamp(Duration::from_secs(1), Duration::from_secs(10)),
    })
}

/// The TLS client config for a wss:// URL: `--ca`, else `--pin-sha256`, else the web PKI.
fn tls_config(
    cli: &Cli,
    secure: bool,
) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, Exit> {
    let usage = |m: String| Exit::Usage(m);
    Ok(if secure {
        let trust = match (&cli.ca, &cli.pin_sha256) {
            (Some(ca), _) => tls::Trust::CaFile(ca.clone()),
            (None, Some(pin)) => {
                tls::Trust::Pin(tls::parse_pin(pin).map_err(|e| usage(e.to_string()))?)
            }
            (None, None) => tls::Trust::WebPki,
        };
        Some(tls::client_config(&trust).map_err(|e| match e {
            tls::TlsSetupError::Rustls(e) => Exit::Tls(e.to_string()),
            other => usage(other.to_string()),
        })?)
    } else {
        if cli.ca.is_some() || cli.pin_sha256.is_some() {
            return Err(usage("--ca and --pin-sha256 need a wss:// URL".into()));
        }
        None
    })
}

/// `--token-file`, else `ACPD_TOKEN`, else for a loopback daemon its own token file.
fn token(cli: &Cli, loopback: bool) -> Result<Option<String>, Exit> {
    if let Some(path) = &cli.token_file {
        return read_token(path)
            .map(Some)
            .map_err(|e| Exit::Usage(format!("cannot read token file {}: {e}", path.display())));
    }
    if let Ok(t) = std::env::var("ACPD_TOKEN")
        && !t.trim().is_empty()
    {
        return Ok(Some(t.trim().to_owned()));
    }
    if !loopback {
        return Ok(None);
    }
    // The daemon's own default data directory: ACPD_DATA_DIR, XDG, HOME.
    let path = acpd_wire::local::token_file();
    Ok(read_token(&path).ok())
}

fn read_token(path: &Path) -> std::io::Result<String> {
    let t = std::fs::read_to_string(path)?;
    let t = t.trim();
    if t.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "empty",
        ));
    }
    Ok(t.to_owned())
}

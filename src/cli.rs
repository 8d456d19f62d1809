//! The `acpd` command line: subcommands, logging setup, signals and exit codes.
//!
//! Exit codes: 0 clean, 64 bad configuration or usage, 1 runtime failure.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod budget;
mod docs;
mod logging;
mod start;
mod usage;

use crate::config::{Args, Config, Purpose};
use crate::server::{self, Core, LOCAL_PRINCIPAL};
use acpd_store::Store;

/// Exit code for a bad configuration or usage (BSD `EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

#[derive(Parser)]
#[command(
    name = "acpd",
    version,
    about = "Serves the Agent Client Protocol over the network"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "ACPD_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Threads running acpd's tasks (the async runtime's workers). Default: one per CPU acpd
    /// may use. Fewer spend less CPU per message (two workers sharing a busy CPU wake each
    /// other), more keep other users answered while one listener is flooded (bench/README).
    /// Read before any config file.
    #[arg(long, global = true, env = "ACPD_WORKER_THREADS")]
    worker_threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Serve(Args),
    /// Run as a local stdio ACP agent (one client on stdin/stdout).
    Stdio(Args),
    /// Apply store migrations and exit.
    Migrate(Args),
    /// Validate the configuration and exit.
    CheckConfig(Args),
    /// Manage access tokens.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Share a session with another principal (or revoke that); audited. A revoked grantee
    /// is cut off the live session within a second.
    Share {
        /// The session id.
        session: String,
        /// The principal (token name) to share with.
        #[arg(long)]
        with: String,
        /// What the grantee may do.
        #[arg(long, value_parser = ["observer", "controller"], required_unless_present = "revoke")]
        role: Option<String>,
        /// Revoke the grant instead.
        #[arg(long, conflicts_with = "role")]
        revoke: bool,
        #[command(flatten)]
        args: Args,
    },
    /// Print what turns spent (tokens, cost) per day, principal and profile.
    Usage(usage::UsageArgs),
    /// Print every budget set in the config file ([budgets]) with what it has used this
    /// period, in percent, and when it resets. Budgets are changed in the config, not here.
    Budget(budget::BudgetArgs),
    /// Write a self-signed TLS certificate and key; print its SHA-256 fingerprint.
    Cert(server::cert::CertArgs),
    /// Print a single-use sign-in link for the web console (the code is in the link's
    /// fragment, so it never reaches a server log; it expires after --ttl).
    WebLogin {
        /// The principal (token name) the browser signs in as; it must exist (`token create`).
        #[arg(long, default_value = LOCAL_PRINCIPAL)]
        principal: String,
        /// How long the link stays valid: seconds, or with a unit (`90s`, `10m`, `1h`).
        #[arg(long, default_value = "10m", value_parser = parse_ttl)]
        ttl: std::time::Duration,
        /// The console's address as the browser reaches it (default: from --listen and TLS).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        #[command(flatten)]
        args: Args,
    },
    /// Hosted agents on this host.
    Agent {
        #[command(subcommand)]
        action: AgentAction,
    },
    /// Write the man pages (roff): acpd(1) to stdout, or one page per command to --out DIR.
    Man(docs::ManArgs),
    /// Print shell completions for acpd (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
}

#[derive(Subcommand)]
enum AgentAction {
    /// Log a hosted agent in on this host: runs the profile's `login` command, else the
    /// agent's terminal auth method, with the profile's env, cwd and HOME, on this terminal.
    Login {
        /// The agent profile.
        name: String,
        #[command(flatten)]
        args: Args,
    },
}

#[derive(Subcommand)]
enum TokenAction {
    /// Create a token; the secret is printed once.
    Create {
        #[arg(long)]
        name: String,
        #[command(flatten)]
        args: Args,
    },
    /// List tokens (never their secrets).
    List(Args),
    /// Revoke a token by id.
    Revoke {
        id: String,
        #[command(flatten)]
        args: Args,
    },
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    // The per-agent supervisor acpd re-executes itself as: no runtime, no logging setup.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .get(1)
        .is_some_and(|a| a == crate::agent::supervisor::SUBCOMMAND)
    {
        return crate::agent::supervisor::main(&argv[2..]);
    }
    // A remote login's first step in its terminal (`login::exec_main`): likewise bare.
    if argv
        .get(1)
        .is_some_and(|a| a == crate::login::EXEC_SUBCOMMAND)
    {
        return crate::login::exec_main(&argv[2..]);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let quiet = matches!(cli.command, Command::Stdio(_));
    logging::init(cli.log_format, if quiet { "warn" } else { "info" });
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    // Unset: tokio's default, one per CPU this process may use (affinity, cgroup quota).
    if let Some(n) = cli.worker_threads {
        if n == 0 {
            say("--worker-threads must be at least 1");
            return ExitCode::from(EXIT_USAGE);
        }
        rt.worker_threads(n);
    }
    let rt = match rt.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    rt.block_on(run(cli.command))
}

/// The validated configuration, or the exit code after one line on stderr. `Purpose::Serve`
/// (`serve`, `check-config`) adds the listener rules and loads the certificate; the
/// commands that only open the store skip both (see `Purpose`).
fn config_of(args: &Args, purpose: Purpose) -> Result<Config, ExitCode> {
    let config = Config::from_args(args, purpose).map_err(|e| {
        eprintln!("acpd: {e}");
        ExitCode::from(EXIT_USAGE)
    })?;
    // The certificate and key must load now, not at the first TLS handshake.
    if purpose == Purpose::Serve
        && let Some(files) = &config.tls
        && let Err(e) = crate::server::tls::load(files)
    {
        eprintln!("acpd: TLS: {e}");
        return Err(ExitCode::from(EXIT_USAGE));
    }
    // The `[builtin]` table belongs to the built-in agent; check it now, not at first use.
    if !config.builtin.is_empty()
        && let Err(e) = acpd_builtin::BuiltinConfig::parse(&config.builtin, &config.data_dir)
    {
        eprintln!("acpd: invalid [builtin] config: {e}");
        return Err(ExitCode::from(EXIT_USAGE));
    }
    Ok(config)
}

/// Raises the soft limit on open files to the hard one: each connection, agent pipe and MCP
/// server is a descriptor, and 1024 (the usual soft default) runs out long before
/// `max_connections`. Logged, so an operator sees the figure a slowloris would have to beat.
fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a struct we own.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if got != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read the open-file limit");
        return;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), limit = before, "cannot raise the open-file limit");
            return;
        }
    }
    tracing::info!(
        open_files = lim.rlim_cur,
        before,
        "open-file limit (RLIMIT_NOFILE)"
    );
}

/// acpd's environment (provider keys, the store URL) out of its children's reach through
/// `/proc/<acpd>/environ`; their own environment is `child_env`'s allowlist.
fn seal_own_environ() {
    if let Err(e) = acpd_builtin::child_env::seal_own_environ() {
        tracing::warn!("cannot make acpd non-dumpable, its children can read its environment: {e}");
    }
}

fn fail(msg: String) -> ExitCode {
    say(&msg);
    ExitCode::FAILURE
}

/// One line on stderr. Also the last word of a daemon whose stderr may be gone: never
/// `eprintln!`, which panics then.
fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "acpd: {msg}");
}

/// `acpd serve`: the listeners bound, the start message, then the daemon until a signal.
async fn serve_command(args: Args) -> ExitCode {
    let config = match config_of(&args, Purpose::Serve) {
        Ok(c) => c,
        Err(code) => return code,
    };
    raise_nofile();
    seal_own_environ();
    let listener = match TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", config.listen)),
    };
    let tcp = match config.tcp_listen {
        Some(addr) => match TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => return fail(format!("cannot listen on {addr}: {e}")),
        },
        None => None,
    };
    if let Ok(addr) = listener.local_addr() {
        start::announce(&config, addr).await;
    }
    crate::metrics::at_start();
    tokio::spawn(crate::metrics::sample_process());
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    match server::serve(listener, tcp, config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e.to_string()),
    }
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve(args) => serve_command(args).await,
        Command::Stdio(args) => {
            let config = match config_of(&args, Purpose::Admin) {
                Ok(c) => c,
                Err(code) => return code,
            };
            seal_own_environ();
            match run_stdio(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Migrate(args) => {
            let config = match config_of(&args, Purpose::Admin) {
                Ok(c) => c,
                Err(code) => return code,
            };
            if let Err(e) = ensure_data_dir(&config) {
                return fail(e);
            }
            match Store::migrate(&config.store_url).await {
                Ok(v) => {
                    eprintln!("acpd: store schema at version {v}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e.to_string()),
            }
        }
        Command::CheckConfig(args) => match config_of(&args, Purpose::Serve) {
            Ok(c) => {
                eprintln!(
                    "acpd: configuration ok (listen {}, store {}, {} agent profile(s))",
                    c.listen,
                    redact(&c.store_url),
                    c.agents.len()
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Token { action } => token(action).await,
        Command::Usage(u) => usage_command(u).await,
        Command::Budget(b) => budget_command(b).await,
        Command::Share {
            session,
            with,
            role,
            revoke: _,
            args,
        } => share(&args, &session, &with, role.as_deref()).await,
        Command::Cert(args) => server::cert::run(args),
        Command::WebLogin {
            principal,
            ttl,
            url,
            args,
        } => web_login(&args, &principal, ttl, url).await,
        Command::Agent {
            action: AgentAction::Login { name, args },
        } => {
            let config = match config_of(&args, Purpose::Admin) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match config.agents.get(&name) {
                Some(profile) => crate::agent::login::run(profile).await,
                None => {
                    eprintln!("acpd: no agent profile named {name:?}");
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::Man(args) => docs::man(args),
        Command::Completions(args) => docs::completions(args),
    }
}

/// `acpd stdio`: one client on stdin/stdout; ends when stdin closes.
async fn run_stdio(config: Config) -> Result<(), String> {
    let max = config.limits.max_message_bytes;
    let profile = config.default_agent.clone();
    let core = Core::start(config).await.map_err(|e| e.to_string())?;
    let principal = core
        .store
        .ensure_principal(LOCAL_PRINCIPAL)
        .await
        .map_err(|e| e.to_string())?;
    let ctx = crate::acp::connection::ConnectionCtx {
        conn_id: "stdio".into(),
        principal: principal.id,
        principal_name: LOCAL_PRINCIPAL.to_owned(),
        config: core.config.clone(),
        profile,
        hub: core.hub.clone(),
        max_requests_per_second: 0,
        mcp_tunnel: false,
        via_shim: false,
    };
    let cancel = core.drain.child_token();
    let (link, pump) =
        acpd_wire::lines::pump(tokio::io::stdin(), tokio::io::stdout(), max, cancel.clone());
    let pump = tokio::spawn(pump);
    crate::acp::connection::run(link, ctx, cancel).await;
    let _ = pump.await;
    core.shutdown().await;
    Ok(())
}

/// The admin subcommands touch only the store: the data directory matters for SQLite.
fn ensure_data_dir(config: &Config) -> Result<(), String> {
    if config.store_url.starts_with("sqlite:") {
        crate::config::data_dir::prepare(config).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The store as an admin subcommand opens it: shared with a running daemon (not exclusive).
async fn admin_store(args: &Args) -> Result<Store, ExitCode> {
    let config = config_of(args, Purpose::Admin)?;
    ensure_data_dir(&config).map_err(fail)?;
    Store::open(
        &config.store_url,
        crate::session::journal_form::store_options(),
    )
    .await
    .map_err(|e| fail(e.to_string()))
}

/// `acpd usage`: the table on stdout.
async fn usage_command(u: usage::UsageArgs) -> ExitCode {
    let store = match admin_store(&u.args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let r = usage::run(u, &store).await;
    store.close().await;
    match r {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `acpd budget`: the table on stdout.
async fn budget_command(b: budget::BudgetArgs) -> ExitCode {
    match budget::run(b).await {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

async fn token(action: TokenAction) -> ExitCode {
    let args = match &action {
        TokenAction::Create { args, .. }
        | TokenAction::List(args)
        | TokenAction::Revoke { args, .. } => args,
    };
    let store = match admin_store(args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let code = match action {
        TokenAction::Create { name, .. } => match store.ensure_principal(&name).await {
            Ok(p) => {
                let secret = server::auth_secret();
                match store
                    .insert_token(&p.id, &name, &server::auth_hash(&secret))
                    .await
                {
                    Ok(t) => {
                        tracing::info!(target: "acpd::audit", token = %t.id, principal = %name, "token created");
                        eprintln!(
                            "acpd: created token {} for {name}; the secret is shown once:",
                            t.id
                        );
                        println!("{secret}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(e.to_string()),
                }
            }
            Err(e) => fail(e.to_string()),
        },
        TokenAction::List(_) => match store.list_tokens().await {
            Ok(tokens) => {
                for t in tokens {
                    let state = if t.revoked { "revoked" } else { "active" };
                    println!(
                        "{}\t{}\t{}\t{state}",
                        t.id,
                        t.name,
                        rfc3339(t.created_at_ms)
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(e.to_string()),
        },
        TokenAction::Revoke { id, .. } => match store.revoke_token(&id).await {
            Ok(true) => {
                tracing::info!(target: "acpd::audit", token = %id, "token revoked");
                eprintln!("acpd: token {id} revoked");
                // The browsers signed in with it (or by a link for its principal) too.
                match store.revoke_web_sessions(&id).await {
                    Ok(n) if n > 0 => {
                        tracing::info!(target: "acpd::audit", token = %id, sessions = n, "web console sessions ended");
                        ExitCode::SUCCESS
                    }
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => fail(format!("token revoked, but its web sessions: {e}")),
                }
            }
            Ok(false) => fail(format!("no token {id}")),
            Err(e) => fail(e.to_string()),
        },
    };
    store.close().await;
    code
}

/// `acpd share SESSION --with NAME --role R` / `acpd share SESSION --with NAME --revoke`:
/// the store is written here; daemons notice a revocation in their grant poll.
async fn share(args: &Args, session: &str, with: &str, role: Option<&str>) -> ExitCode {
    let store = match admin_store(args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let req = crate::session::ShareRequest {
        session_id: session,
        with,
        role: role.and_then(crate::session::roles::Role::parse),
    };
    let code = match crate::session::share_in_store(&store, None, req).await {
        Ok((answer, _)) => {
            println!("{answer}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e.to_string()),
    };
    store.close().await;
    code
}

/// `--ttl`: `600`, `600s`, `10m`, `1h`; at most a day.
fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        _ => return Err(format!("invalid duration {s:?}: use s, m or h")),
    };
    if secs == 0 || secs > 24 * 3600 {
        return Err("the link's lifetime must be between 1 s and 24 h".into());
    }
    Ok(std::time::Duration::from_secs(secs))
}

/// `acpd web-login`: a one-time code in the store (its hash), the link on stdout.
async fn web_login(
    args: &Args,
    principal: &str,
    ttl: std::time::Duration,
    url: Option<String>,
) -> ExitCode {
    let config = match config_of(args, Purpose::Admin) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let base = url.unwrap_or_else(|| {
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut addr = config.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("{scheme}://{addr}")
    });
    let store = match admin_store(args).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let code = match start::sign_in_link(&store, principal, ttl, &base).await {
        Ok(None) => {
            eprintln!(
                "acpd: no principal named {principal:?}; create it first with `acpd token create --name {principal}`"
            );
            ExitCode::from(EXIT_USAGE)
        }
        Ok(Some(link)) => {
            eprintln!(
                "acpd: a sign-in link for {principal}, valid once within {} s:",
                ttl.as_secs()
            );
            println!("{link}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e.to_string()),
    };
    store.close().await;
    code
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A store URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// First SIGINT/SIGTERM: graceful shutdown. Second: exit at once.
async fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("signal received: draining (send it again to exit at once)");
    shutdown.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second signal: exiting now");
    std::process::exit(130);
}

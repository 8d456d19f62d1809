//! The acpd process under test: spawn, wait until it listens, kill, SIGTERM, restart on the
//! same data dir and store. The only place that knows which store the e2e tests use:
//! SQLite in the temp dir by default, a fresh Postgres database when
//! `ACPD_TEST_E2E_STORE=postgres` (server from `ACPD_TEST_DATABASE_URL`).
//!
//! The daemon's stderr goes to one log file per daemon; it is printed when a test panics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::client::Client;
use super::conn::Conn;
use super::scripted_agent_bin;
use crate::pgtest::TestDb;

/// What differs between daemons of different tests.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// Also listen for raw TCP (`--tcp-listen`).
    pub tcp: bool,
    /// Extra arguments, e.g. `["--list-page-size", "3"]`.
    pub args: Vec<String>,
    /// Store sessions in a fresh Postgres database whatever `ACPD_TEST_E2E_STORE` says.
    pub postgres: bool,
    /// Require tokens (no `--no-auth`); see `support::security_support`.
    pub auth: bool,
    /// Store sessions in SQLite whatever `ACPD_TEST_E2E_STORE` says.
    pub sqlite: bool,
    /// Pass `--advertise-url ws://ADDR` with the daemon's own listener (replicas).
    pub advertise: bool,
    /// With `advertise`: `wss://ADDR` (the daemon serves TLS).
    pub advertise_wss: bool,
    /// Start the daemon with this open-file limit (soft and hard), as a host that keeps
    /// the usual 1024 would.
    pub nofile: Option<u64>,
}

impl DaemonOptions {
    pub fn arg(mut self, name: &str, value: impl ToString) -> DaemonOptions {
        self.args.push(name.to_string());
        self.args.push(value.to_string());
        self
    }

    pub fn postgres(mut self) -> DaemonOptions {
        self.postgres = true;
        self
    }

    pub fn sqlite(mut self) -> DaemonOptions {
        self.sqlite = true;
        self
    }

    pub fn tcp(mut self) -> DaemonOptions {
        self.tcp = true;
        self
    }

    pub fn auth(mut self) -> DaemonOptions {
        self.auth = true;
        self
    }

    pub fn advertise(mut self) -> DaemonOptions {
        self.advertise = true;
        self
    }

    pub fn advertise_wss(mut self) -> DaemonOptions {
        self.advertise = true;
        self.advertise_wss = true;
        self
    }
}

enum Store {
    Sqlite(String),
    Postgres(Option<TestDb>),
    /// Another daemon's store (a second replica): that daemon drops the database.
    Borrowed(String),
}

impl Store {
    async fn create(dir: &Path, opts: &DaemonOptions) -> Store {
        if opts.postgres {
            return Store::Postgres(Some(TestDb::create().await));
        }
        let sqlite = || Store::Sqlite(format!("sqlite://{}", dir.join("acpd.db").display()));
        if opts.sqlite {
            return sqlite();
        }
        match std::env::var("ACPD_TEST_E2E_STORE").as_deref() {
            Ok("postgres") => Store::Postgres(Some(TestDb::create().await)),
            Ok("sqlite") | Ok("") | Err(_) => sqlite(),
            Ok(other) => panic!("ACPD_TEST_E2E_STORE={other}: expected sqlite or postgres"),
        }
    }

    fn url(&self) -> String {
        match self {
            Store::Sqlite(url) | Store::Borrowed(url) => url.clone(),
            Store::Postgres(db) => db
                .as_ref()
                .expect("database not dropped yet")
                .url()
                .to_string(),
        }
    }
}

/// How the daemon is reached.
enum Mode {
    Serve,
    Stdio,
}

pub struct Daemon {
    dir: tempfile::TempDir,
    store: Store,
    opts: DaemonOptions,
    mode: Mode,
    child: Option<Child>,
    /// WebSocket listener (serve mode).
    pub addr: SocketAddr,
    /// Raw TCP listener, when `opts.tcp`.
    pub tcp_addr: Option<SocketAddr>,
    starts: u32,
}

/// Port 0 on loopback: the daemon binds whatever the kernel gives and logs it, and the
/// harness reads the address from the log. Picking a "free" port first and passing it
/// races every other test on the box for it (another daemon, or a client's ephemeral port,
/// can take it between the pick and the daemon's bind), and polling it with `connect`
/// before the daemon listens can connect a socket to itself.
const ANY_PORT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A free loopback port: bind to port 0, read it, let it go. Only where the address must
/// be known before the daemon starts (`--advertise-url`).
fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr")
}

/// The address in the first `{before}SCHEME://ADDR…` of `log`: how a daemon started on port
/// 0 says which port it got.
pub fn listening_addr(log: &str, before: &str) -> Option<SocketAddr> {
    let rest = log.split_once(before)?.1;
    let rest = rest.split_once("://")?.1;
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || ".:[]".contains(c)))
        .unwrap_or(rest.len());
    rest[..end].parse::<SocketAddr>().ok()
}

/// Single-quotes a word for the daemon's shell-like splitting of `--agent NAME=COMMAND`.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

impl Daemon {
    /// `acpd serve` with default options.
    pub async fn start() -> Daemon {
        Daemon::start_with(DaemonOptions::default()).await
    }

    pub async fn start_with(opts: DaemonOptions) -> Daemon {
        let mut daemon = Daemon::prepare(opts, Mode::Serve).await;
        daemon.spawn().await;
        daemon
    }

    /// A second `acpd serve` on `other`'s store (its own data dir, ports and agents), as a
    /// second replica would run.
    pub async fn start_beside(other: &Daemon, opts: DaemonOptions) -> Daemon {
        let mut daemon = Daemon::beside(other, opts).await;
        daemon.spawn().await;
        daemon
    }

    /// Runs `acpd serve` on `other`'s store to its exit, for a start that must be refused;
    /// returns how it exited and what it wrote to stderr (panics if it runs for 30 s).
    pub async fn run_beside_to_exit(other: &Daemon) -> (ExitStatus, String) {
        let daemon = Daemon::beside(other, DaemonOptions::default()).await;
        let log = std::fs::File::create(daemon.log_path()).expect("daemon log file");
        let status = Command::new(env!("CARGO_BIN_EXE_acpd"))
            .args(daemon.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .status();
        let status = tokio::time::timeout(Duration::from_secs(30), status)
            .await
            .expect("acpd should exit within 30 s")
            .expect("run acpd");
        let stderr = std::fs::read_to_string(daemon.log_path()).unwrap_or_default();
        (status, stderr)
    }

    async fn beside(other: &Daemon, opts: DaemonOptions) -> Daemon {
        // SQLite in its own temp dir, never used: the store is `other`'s.
        let mut daemon = Daemon::prepare(opts.sqlite(), Mode::Serve).await;
        daemon.store = Store::Borrowed(other.store_url());
        daemon
    }

    /// `acpd stdio`, with a client on its stdin/stdout.
    pub async fn stdio(opts: DaemonOptions) -> (Daemon, Client) {
        let mut daemon = Daemon::prepare(opts, Mode::Stdio).await;
        let conn = daemon
            .spawn()
            .await
            .expect("stdio mode yields a connection");
        (daemon, Client::new(conn))
    }

    async fn prepare(opts: DaemonOptions, mode: Mode) -> Daemon {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("work")).expect("work dir");
        std::fs::create_dir_all(dir.path().join("pids")).expect("pid dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("data dir");
        let store = Store::create(dir.path(), &opts).await;
        Daemon {
            dir,
            store,
            opts,
            mode,
            child: None,
            addr: ANY_PORT,
            tcp_addr: None,
            starts: 0,
        }
    }

    fn args(&self) -> Vec<String> {
        let pids = quote(&self.pid_dir().display().to_string());
        let agent = quote(scripted_agent_bin());
        let mut args = match self.mode {
            Mode::Serve => vec![
                "serve".to_string(),
                "--listen".into(),
                self.addr.to_string(),
            ],
            Mode::Stdio => vec!["stdio".to_string()],
        };
        if let Some(tcp) = self.tcp_addr {
            args.extend(["--tcp-listen".into(), tcp.to_string()]);
        }
        args.extend([
            "--store".into(),
            self.store.url(),
            "--data-dir".into(),
            self.dir.path().join("data").display().to_string(),
            "--agent".into(),
            format!("scripted={agent} --pid-dir {pids}"),
            "--agent".into(),
            format!("noload={agent} --no-load --no-resume --pid-dir {pids}"),
            "--default-agent".into(),
            "scripted".into(),
        ]);
        if !self.opts.auth {
            args.push("--no-auth".into());
        }
        if self.opts.advertise {
            let scheme = if self.opts.advertise_wss { "wss" } else { "ws" };
            args.extend([
                "--advertise-url".into(),
                format!("{scheme}://{}", self.addr),
            ]);
        }
        args.extend(self.opts.args.iter().cloned());
        args
    }

    /// Spawns the process; in serve mode waits until it accepts connections, in stdio mode
    /// returns the connection over its stdio.
    async fn spawn(&mut self) -> Option<Conn> {
        self.starts += 1;
        if matches!(self.mode, Mode::Serve) {
            // Fresh ports on every start (the old ones may linger in TIME_WAIT); only an
            // advertised address must be known up front.
            self.addr = if self.opts.advertise {
                free_port()
            } else {
                ANY_PORT
            };
            if self.opts.tcp {
                self.tcp_addr = Some(ANY_PORT);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("daemon log file");
        use std::io::Write;
        let _ = writeln!(&log, "===== acpd start #{} =====", self.starts);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_acpd"));
        cmd.args(self.args()).stderr(log).kill_on_drop(true);
        if let Some(n) = self.opts.nofile {
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        let stdio = matches!(self.mode, Mode::Stdio);
        if stdio {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null()).stdout(Stdio::null());
        }
        let mut child = cmd.spawn().expect("spawn acpd");
        let conn = if stdio {
            let stdin = child.stdin.take().expect("piped stdin");
            let stdout = child.stdout.take().expect("piped stdout");
            Some(Conn::lines(stdout, stdin))
        } else {
            None
        };
        self.child = Some(child);
        if !stdio {
            self.addr = self.wait_listening("acpd listening: ").await;
            if self.tcp_addr.is_some() {
                let tcp = self.wait_listening("newline-delimited TCP listener: ");
                self.tcp_addr = Some(tcp.await);
            }
        }
        conn
    }

    /// Waits until this start's log says the listener is bound (`{before}SCHEME://ADDR…`)
    /// and returns ADDR; panics if the daemon exits or 10 s pass.
    async fn wait_listening(&mut self, before: &str) -> SocketAddr {
        let marker = format!("===== acpd start #{} =====", self.starts);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            let this_start = log.rsplit_once(&marker).map_or("", |(_, rest)| rest);
            if let Some(addr) = listening_addr(this_start, before) {
                return addr;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("acpd exited with {status} before logging `{before}`");
            }
            assert!(
                Instant::now() < deadline,
                "acpd did not log `{before}` within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The Postgres database of this daemon, when it stores sessions in Postgres.
    pub fn postgres_db(&self) -> Option<&TestDb> {
        match &self.store {
            Store::Postgres(db) => db.as_ref(),
            Store::Sqlite(_) | Store::Borrowed(_) => None,
        }
    }

    /// The store URL, for admin subcommands (`acpd token create`) run beside the daemon.
    pub fn store_url(&self) -> String {
        self.store.url()
    }

    /// The daemon's pid, for signals.
    pub fn pid(&self) -> i32 {
        let child = self.child.as_ref().expect("acpd is running");
        child.id().expect("acpd is running") as i32
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// An existing directory to use as a session's `cwd`.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// Where the scripted agents drop a file named after their pid.
    pub fn pid_dir(&self) -> PathBuf {
        self.dir.path().join("pids")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("acpd.log")
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/acp", self.addr)
    }

    /// A new WebSocket client (not initialized).
    pub async fn connect(&self) -> Client {
        Client::connect_ws(&self.ws_url())
            .await
            .expect("connect to acpd")
    }

    /// A new WebSocket client after `initialize`.
    pub async fn client(&self) -> Client {
        let mut client = self.connect().await;
        client.initialize().await;
        client
    }

    /// A new raw TCP client (not initialized).
    pub async fn connect_tcp(&self) -> Client {
        let addr = self
            .tcp_addr
            .expect("daemon started with DaemonOptions::tcp()");
        Client::connect_tcp(addr)
            .await
            .expect("connect to acpd over tcp")
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .expect("acpd did not die of SIGKILL");
        }
    }

    /// SIGTERM; returns the exit status (panics if acpd is not gone within 10 s).
    pub async fn sigterm(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("acpd is running");
        let pid = child.id().expect("acpd is running") as i32;
        // SAFETY: plain syscall on a pid we own and have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .expect("acpd did not exit within 10 s of SIGTERM")
            .expect("wait for acpd")
    }

    /// SIGTERM (acpd drains and exits) and start again on the same data dir and store.
    pub async fn restart_gracefully(&mut self) {
        let status = self.sigterm().await;
        assert!(status.success(), "acpd exited with {status} after SIGTERM");
        self.spawn().await;
    }

    /// SIGKILL (if running) and start again on the same data dir and store.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// Waits (bounded) until the daemon says a client's queue filled and it is fed from the
    /// journal; a test that never gets there did not exercise what it is about.
    pub async fn until_lagging(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .contains("feeding it from the journal")
        {
            assert!(
                Instant::now() < deadline,
                "no client's queue filled: the test did not exercise a lagging client"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pids the scripted agents recorded in the pid dir.
    pub fn agent_pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = std::fs::read_dir(self.pid_dir())
            .expect("read pid dir")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort();
        pids
    }
}

/// Whether `pid` names a live process (zombies count as dead: nobody may reap them here).
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Polls until none of `pids` is alive; returns the ones still alive after `within`.
pub async fn wait_all_dead(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|p| process_alive(*p)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            eprintln!(
                "----- acpd stderr ({}) -----\n{log}----- end of acpd stderr -----",
                self.log_path().display()
            );
        }
        if let Store::Postgres(db) = &mut self.store
            && let Some(db) = db.take()
        {
            // Drop cannot await; a thread with its own runtime can.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                if let Ok(rt) = rt {
                    rt.block_on(db.drop_db());
                }
            })
            .join();
        }
    }
}

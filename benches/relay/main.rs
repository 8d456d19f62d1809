//! Relay benchmark: acpd against a bare relay (a websocat pair) and the agent over direct
//! stdio, side by side in one run, each path pinned to one CPU and unpinned.
//!
//! `bench/run.sh` builds the release binaries and runs this (`cargo bench --bench relay`);
//! bench/README.md explains the paths, the options and the latest results. Postgres rows
//! appear when `ACPD_TEST_DATABASE_URL` names a server (a throwaway database is used).

mod conns;
mod fanout;
mod lowrate;
mod new_session;
mod opts;
mod procs;
mod replicas;
mod report;
mod rt;
mod ssh;
mod store;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use opts::Opts;
use procs::{Bins, LineClient, Mode, Server};
use report::{Report, Unit};

/// Entries of the session `session/load` replays.
const LOAD_ENTRIES: u64 = 10_000;

/// The ways the editor's stdio reaches the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Stdio,
    Pair,
    Ssh,
    SshMux,
    ShimSqlite,
    ShimPostgres,
    WebsocatAcpd,
}

const WS_ACPD: &str = "websocat → acpd, SQLite";
use report::{PAIR, SHIM_PG, SHIM_SQLITE, SSH, SSH_MUX, STDIO};

impl Route {
    /// Through acpd, which emulates `session/close` (the scripted agent has none).
    fn closes(self) -> bool {
        matches!(
            self,
            Route::ShimSqlite | Route::ShimPostgres | Route::WebsocatAcpd
        )
    }

    fn label(self) -> &'static str {
        match self {
            Route::Stdio => STDIO,
            Route::Pair => PAIR,
            Route::Ssh => SSH,
            Route::SshMux => SSH_MUX,
            Route::ShimSqlite => SHIM_SQLITE,
            Route::ShimPostgres => SHIM_PG,
            Route::WebsocatAcpd => WS_ACPD,
        }
    }
}

/// The servers of one mode.
struct Servers {
    sqlite: Server,
    postgres: Option<Server>,
    pair: Server,
    /// None when sshd is not installed.
    ssh: Option<ssh::Sshd>,
}

fn acpd_url(s: &Server) -> String {
    format!("ws://127.0.0.1:{}/acp", s.port)
}

fn shim(mode: Mode, bins: &Bins, server: &Server) -> std::process::Command {
    let mut cmd = mode.command(&bins.shim);
    cmd.arg(acpd_url(server)).env("ACPD_LOG", "warn");
    cmd
}

fn websocat_client(mode: Mode, bins: &Bins, url: &str) -> std::process::Command {
    let mut cmd = mode.command(&bins.websocat);
    // `-B`: websocat splits a message longer than its 64 KiB buffer into broken lines; a
    // replay's merged chunks are up to acpd's 16 MiB message limit.
    cmd.args(["--text", "-q", "-B", "16777216", url]);
    cmd
}

fn open(mode: Mode, bins: &Bins, sv: &Servers, path: Route) -> Result<LineClient> {
    let cmd = match path {
        Route::Stdio => mode.command(&bins.agent),
        Route::Pair => websocat_client(mode, bins, &format!("ws://127.0.0.1:{}/", sv.pair.port)),
        Route::Ssh | Route::SshMux => match &sv.ssh {
            Some(s) => s.client(mode, &bins.agent, path == Route::SshMux),
            None => bail!("no sshd"),
        },
        Route::ShimSqlite => shim(mode, bins, &sv.sqlite),
        Route::ShimPostgres => match &sv.postgres {
            Some(s) => shim(mode, bins, s),
            None => bail!("no Postgres"),
        },
        Route::WebsocatAcpd => websocat_client(mode, bins, &acpd_url(&sv.sqlite)),
    };
    LineClient::spawn(cmd)
}

/// p50 and p99 in µs.
fn percentiles(mut v: Vec<Duration>) -> Vec<f64> {
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        v[i].as_secs_f64() * 1e6
    };
    vec![at(0.50), at(0.99)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn run_mode(
    mode: Mode,
    opts: &Opts,
    bins: &Bins,
    pg: Option<&str>,
    tmp: &Path,
    report: &mut Report,
) -> Result<()> {
    mode.enter()?;
    let m = mode.label();
    eprintln!("[{m}] starting servers");
    let dir = tmp.join(m);
    let sv = Servers {
        sqlite: Server::acpd(mode, bins, &dir.join("sqlite"), None)?,
        postgres: match pg {
            Some(url) => Some(Server::acpd(mode, bins, &dir.join("postgres"), Some(url))?),
            None => None,
        },
        pair: Server::websocat(mode, bins, Some(&bins.agent))?,
        ssh: match Path::new(ssh::SSHD).exists() {
            true => Some(ssh::Sshd::start(mode, &dir.join("ssh"))?),
            false => None,
        },
    };
    let mut paths = vec![Route::Stdio, Route::Pair];
    if sv.ssh.is_some() {
        paths.extend([Route::Ssh, Route::SshMux]);
    }
    paths.push(Route::ShimSqlite);
    if sv.postgres.is_some() {
        paths.push(Route::ShimPostgres);
    }
    paths.push(Route::WebsocatAcpd);

    let mut clients = Vec::new();
    let needs_clients = ["rt", "stream", "load", "lowrate"]
        .iter()
        .any(|s| opts.wants(s));
    for &p in paths.iter().filter(|_| needs_clients) {
        let mut c = open(mode, bins, &sv, p).with_context(|| p.label())?;
        let sid = c.open_session().with_context(|| p.label())?;
        // The first prompt's updates wait out acpd's bootstrap hold (100 ms after session/new).
        c.prompt(&sid, "echo warm")?;
        std::thread::sleep(Duration::from_millis(150));
        for _ in 0..100 {
            c.prompt(&sid, "echo warm")?;
            c.call("_scripted/echo", json!({ "n": 1 }))?;
        }
        clients.push((p, c, sid));
    }
    if opts.wants("rt") {
        rt::round_trips(mode, opts, &mut clients, report)?;
    }
    if opts.wants("stream") {
        streaming(mode, opts, &mut clients, report)?;
    }
    if opts.wants("lowrate") {
        lowrate::latency(mode, opts, &mut clients, report)?;
    }
    if opts.wants("load") {
        loads(mode, opts, &mut clients, report)?;
    }
    for (_, c, _) in clients {
        c.close();
    }
    if opts.wants("start") {
        cold_starts(mode, opts, bins, &sv, report)?;
    }
    if opts.wants("store") {
        store_alone(mode, opts, pg, &dir, report)?;
    }
    drop(sv);
    Mode::Unpinned.enter()?;
    Ok(())
}

type Clients = Vec<(Route, LineClient, String)>;

fn streaming(mode: Mode, opts: &Opts, clients: &mut Clients, report: &mut Report) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] streaming");
    let n = opts.updates;
    let title = format!(
        "streaming: one prompt, {n} session/update × 64 B of text, median of {} — msgs/s, MB/s of update lines",
        opts.runs
    );
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); clients.len()];
    for _ in 0..opts.runs {
        // Interleaved, so whatever else the machine does hits every path alike.
        for (i, (p, c, sid)) in clients.iter_mut().enumerate() {
            let bytes = c.update_bytes;
            let t = Instant::now();
            let a = c.prompt(sid, &format!("stream {n} 64"))?;
            let dt = t.elapsed().as_secs_f64();
            ensure!(
                a.updates >= n,
                "{}: {} of {n} updates",
                p.label(),
                a.updates
            );
            runs[i].push((n as f64 / dt, (c.update_bytes - bytes) as f64 / dt / 1e6));
        }
    }
    for ((p, _, _), r) in clients.iter().zip(runs) {
        let msgs = median(r.iter().map(|x| x.0).collect());
        let mb = median(r.iter().map(|x| x.1).collect());
        report.put(
            "stream",
            &title,
            Unit::Stream,
            p.label(),
            mode,
            vec![msgs, mb],
        );
    }
    Ok(())
}

fn loads(mode: Mode, opts: &Opts, clients: &mut Clients, report: &mut Report) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] session/load");
    let title = format!(
        "session/load of a {LOAD_ENTRIES}-entry session (acpd: from its journal; others: the agent's own history), median of {} — ms",
        opts.loads
    );
    for (p, c, _) in clients.iter_mut() {
        // available_commands_update + the prompt + its chunks = LOAD_ENTRIES.
        let sid = c.new_session()?;
        c.prompt(&sid, &format!("stream {} 64", LOAD_ENTRIES - 2))?;
        std::thread::sleep(Duration::from_millis(200));
        let mut times = Vec::new();
        for _ in 0..opts.loads {
            let t = Instant::now();
            let id = c.send(
                "session/load",
                json!({ "sessionId": sid, "cwd": procs::SESSION_CWD, "mcpServers": [] }),
            )?;
            let (a, answered, text) = c.wait_text(id)?;
            times.push(answered.duration_since(t).as_secs_f64() * 1e3);
            // acpd's replay merges consecutive chunks into one message (fewer updates, the
            // same text); the agents replay each chunk. The text is what must all be there.
            ensure!(
                text == (LOAD_ENTRIES - 2) * 64,
                "{}: load replayed {text} bytes of text in {} updates",
                p.label(),
                a.updates
            );
            // acpd holds live updates for 100 ms after a load; nothing is live here.
        }
        report.put(
            "load",
            &title,
            Unit::Millis,
            p.label(),
            mode,
            vec![median(times)],
        );
    }
    Ok(())
}

fn cold_starts(
    mode: Mode,
    opts: &Opts,
    bins: &Bins,
    sv: &Servers,
    report: &mut Report,
) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] cold start");
    let title = format!(
        "cold start: spawn → initialize answered (acpd: daemon and agent warm; ssh: a fresh agent, plain with a handshake of its own), median of {} — ms",
        opts.starts
    );
    let mut shim_t = Vec::new();
    let mut ws_t = Vec::new();
    let mut ssh_t = Vec::new();
    let mut mux_t = Vec::new();
    for _ in 0..opts.starts {
        for (which, out) in [
            (0, &mut shim_t),
            (1, &mut ws_t),
            (2, &mut ssh_t),
            (3, &mut mux_t),
        ] {
            let cmd = match (which, &sv.ssh) {
                (0, _) => shim(mode, bins, &sv.sqlite),
                (1, _) => websocat_client(mode, bins, &acpd_url(&sv.sqlite)),
                (_, Some(s)) => s.client(mode, &bins.agent, which == 3),
                (_, None) => continue,
            };
            let mut c = LineClient::spawn(cmd)?;
            c.call("initialize", json!({ "protocolVersion": 1 }))?;
            out.push(c.spawned.elapsed().as_secs_f64() * 1e3);
            c.close();
        }
    }
    report.put(
        "start",
        &title,
        Unit::Millis,
        "acp-shim",
        mode,
        vec![median(shim_t)],
    );
    report.put_relay(
        "start",
        &title,
        Unit::Millis,
        "websocat",
        mode,
        vec![median(ws_t)],
    );
    if sv.ssh.is_some() {
        report.put(
            "start",
            &title,
            Unit::Millis,
            SSH,
            mode,
            vec![median(ssh_t)],
        );
        report.put(
            "start",
            &title,
            Unit::Millis,
            SSH_MUX,
            mode,
            vec![median(mux_t)],
        );
    }
    Ok(())
}

fn store_alone(
    mode: Mode,
    opts: &Opts,
    pg: Option<&str>,
    dir: &Path,
    report: &mut Report,
) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] store alone");
    let title = format!(
        "store alone (no daemon): {} group-commit appends of ~300-byte updates — appends/s; 10 000-entry journal read — ms; one session row's insert — p50 / p99 µs",
        opts.store_appends
    );
    // A runtime on this (pinned or not) thread: sqlx's SQLite worker inherits the affinity.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let db = format!("sqlite://{}", dir.join("store-alone.db").display());
    let mut stores = vec![("SQLite", db)];
    if let Some(url) = pg {
        stores.push(("Postgres", url.to_owned()));
    }
    for (label, url) in stores {
        let s = rt.block_on(store::measure(&url, m, opts.store_appends, 10_000))?;
        report.put(
            "store",
            &title,
            Unit::Store,
            label,
            mode,
            [vec![s.appends_per_s, s.read_ms], s.insert_us].concat(),
        );
    }
    Ok(())
}

fn run_conns(opts: &Opts, bins: &Bins, tmp: &Path, report: &mut Report) -> Result<()> {
    use conns::Kind;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for &n in &opts.conns {
        eprintln!("[unpinned] {n} idle connections");
        let key = format!("conns-{n}");
        let title = format!(
            "idle WebSocket connections, {n} held (initialize answered on each; 64 being set up at a time) — server RSS growth per connection; time to establish all (p50 / p99 of one)"
        );
        for (label, kind) in [
            ("acpd, plain RFD client", Kind::Plain),
            ("acpd, acpd.resume.v1 (acp-shim's)", Kind::Resumable),
        ] {
            let srv = Server::acpd(
                Mode::Unpinned,
                bins,
                &tmp.join(format!("conns-{n}-{kind:?}")),
                None,
            )?;
            let pid = srv.pid();
            let h = rt.block_on(conns::hold(srv.port, "/acp", kind, n, || {
                procs::rss_kib(pid)
            }))?;
            report.put(&key, &title, Unit::Conns, label, Mode::Unpinned, held(&h));
        }
        let srv = Server::websocat(Mode::Unpinned, bins, None)?;
        let pid = srv.pid();
        let h = rt.block_on(conns::hold(srv.port, "/", Kind::Mirror, n, || {
            procs::rss_kib(pid)
        }))?;
        report.put_relay(
            &key,
            &title,
            Unit::Conns,
            "websocat mirror: (relay alone, no agent)",
            Mode::Unpinned,
            held(&h),
        );
        // Let the closed sockets go before the next round.
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

fn held(h: &conns::Held) -> Vec<f64> {
    vec![
        h.kib_per_conn,
        h.establish.as_secs_f64(),
        h.p50.as_secs_f64() * 1e3,
        h.p99.as_secs_f64() * 1e3,
        h.base_kib as f64,
        h.n as f64,
    ]
}

fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on our own process; children inherit the limit.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            return r.rlim_cur;
        }
    }
    0
}

fn find_websocat() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WEBSOCAT") {
        return Ok(p.into());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("websocat"))
        .find(|p| p.is_file())
        .context("websocat not found: `cargo install websocat`, or set WEBSOCAT")
}

fn machine(bins: &Bins) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let websocat = std::process::Command::new(&bins.websocat)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "{} · nproc {nproc} · {cpu} · Linux {} · {websocat} · {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        kernel.trim(),
        ssh::Sshd::version()
    )
}

/// A binary of another workspace member, beside this benchmark's `deps/` folder
/// (bench/run.sh builds them first).
fn workspace_bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or_else(|| anyhow::anyhow!("no target dir above {}", exe.display()))?
        .join(name);
    anyhow::ensure!(
        path.exists(),
        "{} is missing: run bench/run.sh",
        path.display()
    );
    Ok(path)
}

fn main() -> Result<()> {
    let opts = Opts::parse()?;
    let bins = Bins {
        acpd: env!("CARGO_BIN_EXE_acpd").into(),
        shim: workspace_bin("acp-shim")?,
        agent: workspace_bin("acpd-scripted-agent")?,
        websocat: find_websocat()?,
    };
    let nofile = raise_nofile();
    let need = opts.conns.iter().max().copied().unwrap_or(0) as u64 + 512;
    ensure!(
        nofile >= need,
        "the open-file limit is {nofile}; {need} are needed (raise the hard limit: ulimit -Hn)"
    );
    // A hung peer must not hang the run forever.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(3600));
        eprintln!("relay bench: still running after an hour, giving up");
        std::process::exit(2);
    });
    let tmp = tempfile::tempdir()?;
    let admin = std::env::var("ACPD_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg = match &admin {
        Some(a) => Some(setup.block_on(store::create_database(a))?),
        None => None,
    };
    let mut report = Report::new(machine(&bins), &opts);
    let outcome = (|| -> Result<()> {
        for &mode in opts.modes() {
            run_mode(
                mode,
                &opts,
                &bins,
                pg.as_ref().map(|p| p.1.as_str()),
                tmp.path(),
                &mut report,
            )?;
            if let (true, Some(a)) = (opts.wants("replicas"), &admin) {
                replicas::run(mode, &opts, &bins, a, tmp.path(), &mut report)?;
            }
        }
        if opts.wants("conns") {
            run_conns(&opts, &bins, tmp.path(), &mut report)?;
        }
        if opts.wants("fanout") {
            fanout::run(&opts, &bins, tmp.path(), &mut report)?;
        }
        if opts.wants("sessions") {
            new_session::held(&opts, &bins, tmp.path(), &mut report)?;
        }
        Ok(())
    })();
    if let (Some(a), Some((name, _))) = (&admin, &pg)
        && let Err(e) = setup.block_on(store::drop_database(a, name))
    {
        eprintln!("could not drop the database {name}: {e}");
    }
    outcome?;
    if !Path::new(ssh::SSHD).exists() {
        report.note("ssh: skipped (no /usr/sbin/sshd; apt-get install openssh-server)");
    }
    if pg.is_none() {
        report.note("Postgres and replicas: skipped (set ACPD_TEST_DATABASE_URL to include them)");
    }
    print!("{}", report.render());
    Ok(())
}

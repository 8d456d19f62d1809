//! The replicas section (`--only replicas`, with `ACPD_TEST_DATABASE_URL`): two acpd replicas
//! on one fresh Postgres database; a prompt streamed straight to the session's owner (A)
//! against the same prompt through a replica (B) that forwards it to A over the internal
//! link. The ratio column is B's rate over A's, same run and mode.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::opts::Opts;
use crate::procs::{self, Bins, LineClient, Mode, Server};
use crate::report::{Report, Unit};
use crate::{median, shim, store};

pub const OWNER: &str = "acp-shim → replica A (the owner)";
pub const FORWARDED: &str = "acp-shim → replica B → A (forwarding)";

/// Starts replica `name` on `db`, advertising its own listener.
fn replica(mode: Mode, bins: &Bins, dir: &Path, db: &str, name: &str) -> Result<Server> {
    let port = procs::free_port()?;
    let secret = dir.join("cluster-secret");
    std::fs::create_dir_all(dir)?;
    std::fs::write(&secret, "bench-cluster-secret-0123456789\n")?;
    let extra = [
        "--replicas".to_owned(),
        "--replica-id".to_owned(),
        name.to_owned(),
        "--advertise-url".to_owned(),
        format!("ws://127.0.0.1:{port}"),
        "--lease-ttl-ms".to_owned(),
        "3000".to_owned(),
        "--cluster-secret-file".to_owned(),
        secret.display().to_string(),
    ];
    Server::acpd_with(mode, bins, &dir.join(name), Some(db), port, &extra)
}

/// A shim on `server` with its session warmed up (the first prompt waits out acpd's
/// bootstrap hold; on B it also opens the internal link).
fn warm(c: &mut LineClient, sid: &str) -> Result<()> {
    c.prompt(sid, "echo warm")?;
    std::thread::sleep(Duration::from_millis(150));
    for _ in 0..100 {
        c.prompt(sid, "echo warm")?;
    }
    Ok(())
}

/// Both rows of one mode, on a database of their own (created and dropped here).
pub fn run(
    mode: Mode,
    opts: &Opts,
    bins: &Bins,
    admin: &str,
    tmp: &Path,
    report: &mut Report,
) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] replicas: forwarding vs the owner");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (name, db) = rt.block_on(store::create_database(admin))?;
    mode.enter()?;
    let outcome = measure(
        mode,
        opts,
        bins,
        &db,
        &tmp.join(format!("replicas-{m}")),
        report,
    );
    Mode::Unpinned.enter()?;
    // The replicas are stopped by now (dropped in `measure`): the database is free.
    if let Err(e) = rt.block_on(store::drop_database(admin, &name)) {
        eprintln!("could not drop the database {name}: {e}");
    }
    outcome
}

fn measure(
    mode: Mode,
    opts: &Opts,
    bins: &Bins,
    db: &str,
    dir: &Path,
    report: &mut Report,
) -> Result<()> {
    let a = replica(mode, bins, dir, db, "a")?;
    let b = replica(mode, bins, dir, db, "b")?;
    // The owner's row: a session opened and streamed through a shim on A.
    let mut on_a = LineClient::spawn(shim(mode, bins, &a))?;
    let direct = on_a.open_session().context("session on A")?;
    warm(&mut on_a, &direct)?;
    // The forwarded row's session is opened on A too (A owns it) by a shim that then goes
    // away, so no client on A reads the forwarded stream as well; the session stays live
    // on A (it leaves memory only after minutes without a client).
    let mut opener = LineClient::spawn(shim(mode, bins, &a))?;
    let forwarded = opener.open_session().context("second session on A")?;
    opener.close();
    let mut on_b = LineClient::spawn(shim(mode, bins, &b))?;
    on_b.call(
        "initialize",
        json!({ "protocolVersion": 1, "clientCapabilities": {} }),
    )?;
    warm(&mut on_b, &forwarded).context("prompting A's session through B")?;

    let n = opts.updates;
    let title = format!(
        "replicas on one Postgres: one prompt, {n} session/update × 64 B, median of {} — msgs/s, MB/s of update lines (× the owner)",
        opts.runs
    );
    let mut runs = [Vec::new(), Vec::new()];
    for _ in 0..opts.runs {
        // Interleaved, like the streaming section.
        for (i, (label, c, sid)) in [
            (OWNER, &mut on_a, &direct),
            (FORWARDED, &mut on_b, &forwarded),
        ]
        .into_iter()
        .enumerate()
        {
            let bytes = c.update_bytes;
            let t = Instant::now();
            let got = c.prompt(sid, &format!("stream {n} 64"))?;
            let dt = t.elapsed().as_secs_f64();
            ensure!(got.updates >= n, "{label}: {} of {n} updates", got.updates);
            runs[i].push((n as f64 / dt, (c.update_bytes - bytes) as f64 / dt / 1e6));
        }
    }
    for (label, r) in [OWNER, FORWARDED].into_iter().zip(runs) {
        let v = vec![
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
        ];
        if label == OWNER {
            report.put_relay("replicas", &title, Unit::Stream, label, mode, v);
        } else {
            report.put("replicas", &title, Unit::Stream, label, mode, v);
        }
    }
    on_a.close();
    on_b.close();
    drop((a, b));
    Ok(())
}

//! `session/new` timed: the round trip of the `rt` section (sequential `session/new`s on one
//! connection, closed a batch at a time), and the `sessions` section (sessions opened and
//! held: what each live session costs acpd).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::procs::{self, Bins, LineClient, Mode, Server};
use crate::report::{Report, Unit};
use crate::{Opts, percentiles, shim};

/// Sessions opened between two rounds of `session/close` on the acpd paths, so acpd's live
/// set stays as small as an editor's (the closes are pipelined and not timed).
const NEW_BATCH: usize = 100;
/// Untimed `session/new`s before the timed ones.
const NEW_WARM: usize = 50;

/// `n` sequential `session/new` on one connection, timed one by one. The scripted agent
/// answers at once and alone (`quiet`: no `available_commands_update` before the answer,
/// which would make it two messages and stall websocat's second on Nagle, as the prompt
/// round trip does); acpd also writes the session's row and starts its actor before it
/// answers. `close`: the sessions are closed a batch at a time (acpd emulates `session/close`;
/// the scripted agent has none).
pub fn timed(c: &mut LineClient, n: usize, close: bool) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(n);
    let mut open = Vec::with_capacity(NEW_BATCH);
    for i in 0..NEW_WARM + n {
        let t = Instant::now();
        let sid = c.new_session_quiet()?;
        if i >= NEW_WARM {
            times.push(t.elapsed());
        }
        open.push(sid);
        if open.len() == NEW_BATCH || i + 1 == NEW_WARM || i + 1 == NEW_WARM + n {
            if close {
                let ids = open
                    .drain(..)
                    .map(|sid| c.send("session/close", json!({ "sessionId": sid })))
                    .collect::<Result<Vec<_>>>()?;
                c.wait_all(&ids)?;
            }
            open.clear();
        }
    }
    Ok(times)
}

/// The `sessions` section: `opts.sessions` sessions opened one after another on one acp-shim
/// connection and held, none closed: acpd's resident memory per live session, and what one
/// more `session/new` costs as the live set grows — a row at 100, 1 000, 5 000, 10 000 live
/// (those up to `opts.sessions`, and `opts.sessions` itself), each with the p50 / p99 of the
/// calls of the last tenth before it (at least the last 100). Its own agent process and
/// connection are started first and not counted.
pub fn held(opts: &Opts, bins: &Bins, tmp: &Path, report: &mut Report) -> Result<()> {
    let n = opts.sessions;
    eprintln!("[unpinned] {n} live sessions");
    let title = format!(
        "live sessions, up to {n} opened on one acp-shim connection and held (SQLite) — acpd RSS growth per session; time to open them (session/new p50 / p99 of the last tenth before that many were live)"
    );
    let mode = Mode::Unpinned;
    let srv = Server::acpd(mode, bins, &tmp.join("sessions"), None)?;
    let pid = srv.pid();
    let mut c = LineClient::spawn(shim(mode, bins, &srv))?;
    c.call("initialize", json!({ "protocolVersion": 1 }))?;
    c.new_session_quiet()?;
    let base = procs::rss_kib(pid)?;
    let mut marks: Vec<usize> = [100, 1000, 5000, 10_000]
        .into_iter()
        .filter(|&k| k < n)
        .collect();
    marks.push(n);
    let started = Instant::now();
    let mut times = Vec::with_capacity(n);
    for i in 1..=n {
        let t = Instant::now();
        c.new_session_quiet()?;
        times.push(t.elapsed());
        if !marks.contains(&i) {
            continue;
        }
        let grown = procs::rss_kib(pid)?.saturating_sub(base);
        let window = (i / 10).max(100).min(i);
        let [p50, p99] = percentiles(times[i - window..].to_vec())[..] else {
            unreachable!("percentiles gives p50 and p99")
        };
        let vals = vec![
            grown as f64 / i as f64,
            started.elapsed().as_secs_f64(),
            p50,
            p99,
            base as f64,
            i as f64,
        ];
        report.put(
            "sessions",
            &title,
            Unit::Sessions,
            &format!("acp-shim → acpd, {i} live"),
            mode,
            vals,
        );
    }
    c.close();
    Ok(())
}

//! The round-trip section (`rt`): `session/prompt`, `_scripted/echo` and `session/new`, each
//! sequential on one connection, timed one by one.

use super::*;

pub(super) fn round_trips(
    mode: Mode,
    opts: &Opts,
    clients: &mut Clients,
    report: &mut Report,
) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] round trips");
    let rt_prompt = format!(
        "round trip: session/prompt \"echo x\" (1 update), {} sequential — p50 / p99",
        opts.round_trips
    );
    let rt_ext = format!(
        "round trip: _scripted/echo (a request the agent answers, no journal), {} sequential — p50 / p99",
        opts.round_trips
    );
    let rt_new = format!(
        "round trip: session/new (the agent answers at once, one message; acpd records the session), {} sequential — p50 / p99",
        opts.round_trips
    );
    for (p, c, sid) in clients.iter_mut() {
        let mut times = Vec::with_capacity(opts.round_trips);
        for _ in 0..opts.round_trips {
            let t = Instant::now();
            let a = c.prompt(sid, "echo x")?;
            times.push(t.elapsed());
            ensure!(
                a.updates == 1,
                "{}: echo sent {} updates",
                p.label(),
                a.updates
            );
        }
        report.put(
            "rt-prompt",
            &rt_prompt,
            Unit::RoundTrip,
            p.label(),
            mode,
            percentiles(times),
        );
        let mut times = Vec::with_capacity(opts.round_trips);
        for _ in 0..opts.round_trips {
            let t = Instant::now();
            c.call("_scripted/echo", json!({ "n": 1 }))?;
            times.push(t.elapsed());
        }
        report.put(
            "rt-ext",
            &rt_ext,
            Unit::RoundTrip,
            p.label(),
            mode,
            percentiles(times),
        );
        let times = new_sessions(*p, c, opts.round_trips)?;
        report.put(
            "rt-new",
            &rt_new,
            Unit::RoundTrip,
            p.label(),
            mode,
            percentiles(times),
        );
    }
    Ok(())
}

/// Sessions opened between two rounds of `session/close` on the acpd paths, so acpd's live
/// set stays as small as an editor's (the closes are pipelined and not timed).
const NEW_BATCH: usize = 100;
/// Untimed `session/new`s before the timed ones.
const NEW_WARM: usize = 50;

/// `n` sequential `session/new` on one connection, timed one by one. The scripted agent
/// answers at once and alone (`quiet`: no `available_commands_update` before the answer,
/// which would make it two messages and stall websocat's second on Nagle, as the prompt
/// round trip does); acpd also writes the session's row and starts its actor before it
/// answers.
fn new_sessions(p: Route, c: &mut LineClient, n: usize) -> Result<Vec<Duration>> {
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
            if p.closes() {
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

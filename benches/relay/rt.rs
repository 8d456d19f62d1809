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
        let times = new_session::timed(c, opts.round_trips, p.closes())?;
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

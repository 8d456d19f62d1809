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
        if opts.wants_rt("prompt") {
            prompts(opts, c, sid, p.label(), mode, &rt_prompt, report)?;
        }
        if opts.wants_rt("echo") {
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
        }
        if opts.wants_rt("new") {
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
    }
    Ok(())
}

/// `session/prompt "echo x"` round trips, one at a time.
fn prompts(
    opts: &Opts,
    c: &mut LineClient,
    sid: &str,
    label: &str,
    mode: Mode,
    title: &str,
    report: &mut Report,
) -> Result<()> {
    let mut times = Vec::with_capacity(opts.round_trips);
    for _ in 0..opts.round_trips {
        let t = Instant::now();
        let a = c.prompt(sid, "echo x")?;
        times.push(t.elapsed());
        ensure!(a.updates == 1, "{label}: echo sent {} updates", a.updates);
    }
    report.put(
        "rt-prompt",
        title,
        Unit::RoundTrip,
        label,
        mode,
        percentiles(times),
    );
    Ok(())
}

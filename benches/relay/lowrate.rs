//! The low-rate latency section (`lowrate`, issue 45): one update every 10 ms for 10 s, the
//! way an LLM streams, timed from the agent's write to the editor's read (the scripted agent's
//! `tick N MS` stamps each chunk with the wall clock) on every path, one after another.

use super::*;

pub(super) fn latency(
    mode: Mode,
    opts: &Opts,
    clients: &mut Clients,
    report: &mut Report,
) -> Result<()> {
    let m = mode.label();
    eprintln!("[{m}] low-rate latency");
    let n = opts.lowrate_updates;
    let title = format!(
        "low-rate latency: one update every {LOWRATE_EVERY_MS} ms, {n} of them (an LLM's pace) — agent write → editor read, p50 / p99"
    );
    for (p, c, sid) in clients.iter_mut() {
        let id = c.send(
            "session/prompt",
            json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": format!("tick {n} {LOWRATE_EVERY_MS}") }] }),
        )?;
        let (a, lat) = c.wait_ticks(id)?;
        ensure!(a.updates == n, "{}: {} of {n} ticks", p.label(), a.updates);
        report.put(
            "lowrate",
            &title,
            Unit::RoundTrip,
            p.label(),
            mode,
            percentiles(lat),
        );
    }
    Ok(())
}

/// The pace of the low-rate row.
const LOWRATE_EVERY_MS: u64 = 10;

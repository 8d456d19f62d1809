//! The `fanout` section (issue 45's scale row): many sessions streaming at once through one
//! acpd (journal on, SQLite), spread over plain WebSocket connections held by this process.
//! Every update is checked to arrive exactly once and in order per session (the scripted
//! agent numbers each chunk in `_meta.scripted.n`; the bench fails otherwise), and each `tick`
//! chunk is timed from the agent's write to this client's read.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::conns::{self, Kind, Socket};
use crate::procs::{self, Bins, Mode, Server};
use crate::report::{Report, Unit};
use crate::{Opts, percentiles};

/// One plain RFD connection: a JSON-RPC message per text frame.
struct Conn {
    ws: Socket,
    next_id: u64,
}

/// What the readers saw: updates per session, the tick latencies, when the last answer came.
struct Seen {
    updates: u64,
    lat: Vec<Duration>,
}

impl Conn {
    async fn send(&mut self, method: &str, params: Value) -> Result<u64> {
        self.next_id += 1;
        let msg =
            json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params });
        self.ws.send(Message::Text(msg.to_string().into())).await?;
        Ok(self.next_id)
    }

    async fn next(&mut self) -> Result<Value> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t)?),
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.into()),
                None => bail!("acpd closed the connection"),
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.send(method, params).await?;
        loop {
            let mut msg = self.next().await?;
            if msg["id"] == id && msg.get("method").is_none() {
                if let Some(e) = msg.get("error") {
                    bail!("{method} failed: {e}");
                }
                return Ok(msg["result"].take());
            }
        }
    }

    /// Prompts every session with `script` at once and reads until all are answered, checking
    /// each session's chunks come numbered 1, 2, 3… and `per` of them.
    async fn stream(&mut self, sessions: &[String], script: &str, per: u64) -> Result<Seen> {
        let mut last: HashMap<String, u64> = sessions.iter().map(|s| (s.clone(), 0)).collect();
        let mut owed = Vec::with_capacity(sessions.len());
        for sid in sessions {
            let prompt =
                json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": script }] });
            owed.push(self.send("session/prompt", prompt).await?);
        }
        let mut seen = Seen {
            updates: 0,
            lat: Vec::new(),
        };
        while !owed.is_empty() {
            let msg = self.next().await?;
            let now = procs::unix_ns();
            if msg["method"] == "session/update" {
                let update = &msg["params"]["update"];
                if update["sessionUpdate"] != "agent_message_chunk" {
                    continue;
                }
                let sid = msg["params"]["sessionId"].as_str().unwrap_or("");
                let n = update["_meta"]["scripted"]["n"].as_u64();
                let Some(prev) = last.get_mut(sid) else {
                    bail!("an update for a session this connection never opened: {sid}");
                };
                // Lost, duplicated or reordered: the run is void.
                ensure!(
                    n == Some(*prev + 1),
                    "session {sid}: chunk {n:?} after chunk {prev} (lost, duplicated or out of order)"
                );
                *prev += 1;
                seen.updates += 1;
                if let Some((_, at)) = procs::tick_of(update) {
                    seen.lat
                        .push(Duration::from_nanos(now.saturating_sub(at) as u64));
                }
            } else if let Some(i) = msg["id"]
                .as_u64()
                .and_then(|id| owed.iter().position(|&o| o == id))
            {
                if let Some(e) = msg.get("error") {
                    bail!("a prompt failed: {e}");
                }
                ensure!(
                    msg["result"]["stopReason"] == "end_turn",
                    "a prompt ended {}",
                    msg["result"]
                );
                owed.swap_remove(i);
            }
        }
        for (sid, n) in &last {
            ensure!(*n == per, "session {sid}: {n} of {per} chunks");
        }
        Ok(seen)
    }
}

/// What one round measured.
struct Round {
    rate: f64,
    lat: Vec<Duration>,
    kib_per_session: f64,
    /// CPU seconds per wall second while streaming: this client (every connection, one
    /// thread), acpd, and the processes acpd started (the agent): which of them is the bound.
    cpu: [f64; 3],
}

/// User + system CPU seconds of `pid` (`self` for this process).
fn cpu_secs(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces: utime and stime are 14 and 15.
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |s| s.1)
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Every process below `pid` (acpd's agents and their supervisors).
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    for t in tasks.flatten() {
        let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
            out.push(k);
            out.extend(descendants(k));
        }
    }
    out
}

/// CPU seconds of this process, of acpd and of acpd's descendants.
fn cpu_now(acpd: u32) -> [f64; 3] {
    let kids: f64 = descendants(acpd)
        .iter()
        .map(|k| cpu_secs(&k.to_string()))
        .sum();
    [cpu_secs("self"), cpu_secs(&acpd.to_string()), kids]
}

/// `sessions` sessions over `conns` connections, each prompted with `script` (which yields
/// `per` chunks) at once; the aggregate rate from the first prompt sent to the last answer.
async fn round(
    port: u16,
    pid: u32,
    conns: usize,
    sessions: usize,
    script: &str,
    per: u64,
) -> Result<Round> {
    let opened: Vec<Result<(Socket, Duration)>> = futures_util::stream::iter(0..conns)
        .map(|_| conns::open(port, "/acp", Kind::Plain))
        .buffer_unordered(64)
        .collect()
        .await;
    let mut cs = Vec::with_capacity(conns);
    for o in opened {
        cs.push(Conn {
            ws: o?.0,
            next_id: 1,
        });
    }
    let base = procs::rss_kib(pid)?;
    // Sessions dealt round the connections, opened a connection at a time in parallel.
    let ids: Vec<Vec<String>> = futures_util::future::try_join_all(cs.iter_mut().enumerate().map(
        |(i, c)| async move {
            let mine = (i..sessions).step_by(conns).count();
            let mut ids = Vec::with_capacity(mine);
            for _ in 0..mine {
                let r = c
                    .call(
                        "session/new",
                        json!({ "cwd": procs::SESSION_CWD, "mcpServers": [], "_meta": { "scripted": { "quiet": true } } }),
                    )
                    .await?;
                ids.push(r["sessionId"].as_str().context("no sessionId")?.to_owned());
            }
            anyhow::Ok(ids)
        },
    ))
    .await?;
    // acpd holds a new session's first updates for 100 ms (its bootstrap hold).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let grown = procs::rss_kib(pid)?.saturating_sub(base);
    let cpu0 = cpu_now(pid);
    let t = Instant::now();
    let seen = futures_util::future::try_join_all(
        cs.iter_mut()
            .zip(&ids)
            .map(|(c, ids)| c.stream(ids, script, per)),
    )
    .await?;
    let dt = t.elapsed().as_secs_f64();
    let cpu1 = cpu_now(pid);
    let total: u64 = seen.iter().map(|s| s.updates).sum();
    ensure!(
        total == per * sessions as u64,
        "{total} of {} updates",
        per * sessions as u64
    );
    Ok(Round {
        rate: total as f64 / dt,
        lat: seen.into_iter().flat_map(|s| s.lat).collect(),
        kib_per_session: grown as f64 / sessions as f64,
        cpu: [0, 1, 2].map(|i| (cpu1[i] - cpu0[i]) / dt),
    })
}

/// The section: one session streaming flat out (`stream N 64`, the single-session rate), one
/// session of ticks, then `opts.fanout_sessions` sessions of ticks at once over
/// `opts.fanout_conns` connections; the bench process (one thread) is every client.
pub fn run(opts: &Opts, bins: &Bins, tmp: &Path, report: &mut Report) -> Result<()> {
    let (n, c, per) = (
        opts.fanout_sessions,
        opts.fanout_conns.min(opts.fanout_sessions),
        opts.fanout_updates,
    );
    eprintln!("[unpinned] fanout: {n} sessions streaming over {c} connections");
    let title = format!(
        "sessions streaming at once through acpd (SQLite, journal on; up to {n} sessions over {c} plain WebSocket connections, clients in one thread; `tick`: each chunk stamped when written, the next once it is) — updates/s; agent write → client read p50 / p99; acpd RSS per session opened; CPU while streaming (% of one CPU): this client, acpd, the agent"
    );
    let srv = Server::acpd(Mode::Unpinned, bins, &tmp.join("fanout"), None)?;
    let pid = srv.pid();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let single = (per * n as u64).min(100_000);
    let rows = [
        (
            format!("1 session, stream {single} 64"),
            1,
            1,
            format!("stream {single} 64"),
            single,
        ),
        (
            format!("1 session, tick {single} 0"),
            1,
            1,
            format!("tick {single} 0"),
            single,
        ),
        (
            format!("{n} sessions / {c} conns, tick {per} 0 each"),
            c,
            n,
            format!("tick {per} 0"),
            per,
        ),
    ];
    for (label, conns, sessions, script, per) in rows {
        let r = rt
            .block_on(round(srv.port, pid, conns, sessions, &script, per))
            .with_context(|| {
                let log = std::fs::read_to_string(tmp.join("fanout/acpd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!(
                    "{label}; acpd's log ends:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })?;
        let p = match r.lat.is_empty() {
            true => vec![f64::NAN, f64::NAN],
            false => percentiles(r.lat),
        };
        report.put(
            "fanout",
            &title,
            Unit::Fanout,
            &label,
            Mode::Unpinned,
            vec![
                r.rate,
                p[0] / 1e3,
                p[1] / 1e3,
                r.kib_per_session,
                sessions as f64,
                r.cpu[0] * 100.0,
                r.cpu[1] * 100.0,
                r.cpu[2] * 100.0,
            ],
        );
    }
    Ok(())
}

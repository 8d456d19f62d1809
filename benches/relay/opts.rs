//! The benchmark's command line: how many of each measurement, and which sections run.

use anyhow::{Context, Result, bail};

use crate::procs::Mode;

#[derive(Debug, Clone)]
pub struct Opts {
    pub round_trips: usize,
    pub updates: u64,
    pub runs: usize,
    pub starts: usize,
    pub loads: usize,
    pub conns: Vec<usize>,
    /// Live sessions the `sessions` section opens and holds.
    pub sessions: usize,
    pub store_appends: i64,
    /// `lowrate`: ticks, one every 10 ms.
    pub lowrate_updates: u64,
    /// `fanout`: sessions streaming at once, over how many connections, updates each.
    pub fanout_sessions: usize,
    pub fanout_conns: usize,
    pub fanout_updates: u64,
    /// Sections to run (`--only`); all when empty.
    pub only: Vec<String>,
    /// Round trips the `rt` section times (`--rt`); all when empty.
    pub rt: Vec<String>,
    /// `--pinned`: the pinned half only (ratios within one run, as issue 45 compares them).
    pub pinned_only: bool,
}

/// The sections `--only` can pick.
const SECTIONS: [&str; 10] = [
    "rt", "stream", "load", "start", "store", "conns", "sessions", "replicas", "lowrate", "fanout",
];

/// The round trips `--rt` can pick: `session/prompt`, `_scripted/echo`, `session/new`.
const ROUND_TRIPS: [&str; 3] = ["prompt", "echo", "new"];

impl Opts {
    pub fn parse() -> Result<Opts> {
        let mut o = Opts {
            round_trips: 2000,
            updates: 100_000,
            runs: 3,
            starts: 20,
            loads: 5,
            conns: vec![1000, 10_000],
            sessions: 5000,
            store_appends: 100_000,
            lowrate_updates: 1000,
            fanout_sessions: 1000,
            fanout_conns: 100,
            fanout_updates: 300,
            only: Vec::new(),
            rt: Vec::new(),
            pinned_only: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let mut num = |what: &str| -> Result<u64> {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("{what} needs a number"))
            };
            match a.as_str() {
                // `cargo bench` passes this to every bench target.
                "--bench" => {}
                "--quick" => {
                    o = Opts {
                        round_trips: 300,
                        updates: 20_000,
                        runs: 1,
                        starts: 5,
                        loads: 2,
                        conns: vec![1000],
                        sessions: 1000,
                        store_appends: 20_000,
                        lowrate_updates: 200,
                        fanout_sessions: o.fanout_sessions,
                        fanout_conns: o.fanout_conns,
                        fanout_updates: 100,
                        only: std::mem::take(&mut o.only),
                        rt: std::mem::take(&mut o.rt),
                        pinned_only: o.pinned_only,
                    }
                }
                "--pinned" => o.pinned_only = true,
                "--round-trips" => o.round_trips = num(&a)?.max(1) as usize,
                "--updates" => o.updates = num(&a)?.max(1),
                "--runs" => o.runs = num(&a)?.max(1) as usize,
                "--starts" => o.starts = num(&a)?.max(1) as usize,
                "--loads" => o.loads = num(&a)?.max(1) as usize,
                "--sessions" => o.sessions = num(&a)?.max(1) as usize,
                "--lowrate-updates" => o.lowrate_updates = num(&a)?.max(1),
                "--fanout-sessions" => o.fanout_sessions = num(&a)?.max(1) as usize,
                "--fanout-conns" => o.fanout_conns = num(&a)?.max(1) as usize,
                "--fanout-updates" => o.fanout_updates = num(&a)?.max(1),
                "--only" => o.only = picks(args.next(), &a, "section", &SECTIONS)?,
                // The websocat pair's `session/prompt` takes ~44 ms (Nagle holds its second
                // message), so `--rt echo,new` is the quick way to time the other two.
                "--rt" => o.rt = picks(args.next(), &a, "round trip", &ROUND_TRIPS)?,
                "--conns" => {
                    let v = args.next().context("--conns needs N[,N...]")?;
                    o.conns = v
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| s.parse().context("--conns needs numbers"))
                        .collect::<Result<_>>()?;
                }
                _ => bail!(
                    "usage: relay [--quick] [--pinned] [--only SECTION,...] [--round-trips N] [--updates N] \
                     [--runs N] [--starts N] [--loads N] [--conns N,N] [--sessions N] \
                     [--rt ROUND_TRIP,...] [--lowrate-updates N] [--fanout-sessions N] \
                     [--fanout-conns N] [--fanout-updates N]\n\
                     sections: {}\nround trips: {}",
                    SECTIONS.join(","),
                    ROUND_TRIPS.join(",")
                ),
            }
        }
        Ok(o)
    }

    /// The modes to run, pinned first.
    pub fn modes(&self) -> &'static [Mode] {
        match self.pinned_only {
            true => &[Mode::Pinned],
            false => &[Mode::Pinned, Mode::Unpinned],
        }
    }

    pub fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }

    /// Whether the `rt` section times this round trip.
    pub fn wants_rt(&self, round_trip: &str) -> bool {
        self.rt.is_empty() || self.rt.iter().any(|s| s == round_trip)
    }
}

/// The comma-separated list after `flag`, each one of `known`.
fn picks(arg: Option<String>, flag: &str, what: &str, known: &[&str]) -> Result<Vec<String>> {
    let v = arg.with_context(|| format!("{flag} needs a {what}, or several with commas"))?;
    let list: Vec<String> = v.split(',').map(str::to_owned).collect();
    if let Some(bad) = list.iter().find(|s| !known.contains(&s.as_str())) {
        bail!("unknown {what} {bad}; {what}s: {}", known.join(","));
    }
    Ok(list)
}

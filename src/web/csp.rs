//! `POST /web/csp` takes reports from anyone (browsers send them without credentials), so
//! it must not be a way to fill the log or spin the CPU: `CspReports` (pure, unit-tested) is
//! a token bucket over all reports (over it: `429`, the body unread) and a log summary — the
//! first report is logged, then one line per `LOG_EVERY` with how many came since.

use std::time::{Duration, Instant};

/// Reports per second accepted, sustained; bursts up to `BURST`.
const PER_SECOND: f64 = 5.0;
const BURST: f64 = 20.0;
/// At most one log line per this.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Count it; log a line saying `count` reports came since the last line.
    Log { count: u64 },
    /// Count it, no line.
    Quiet,
    /// Over the rate: `429`, not read, not counted.
    Refuse,
}

#[derive(Debug)]
pub struct CspReports {
    tokens: f64,
    refilled: Option<Instant>,
    logged: Option<Instant>,
    unlogged: u64,
}

impl Default for CspReports {
    fn default() -> Self {
        CspReports {
            tokens: BURST,
            refilled: None,
            logged: None,
            unlogged: 0,
        }
    }
}

impl CspReports {
    pub fn report(&mut self, now: Instant) -> Verdict {
        if let Some(last) = self.refilled {
            let earned = now.saturating_duration_since(last).as_secs_f64() * PER_SECOND;
            self.tokens = (self.tokens + earned).min(BURST);
        }
        self.refilled = Some(now);
        if self.tokens < 1.0 {
            return Verdict::Refuse;
        }
        self.tokens -= 1.0;
        self.unlogged += 1;
        let due = self
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= LOG_EVERY);
        if !due {
            return Verdict::Quiet;
        }
        self.logged = Some(now);
        Verdict::Log {
            count: std::mem::take(&mut self.unlogged),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_refused_and_logged_once_a_minute() {
        let mut r = CspReports::default();
        let t0 = Instant::now();
        assert_eq!(r.report(t0), Verdict::Log { count: 1 });
        let mut refused = 0;
        for _ in 0..100 {
            match r.report(t0) {
                Verdict::Quiet => {}
                Verdict::Refuse => refused += 1,
                Verdict::Log { .. } => panic!("a second line within the minute"),
            }
        }
        assert_eq!(refused, 100 - (BURST as usize - 1));
        // A second later, five more are taken; a minute on, one line with the count.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(r.report(t1), Verdict::Quiet);
        }
        assert_eq!(r.report(t1), Verdict::Refuse);
        let t2 = t0 + LOG_EVERY;
        assert_eq!(r.report(t2), Verdict::Log { count: 19 + 5 + 1 });
    }
}

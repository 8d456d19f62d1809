//! Crash-loop backoff for one (principal, profile): a pure state machine, no clock of its own
//! and no I/O; `AgentPool` feeds it what happened and asks it before each start.
//!
//! A failure is a start that failed (spawn, `initialize`) or a process that exited before it
//! had run `healthy` long. The first failure may restart at once (an agent that crashes once
//! mid-turn is back on the next prompt); after the second, starts wait `base`, doubling per
//! further failure up to `cap`. A process that runs `healthy` long wipes the slate: its exit
//! counts as a first failure again.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub base: Duration,
    pub cap: Duration,
    pub healthy: Duration,
}

impl Default for Policy {
    /// Starts of an agent that always fails, from the first: 0 s, 0 s, 2 s, 6 s, 14 s, 30 s,
    /// 62 s, then one a minute.
    fn default() -> Policy {
        Policy {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
            healthy: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Start,
    /// Not before `until`; `failures` in a row so far.
    Wait {
        until: Instant,
        failures: u32,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Backoff {
    /// Failures in a row.
    failures: u32,
    /// No start before this.
    not_before: Option<Instant>,
    /// When the running process started, if one runs.
    running_since: Option<Instant>,
}

impl Backoff {
    pub fn decide(&self, now: Instant) -> Decision {
        match self.not_before {
            Some(until) if now < until && self.running_since.is_none() => Decision::Wait {
                until,
                failures: self.failures,
            },
            _ => Decision::Start,
        }
    }

    /// The process started and answered `initialize`.
    pub fn started(&mut self, now: Instant) {
        self.running_since = Some(now);
    }

    /// The start failed; returns when the next one may be.
    pub fn start_failed(&mut self, policy: &Policy, now: Instant) -> Instant {
        self.running_since = None;
        self.fail(policy, now)
    }

    /// The running process was stopped on purpose (idle): not a failure.
    pub fn stopped(&mut self) {
        self.running_since = None;
    }

    /// The running process exited; returns when the next start may be.
    pub fn exited(&mut self, policy: &Policy, now: Instant) -> Instant {
        if let Some(since) = self.running_since.take()
            && now.saturating_duration_since(since) >= policy.healthy
        {
            self.failures = 0;
        }
        self.fail(policy, now)
    }

    #[cfg(test)]
    pub fn failures(&self) -> u32 {
        self.failures
    }

    fn fail(&mut self, policy: &Policy, now: Instant) -> Instant {
        self.failures = self.failures.saturating_add(1);
        let until = now + delay(policy, self.failures);
        self.not_before = Some(until);
        until
    }
}

/// How long to wait after `failures` failures in a row.
pub fn delay(policy: &Policy, failures: u32) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => {
            let doublings = (n - 2).min(31);
            policy
                .base
                .checked_mul(1u32 << doublings)
                .map_or(policy.cap, |d| d.min(policy.cap))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn delays_double_from_the_second_failure_up_to_the_cap() {
        let p = Policy::default();
        let d: Vec<u64> = (0..10).map(|n| delay(&p, n).as_secs()).collect();
        assert_eq!(d, [0, 0, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(delay(&p, u32::MAX), p.cap);
    }

    #[test]
    fn an_agent_that_never_starts_is_started_a_handful_of_times_a_minute() {
        let p = Policy::default();
        let t0 = Instant::now();
        let mut b = Backoff::default();
        let mut starts = vec![];
        // A client retrying every 100 ms for ten minutes.
        for tick in 0..6000u64 {
            let now = t0 + Duration::from_millis(tick * 100);
            if b.decide(now) == Decision::Start {
                starts.push(tick / 10);
                b.start_failed(&p, now);
            }
        }
        assert_eq!(&starts[..7], [0, 0, 2, 6, 14, 30, 62]);
        let first_minute = starts.iter().filter(|s| **s < 60).count();
        assert_eq!(first_minute, 6);
        // Then one a minute.
        assert!(starts.len() <= 6 + 10, "{starts:?}");
    }

    #[test]
    fn while_waiting_the_decision_says_until_when_and_how_many_failures() {
        let p = Policy::default();
        let t0 = Instant::now();
        let mut b = Backoff::default();
        b.start_failed(&p, t0);
        assert_eq!(b.decide(t0), Decision::Start);
        let until = b.start_failed(&p, t0);
        assert_eq!(until, t0 + secs(2));
        assert_eq!(
            b.decide(t0 + secs(1)),
            Decision::Wait { until, failures: 2 }
        );
        assert_eq!(b.decide(t0 + secs(2)), Decision::Start);
    }

    #[test]
    fn one_crash_restarts_at_once_a_crash_loop_backs_off() {
        let p = Policy::default();
        let t0 = Instant::now();
        let mut b = Backoff::default();
        b.started(t0);
        b.exited(&p, t0 + secs(1));
        assert_eq!(b.decide(t0 + secs(1)), Decision::Start);
        b.started(t0 + secs(1));
        let until = b.exited(&p, t0 + secs(2));
        assert_eq!(until, t0 + secs(4));
        assert!(matches!(b.decide(t0 + secs(3)), Decision::Wait { .. }));
    }

    #[test]
    fn a_healthy_run_resets_the_count() {
        let p = Policy::default();
        let t0 = Instant::now();
        let mut b = Backoff::default();
        for _ in 0..5 {
            b.start_failed(&p, t0);
        }
        assert_eq!(b.failures(), 5);
        let t1 = t0 + secs(100);
        b.started(t1);
        // Running: never a reason to wait.
        assert_eq!(b.decide(t1), Decision::Start);
        b.exited(&p, t1 + p.healthy);
        assert_eq!(b.failures(), 1);
        assert_eq!(b.decide(t1 + p.healthy), Decision::Start);
    }

    #[test]
    fn an_exit_before_the_healthy_period_keeps_counting() {
        let p = Policy::default();
        let t0 = Instant::now();
        let mut b = Backoff::default();
        b.start_failed(&p, t0);
        b.start_failed(&p, t0);
        b.started(t0 + secs(10));
        b.exited(&p, t0 + secs(20));
        assert_eq!(b.failures(), 3);
        assert_eq!(
            b.decide(t0 + secs(21)),
            Decision::Wait {
                until: t0 + secs(24),
                failures: 3
            }
        );
    }
}

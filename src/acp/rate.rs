//! The per-connection rate limit: a token bucket every request and notification draws from.
//! Pure (the clock is passed in), unit-tested below.

use std::time::Instant;

/// A token bucket: `rate` requests per second sustained, bursts of twice that.
pub(super) struct RateLimit {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimit {
    pub fn new(rate: u32) -> RateLimit {
        RateLimit {
            rate: f64::from(rate),
            tokens: 2.0 * f64::from(rate),
            last: Instant::now(),
        }
    }

    pub fn admit(&mut self) -> bool {
        self.admit_at(Instant::now())
    }

    fn admit_at(&mut self, now: Instant) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(2.0 * self.rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bursts_of_twice_the_rate_then_the_rate() {
        let mut r = RateLimit::new(10);
        let t0 = r.last;
        assert_eq!((0..25).filter(|_| r.admit_at(t0)).count(), 20);
        assert!(!r.admit_at(t0));
        // 0.5 s later: five more.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!((0..10).filter(|_| r.admit_at(t1)).count(), 5);
    }

    #[test]
    fn zero_means_no_limit() {
        let mut r = RateLimit::new(0);
        let t0 = r.last;
        assert!((0..100_000).all(|_| r.admit_at(t0)));
    }
}

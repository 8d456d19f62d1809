//! The reconnect schedule (`backon`): the first wait in [50, 100) ms, each next one doubling,
//! capped at [2.5, 5) s, never giving up (the shim lives as long as its editor).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A fresh schedule; the relay starts one after every successful connect.
pub fn reconnect_backoff() -> ExponentialBackoff {
    // backon's jitter adds [0, d) to d: waits fall in [d, 2d), as before ([b/2, b), b from
    // 100 ms doubling to 5 s).
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(2500))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_50_ms_to_a_5_s_cap_and_never_end() {
        let waits: Vec<Duration> = reconnect_backoff().take(200).collect();
        assert_eq!(waits.len(), 200);
        let ms = |n: u64| Duration::from_millis(n);
        let floors = [50, 100, 200, 400, 800, 1600, 2500, 2500];
        for (w, floor) in waits.iter().zip(floors) {
            assert!(
                *w >= ms(floor) && *w < ms(floor * 2),
                "{w:?} not in [{floor}, {}) ms",
                floor * 2
            );
        }
        assert!(waits.iter().all(|w| *w < ms(5000)), "{waits:?}");
    }
}

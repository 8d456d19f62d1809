//! The routes whose backlog is over `PAUSE_AT`, as the router's metrics count them.

use std::collections::HashSet;

/// The routes over `PAUSE_AT`, counted in `acpd_sessions_behind_agent` while they are (and
/// no longer once the router ends).
#[derive(Default)]
pub(super) struct Over(HashSet<String>);

impl Over {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &String> {
        self.0.iter()
    }

    /// `true` when `route` was not over already: the agent's output pauses for it.
    pub(super) fn insert(&mut self, route: &str) -> bool {
        if self.0.contains(route) {
            return false;
        }
        self.0.insert(route.to_owned());
        metrics::gauge!(crate::metrics::SESSIONS_BEHIND_AGENT).increment(1);
        metrics::counter!(crate::metrics::AGENT_OUTPUT_PAUSES_TOTAL).increment(1);
        true
    }

    pub(super) fn remove(&mut self, route: &str) {
        if self.0.remove(route) {
            metrics::gauge!(crate::metrics::SESSIONS_BEHIND_AGENT).decrement(1);
        }
    }
}

impl Drop for Over {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::SESSIONS_BEHIND_AGENT).decrement(self.0.len() as f64);
    }
}

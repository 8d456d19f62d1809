//! The daemon's tallies of spending per principal, profile and day (this month's), and the
//! thresholds already announced. Loaded from the store's rollups at start (so budgets
//! survive a restart) and added to by the session actors as their turns spend.
//!
//! `Tallies` is the state, plain and synchronous; `Ledger` shares it between the session
//! actors behind a mutex. Why a lock and not an actor: every session actor reads it on each
//! report and prompt, and a session actor never waits on another task (ARCHITECTURE's
//! invariant), so a round trip to a ledger task would be an await in its hot path; the lock
//! is held for a few map operations of a table of this month's days (`with`, a synchronous
//! closure: never across an await), and owns nothing that waits, like `Shared::turns`.
//!
//! A session whose budgets count more than its own spending (a principal's or a profile's
//! day or month) learns that another session spent through `watch`: a counter bumped after
//! every `add`, outside the lock, that its actor awaits in a helper task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::{Meter, Spend, Spent, Status, Window, day_of, month_start, period, threshold};

/// Spending per `(principal id, profile, day)` and the announced thresholds.
#[derive(Debug, Default)]
pub struct Tallies {
    spent: HashMap<(String, String, String), Spent>,
    /// The latest day added to: a new one prunes what is past.
    today: String,
    /// `(meter name, principal id, period)` → the highest threshold announced.
    announced: HashMap<(String, String, String), u8>,
}

impl Tallies {
    pub fn add(&mut self, principal: &str, profile: &str, day: &str, spent: Spent) {
        if *day > *self.today {
            self.today = day.to_owned();
            if let Ok(d) = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d") {
                let now =
                    chrono::TimeZone::from_utc_datetime(&Utc, &d.and_time(Default::default()));
                self.prune(now);
            }
        }
        let key = (principal.to_owned(), profile.to_owned(), day.to_owned());
        self.spent.entry(key).or_default().add(spent);
    }

    /// What `principal` spent today and this month, in all and through `profile`, with the
    /// session's own spending.
    pub fn spend(
        &self,
        principal: &str,
        profile: &str,
        session: Spent,
        now: DateTime<Utc>,
    ) -> Spend {
        let (today, month) = (day_of(now), month_start(now));
        let mut s = Spend {
            session,
            ..Spend::default()
        };
        for ((p, prof, day), spent) in &self.spent {
            if p != principal || *day < month {
                continue;
            }
            s.principal_month.add(*spent);
            if *day == today {
                s.principal_day.add(*spent);
            }
            if prof == profile {
                s.profile_month.add(*spent);
                if *day == today {
                    s.profile_day.add(*spent);
                }
            }
        }
        s
    }

    /// The principals (ids) that spent this month, through `profile` if given.
    pub fn spenders(&self, profile: Option<&str>) -> std::collections::BTreeSet<String> {
        self.spent
            .keys()
            .filter(|(_, prof, _)| profile.is_none_or(|p| p == prof))
            .map(|(p, _, _)| p.clone())
            .collect()
    }

    /// The thresholds the readings reach that were not announced in their period yet, now
    /// marked announced: each `(status, threshold)` once per meter, principal and period.
    pub fn crossings(
        &mut self,
        principal: &str,
        session: &str,
        statuses: Vec<Status>,
        now: DateTime<Utc>,
    ) -> Vec<(Status, u8)> {
        let mut out = Vec::new();
        for s in statuses {
            let key = (
                s.meter.name.clone(),
                principal.to_owned(),
                period(s.meter.limit.window, session, now),
            );
            let announced = self.announced.get(&key).copied().unwrap_or(0);
            if let Some(t) = threshold(announced, s.percent) {
                self.announced.insert(key, t);
                out.push((s, t));
            }
        }
        out
    }

    /// Forgets the days before this month and the thresholds of past days and months.
    pub fn prune(&mut self, now: DateTime<Utc>) {
        let month = month_start(now);
        self.spent.retain(|(_, _, day), _| *day >= month);
        let (today, this_month) = (period(Window::Day, "", now), period(Window::Month, "", now));
        self.announced.retain(|(_, _, p), _| {
            // A session's period is its id; a day's and a month's are dates.
            !p.starts_with(|c: char| c.is_ascii_digit()) || *p == today || *p == this_month
        });
    }
}

/// `Tallies` shared by the session actors. Cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    inner: Arc<Mutex<Tallies>>,
    /// Bumped after every `add` (`watch`).
    moved: Arc<watch::Sender<u64>>,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            inner: Arc::default(),
            moved: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl Ledger {
    /// The one place the lock is taken: `f` is synchronous, so it is never held across an
    /// await; a poisoned lock (a panic mid-update) still holds usable counters.
    fn with<T>(&self, f: impl FnOnce(&mut Tallies) -> T) -> T {
        let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut t)
    }

    pub fn add(&self, principal: &str, profile: &str, day: &str, spent: Spent) {
        if spent == Spent::default() {
            return;
        }
        self.with(|t| t.add(principal, profile, day, spent));
        self.moved.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes each time spending is added, by any session: `changed()` wakes its holder.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.moved.subscribe()
    }

    pub fn spend(
        &self,
        principal: &str,
        profile: &str,
        session: Spent,
        now: DateTime<Utc>,
    ) -> Spend {
        self.with(|t| t.spend(principal, profile, session, now))
    }

    /// The readings of `meters` and the thresholds they newly reach.
    pub fn check(
        &self,
        principal: &str,
        profile: &str,
        session: (&str, Spent),
        meters: &[Meter],
        now: DateTime<Utc>,
    ) -> (Vec<Status>, Vec<(Status, u8)>) {
        self.with(|t| {
            let spend = t.spend(principal, profile, session.1, now);
            let statuses = super::statuses(meters, &spend);
            let crossed = t.crossings(principal, session.0, statuses.clone(), now);
            (statuses, crossed)
        })
    }
}

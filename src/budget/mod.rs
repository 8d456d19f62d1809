//! Budgets: what a principal (through every profile, or through one) may spend per session,
//! per day and per month, in tokens or in cost, and what happens when it does.
//!
//! Pure: `Budgets` (the validated configuration), `Meter` (one limit applied to one session),
//! `Spend` (what the session, its principal and its profile spent in each window), and the
//! decisions `statuses`, `gate` and `threshold`. The `Ledger` (`ledger.rs`) keeps the daemon's
//! tallies; the session actor feeds both and acts (`session/actor/usage.rs`).

pub mod ledger;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde_json::{Value, json};

pub use ledger::Ledger;

/// The thresholds (percent of a limit) announced once each.
pub const THRESHOLDS: [u8; 3] = [50, 80, 100];

/// Over what a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Window {
    /// The session's whole life.
    Session,
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::Session => "session",
            Window::Day => "day",
            Window::Month => "month",
        }
    }
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Input + output + thought tokens (cached reads are counted apart and not here).
    Tokens,
    /// Cost in the budgets' currency, in millionths.
    Cost,
}

/// What reaching a limit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A notice and an audit line at each threshold.
    Warn,
    /// As `Warn`, and at 100 % the running turn is cancelled and new prompts are refused.
    Stop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    pub window: Window,
    pub unit: Unit,
    /// Tokens, or millionths of the currency.
    pub amount: u64,
    pub action: Action,
}

/// Whose spending a set of limits counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A principal's, through every profile (`principals.NAME`, or `default`).
    Principal(String),
    /// A principal's through one profile (`profiles.NAME`).
    Profile(String),
}

/// The `[budgets]` configuration, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    /// The currency of every `cost` limit; spend reported in another is not counted.
    pub currency: String,
    /// The limits of a principal without its own.
    pub default: Vec<Limit>,
    pub principals: BTreeMap<String, Vec<Limit>>,
    pub profiles: BTreeMap<String, Vec<Limit>>,
}

/// One limit as it applies to one session.
#[derive(Debug, Clone, PartialEq)]
pub struct Meter {
    pub scope: Scope,
    pub limit: Limit,
    /// Where it is configured: `principals.alice.day.tokens`, `default.session.cost`.
    pub name: String,
}

impl Budgets {
    pub fn is_empty(&self) -> bool {
        self.default.is_empty() && self.principals.is_empty() && self.profiles.is_empty()
    }

    /// The limits that apply to a session of `principal` (by name) on `profile`.
    pub fn meters(&self, principal: &str, profile: &str) -> Vec<Meter> {
        let mut out = self.principal_meters(principal);
        out.extend(self.profile_meters(profile));
        out
    }

    /// What `principal` (by name) may spend through every profile: its own table, else the
    /// default.
    pub fn principal_meters(&self, principal: &str) -> Vec<Meter> {
        let (own, name) = match self.principals.get(principal) {
            Some(l) => (l, format!("principals.{principal}")),
            None => (&self.default, "default".to_owned()),
        };
        own.iter()
            .map(|l| meter(Scope::Principal(principal.to_owned()), l, &name))
            .collect()
    }

    /// What each principal may spend through `profile`.
    pub fn profile_meters(&self, profile: &str) -> Vec<Meter> {
        let name = format!("profiles.{profile}");
        self.profiles.get(profile).map_or_else(Vec::new, |l| {
            l.iter()
                .map(|l| meter(Scope::Profile(profile.to_owned()), l, &name))
                .collect()
        })
    }
}

fn meter(scope: Scope, limit: &Limit, at: &str) -> Meter {
    let unit = match limit.unit {
        Unit::Tokens => "tokens",
        Unit::Cost => "cost",
    };
    Meter {
        scope,
        limit: limit.clone(),
        name: format!("{at}.{}.{unit}", limit.window.name()),
    }
}

/// Tokens and cost spent in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    pub tokens: u64,
    /// Millionths of the budgets' currency.
    pub cost_micros: u64,
}

impl Spent {
    pub fn add(&mut self, other: Spent) {
        self.tokens = self.tokens.saturating_add(other.tokens);
        self.cost_micros = self.cost_micros.saturating_add(other.cost_micros);
    }

    fn of(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Tokens => self.tokens,
            Unit::Cost => self.cost_micros,
        }
    }
}

/// What a rollup row counts against budgets in `currency` (the session actor's ledger and the
/// console's budget readings count alike).
pub fn spent_of(r: &acpd_store::UsageRollup, currency: &str) -> Spent {
    let tokens = [r.input_tokens, r.output_tokens, r.thought_tokens];
    Spent {
        tokens: tokens.iter().flatten().map(|t| *t as u64).sum(),
        cost_micros: match r.currency.as_deref() {
            Some(c) if c == currency => r.cost_micros.unwrap_or(0) as u64,
            _ => 0,
        },
    }
}

/// What a session, its principal and its principal's profile spent, per window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spend {
    pub session: Spent,
    pub principal_day: Spent,
    pub principal_month: Spent,
    pub profile_day: Spent,
    pub profile_month: Spent,
}

impl Spend {
    fn of(&self, m: &Meter) -> Spent {
        match (&m.scope, m.limit.window) {
            (_, Window::Session) => self.session,
            (Scope::Principal(_), Window::Day) => self.principal_day,
            (Scope::Principal(_), Window::Month) => self.principal_month,
            (Scope::Profile(_), Window::Day) => self.profile_day,
            (Scope::Profile(_), Window::Month) => self.profile_month,
        }
    }
}

/// One meter's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub meter: Meter,
    pub spent: u64,
    /// `spent` in percent of the limit (floor; may pass 100).
    pub percent: u64,
}

impl Status {
    pub fn exhausted(&self) -> bool {
        self.spent >= self.meter.limit.amount
    }

    /// What the budget allows and has used, for clients (`quota_update`'s meter, the
    /// console, the refusal's `data`).
    pub fn describe(&self, currency: &str, now: DateTime<Utc>) -> Value {
        let l = &self.meter.limit;
        let (unit, limit, used) = match l.unit {
            Unit::Tokens => ("tokens", json!(l.amount), json!(self.spent)),
            Unit::Cost => (
                currency,
                json!(l.amount as f64 / 1e6),
                json!(self.spent as f64 / 1e6),
            ),
        };
        let status = self.state();
        json!({
            "id": self.meter.name,
            "window": l.window.name(),
            "unit": unit,
            "limit": limit,
            "used": used,
            "usedPercent": self.percent,
            "action": match l.action { Action::Warn => "warn", Action::Stop => "stop" },
            "status": status,
            "resetsAt": resets_at(l.window, now).map(|t| t.to_rfc3339()),
        })
    }
}

impl Status {
    /// The quotas RFD's `status`: `exceeded` (a `stop` budget used up: prompts are refused),
    /// `warning` (80 % or more, or a `warn` budget past its limit), else `ok`.
    pub fn state(&self) -> &'static str {
        match (self.exhausted(), self.percent >= 80) {
            (true, _) if self.meter.limit.action == Action::Stop => "exceeded",
            (true, _) | (_, true) => "warning",
            _ => "ok",
        }
    }

    /// The reading as the quotas RFD's meter (`quota_update`, `quota/read`): amounts are
    /// `{value, unit}` with the value a decimal string, `window` an ISO 8601 duration (none
    /// for a session's budget, which never resets).
    pub fn quota_meter(&self, currency: &str, now: DateTime<Utc>) -> Value {
        let l = &self.meter.limit;
        let amount = |n: u64| match l.unit {
            Unit::Tokens => json!({ "value": n.to_string(), "unit": "tokens" }),
            Unit::Cost => json!({ "value": decimal_micros(n), "unit": currency }),
        };
        let mut m = json!({
            "id": self.meter.name,
            "label": format!("{} ({})", self.meter.name, describe_limit(l, currency)),
            "usedPercent": self.percent,
            "used": amount(self.spent),
            "limit": amount(l.amount),
            "remaining": amount(l.amount.saturating_sub(self.spent)),
            "status": self.state(),
        });
        if let Some(w) = iso_window(l.window) {
            m["window"] = json!(w);
        }
        if let Some(t) = resets_at(l.window, now) {
            m["resetsAt"] = json!(t.to_rfc3339());
        }
        m
    }
}

/// The quotas RFD's `pools`: acpd's budgets of a session as one pool (none without budgets),
/// `exhausted` while a `stop` budget is used up.
pub fn quota_pools(statuses: &[Status], currency: &str, now: DateTime<Utc>) -> Value {
    if statuses.is_empty() {
        return json!([]);
    }
    let state = if gate(statuses).is_some() {
        "exhausted"
    } else {
        "available"
    };
    let meters: Vec<Value> = statuses
        .iter()
        .map(|s| s.quota_meter(currency, now))
        .collect();
    json!([{ "id": "acpd", "label": "acpd budgets", "state": state, "meters": meters }])
}

/// A window as an ISO 8601 duration (the RFD's `window`).
fn iso_window(w: Window) -> Option<&'static str> {
    match w {
        Window::Session => None,
        Window::Day => Some("P1D"),
        Window::Month => Some("P1M"),
    }
}

/// Millionths as a decimal string without trailing zeros: `2500000` is `"2.5"`.
pub fn decimal_micros(n: u64) -> String {
    let (whole, frac) = (n / 1_000_000, n % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:06}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// Whether any meter counts more than its session's spending (a day's or a month's): such a
/// session's budgets move when another session of its principal spends.
pub fn counts_others(meters: &[Meter]) -> bool {
    meters.iter().any(|m| m.limit.window != Window::Session)
}

/// Every meter's reading.
pub fn statuses(meters: &[Meter], spend: &Spend) -> Vec<Status> {
    meters
        .iter()
        .map(|m| {
            let spent = spend.of(m).of(m.limit.unit);
            let percent = if m.limit.amount == 0 {
                100
            } else {
                ((spent as u128 * 100) / m.limit.amount as u128) as u64
            };
            Status {
                meter: m.clone(),
                spent,
                percent,
            }
        })
        .collect()
}

/// The first `stop` budget that is used up: a prompt is refused, a running turn cancelled.
pub fn gate(statuses: &[Status]) -> Option<&Status> {
    statuses
        .iter()
        .find(|s| s.meter.limit.action == Action::Stop && s.exhausted())
}

/// The highest threshold `percent` reaches that is above the one announced already
/// (`announced`: 0 for none): announced now, once.
pub fn threshold(announced: u8, percent: u64) -> Option<u8> {
    THRESHOLDS
        .iter()
        .rev()
        .find(|t| percent >= u64::from(**t))
        .copied()
        .filter(|t| *t > announced)
}

/// The UTC date of `now`, `YYYY-MM-DD`: the day a turn is counted on.
pub fn day_of(now: DateTime<Utc>) -> String {
    now.format("%Y-%m-%d").to_string()
}

/// The first day of `now`'s month, `YYYY-MM-01`.
pub fn month_start(now: DateTime<Utc>) -> String {
    now.format("%Y-%m-01").to_string()
}

/// The period a threshold is announced once in: the session, the day, the month.
pub fn period(window: Window, session: &str, now: DateTime<Utc>) -> String {
    match window {
        Window::Session => session.to_owned(),
        Window::Day => day_of(now),
        Window::Month => now.format("%Y-%m").to_string(),
    }
}

/// When a window starts again (`None`: a session's never does).
pub fn resets_at(window: Window, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let today = now.date_naive();
    let next = match window {
        Window::Session => return None,
        Window::Day => today.succ_opt()?,
        Window::Month => {
            let (y, m) = if today.month() == 12 {
                (today.year() + 1, 1)
            } else {
                (today.year(), today.month() + 1)
            };
            NaiveDate::from_ymd_opt(y, m, 1)?
        }
    };
    Some(Utc.from_utc_datetime(&next.and_hms_opt(0, 0, 0)?))
}

/// A limit in the config's words: `5000000 tokens per day`, `20 USD per month`.
pub fn describe_limit(l: &Limit, currency: &str) -> String {
    let per = match l.window {
        Window::Session => "per session".to_owned(),
        w => format!("per {}", w.name()),
    };
    match l.unit {
        Unit::Tokens => format!("{} tokens {per}", l.amount),
        Unit::Cost => format!("{} {currency} {per}", l.amount as f64 / 1e6),
    }
}

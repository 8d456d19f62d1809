//! `acpd budget`: every budget the configuration sets, with what it has used this period
//! from the store's rollups, in percent, and when it resets. Budgets are set in the config
//! file (`[budgets]`); this command only reads them, and opens the store beside a running
//! daemon like `acpd usage` (it never checks the `serve` listener).

use std::collections::BTreeMap;
use std::process::ExitCode;

use chrono::{DateTime, Utc};

use crate::budget::ledger::Tallies;
use crate::budget::{self, Budgets, Meter, Spent, Unit, Window};
use crate::config::Purpose;
use acpd_store::{Store, UsageQuery};

/// `acpd budget` options.
#[derive(clap::Args)]
pub(super) struct BudgetArgs {
    /// Only the budgets that apply to this principal (token name).
    #[arg(long)]
    principal: Option<String>,
    #[command(flatten)]
    pub args: crate::config::Args,
}

/// `acpd budget`: the table, for `cli.rs` to print (or the exit code of a failure, told).
pub(super) async fn run(b: BudgetArgs) -> Result<String, ExitCode> {
    let config = super::config_of(&b.args, Purpose::Admin)?;
    if config.budgets.is_empty() {
        eprintln!("acpd: no budgets are set: they are the config file's [budgets] table");
    }
    let store = super::admin_store(&b.args).await?;
    let r = table(b.principal.as_deref(), &config.budgets, &store, Utc::now()).await;
    store.close().await;
    r.map_err(super::fail)
}

/// This month's spending from the store, and the principals' names.
async fn table(
    only: Option<&str>,
    budgets: &Budgets,
    store: &Store,
    now: DateTime<Utc>,
) -> Result<String, String> {
    let q = UsageQuery {
        since_day: Some(budget::month_start(now)),
        ..UsageQuery::default()
    };
    let rollups = store.usage_rollup(&q).await.map_err(|e| e.to_string())?;
    let mut tallies = Tallies::default();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for r in &rollups {
        let spent = budget::spent_of(r, &budgets.currency);
        tallies.add(&r.principal_id, &r.profile, &r.day, spent);
        if !names.contains_key(&r.principal_id) {
            let name = match store.principal(&r.principal_id).await {
                Ok(Some(p)) => p.name,
                _ => r.principal_id.clone(),
            };
            names.insert(r.principal_id.clone(), name);
        }
    }
    // A principal that never spent (or never connected) has used nothing.
    let only = match only {
        None => None,
        Some(name) => {
            let id = match store.principal_by_name(name).await {
                Ok(p) => p.map(|p| p.id),
                Err(e) => return Err(e.to_string()),
            };
            Some((name, id))
        }
    };
    Ok(render(budgets, &tallies, &names, only, now))
}

/// One principal a table applies to: its id (`None`: it spent nothing) and name (`*`: any).
type Target = (Option<String>, String);

/// The table: a line per budget and principal it applies to (a principal's own table; the
/// default and each profile's for every principal that spent this month, or `*` for none).
fn render(
    budgets: &Budgets,
    tallies: &Tallies,
    names: &BTreeMap<String, String>,
    only: Option<(&str, Option<String>)>,
    now: DateTime<Utc>,
) -> String {
    let mut out =
        "budget\tscope\tprincipal\twindow\tlimit\taction\tused\tpercent\tresets\n".to_owned();
    let name_of = |id: &String| names.get(id).cloned().unwrap_or_else(|| id.clone());
    // Those who spent (through `profile`) and are not left out by `keep`.
    let spenders = |profile: Option<&str>, keep: &dyn Fn(&str) -> bool| -> Vec<Target> {
        match &only {
            Some((name, id)) => vec![(id.clone(), (*name).to_owned())],
            None => tallies
                .spenders(profile)
                .into_iter()
                .map(|id| (Some(id.clone()), name_of(&id)))
                .filter(|(_, name)| keep(name))
                .collect(),
        }
    };
    let mut emit = |scope: &str, meters: &[Meter], profile: &str, who: Vec<Target>| {
        let who = if who.is_empty() {
            vec![(None, "*".to_owned())]
        } else {
            who
        };
        for (id, name) in who {
            let spend = tallies.spend(id.as_deref().unwrap_or(""), profile, Spent::default(), now);
            for s in budget::statuses(meters, &spend) {
                out.push_str(&line(scope, &name, &s, &budgets.currency, now));
                out.push('\n');
            }
        }
    };
    let only_name = only.as_ref().map(|(n, _)| *n);
    let wanted = |name: &str| only_name.is_none_or(|o| o == name);
    // The default applies to whoever has no table of their own.
    if only_name.is_none_or(|o| !budgets.principals.contains_key(o)) {
        let own = |name: &str| !budgets.principals.contains_key(name);
        let meters = budgets.principal_meters(only_name.unwrap_or(""));
        let meters: Vec<Meter> = meters
            .into_iter()
            .filter(|m| m.name.starts_with("default."))
            .collect();
        if !meters.is_empty() {
            emit("default", &meters, "", spenders(None, &own));
        }
    }
    for name in budgets.principals.keys().filter(|n| wanted(n.as_str())) {
        let id = match &only {
            Some((_, id)) => id.clone(),
            None => names
                .iter()
                .find(|(_, n)| *n == name)
                .map(|(id, _)| id.clone()),
        };
        let meters = budgets.principal_meters(name);
        emit("principal", &meters, "", vec![(id, name.clone())]);
    }
    for profile in budgets.profiles.keys() {
        let meters = budgets.profile_meters(profile);
        emit(
            "profile",
            &meters,
            profile,
            spenders(Some(profile), &|_| true),
        );
    }
    out
}

/// One line: tab-separated; a session's budget is counted per session (`acpd usage
/// --session`), so its use and reset are `-`.
fn line(
    scope: &str,
    principal: &str,
    s: &budget::Status,
    currency: &str,
    now: DateTime<Utc>,
) -> String {
    let l = &s.meter.limit;
    let amount = |n: u64| match l.unit {
        Unit::Tokens => format!("{n} tokens"),
        Unit::Cost => format!("{} {currency}", budget::decimal_micros(n)),
    };
    let action = match l.action {
        budget::Action::Warn => "warn",
        budget::Action::Stop => "stop",
    };
    let (used, percent, resets) = match l.window {
        Window::Session => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        w => (
            amount(s.spent),
            format!("{}%", s.percent),
            budget::resets_at(w, now).map_or("-".to_owned(), |t| t.to_rfc3339()),
        ),
    };
    format!(
        "{}\t{scope}\t{principal}\t{}\t{}\t{action}\t{used}\t{percent}\t{resets}",
        s.meter.name,
        l.window.name(),
        amount(l.amount),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Action, Limit};
    use chrono::TimeZone;

    fn limit(window: Window, unit: Unit, amount: u64, action: Action) -> Limit {
        Limit {
            window,
            unit,
            amount,
            action,
        }
    }

    #[test]
    fn every_budget_is_listed_with_its_use_for_each_principal_it_applies_to() {
        let budgets = Budgets {
            currency: "USD".into(),
            default: vec![limit(Window::Day, Unit::Tokens, 1000, Action::Warn)],
            principals: BTreeMap::from([(
                "ci".to_owned(),
                vec![
                    limit(Window::Month, Unit::Cost, 20_000_000, Action::Stop),
                    limit(Window::Session, Unit::Tokens, 500, Action::Stop),
                ],
            )]),
            profiles: BTreeMap::from([(
                "claude".to_owned(),
                vec![limit(Window::Day, Unit::Tokens, 400, Action::Stop)],
            )]),
        };
        let now = Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap();
        let mut t = Tallies::default();
        let spent = |tokens, cost_micros| Spent {
            tokens,
            cost_micros,
        };
        t.add("id-a", "claude", "2026-12-06", spent(300, 0));
        t.add("id-a", "codex", "2026-12-05", spent(999, 0));
        t.add("id-ci", "codex", "2026-12-01", spent(10, 5_000_000));
        let names = BTreeMap::from([
            ("id-a".to_owned(), "alice".to_owned()),
            ("id-ci".to_owned(), "ci".to_owned()),
        ]);
        let all = render(&budgets, &t, &names, None, now);
        let day = "2026-12-07T00:00:00+00:00";
        let month = "2027-01-01T00:00:00+00:00";
        assert_eq!(
            all.lines().skip(1).collect::<Vec<_>>(),
            [
                format!(
                    "default.day.tokens\tdefault\talice\tday\t1000 tokens\twarn\t300 tokens\t30%\t{day}"
                ),
                format!(
                    "principals.ci.month.cost\tprincipal\tci\tmonth\t20 USD\tstop\t5 USD\t25%\t{month}"
                ),
                "principals.ci.session.tokens\tprincipal\tci\tsession\t500 tokens\tstop\t-\t-\t-"
                    .to_owned(),
                format!(
                    "profiles.claude.day.tokens\tprofile\talice\tday\t400 tokens\tstop\t300 tokens\t75%\t{day}"
                ),
            ]
        );
        // One principal: the budgets that apply to it, spent or not.
        let bob = render(&budgets, &t, &names, Some(("bob", None)), now);
        assert_eq!(
            bob.lines().skip(1).collect::<Vec<_>>(),
            [
                format!(
                    "default.day.tokens\tdefault\tbob\tday\t1000 tokens\twarn\t0 tokens\t0%\t{day}"
                ),
                format!(
                    "profiles.claude.day.tokens\tprofile\tbob\tday\t400 tokens\tstop\t0 tokens\t0%\t{day}"
                ),
            ]
        );
        let ci = render(
            &budgets,
            &t,
            &names,
            Some(("ci", Some("id-ci".into()))),
            now,
        );
        assert_eq!(ci.lines().count(), 4, "{ci}");
        assert!(!ci.contains("default."), "{ci}");
    }
}

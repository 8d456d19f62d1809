//! The budget decisions: which limits apply, readings, the gate, thresholds once each, and
//! the windows' resets.

use chrono::{TimeZone, Utc};

use super::ledger::Tallies;
use super::*;

fn limit(window: Window, unit: Unit, amount: u64, action: Action) -> Limit {
    Limit {
        window,
        unit,
        amount,
        action,
    }
}

fn budgets() -> Budgets {
    Budgets {
        currency: "USD".into(),
        default: vec![limit(Window::Day, Unit::Tokens, 1000, Action::Warn)],
        principals: BTreeMap::from([(
            "alice".to_owned(),
            vec![limit(Window::Session, Unit::Tokens, 100, Action::Stop)],
        )]),
        profiles: BTreeMap::from([(
            "claude".to_owned(),
            vec![limit(Window::Month, Unit::Cost, 2_000_000, Action::Stop)],
        )]),
    }
}

#[test]
fn a_principals_own_limits_replace_the_default_and_a_profiles_add_to_them() {
    let b = budgets();
    let names = |p: &str, prof: &str| -> Vec<String> {
        b.meters(p, prof).into_iter().map(|m| m.name).collect()
    };
    assert_eq!(names("alice", "x"), ["principals.alice.session.tokens"]);
    assert_eq!(names("bob", "x"), ["default.day.tokens"]);
    assert_eq!(
        names("bob", "claude"),
        ["default.day.tokens", "profiles.claude.month.cost"]
    );
}

#[test]
fn the_gate_closes_only_on_a_used_up_stop_budget() {
    let b = budgets();
    let meters = b.meters("alice", "claude");
    let mut spend = Spend::default();
    spend.session.tokens = 99;
    assert!(gate(&statuses(&meters, &spend)).is_none());
    spend.session.tokens = 100;
    let s = statuses(&meters, &spend);
    assert_eq!(
        gate(&s).map(|s| s.meter.name.as_str()),
        Some("principals.alice.session.tokens")
    );
    // A warn budget over its limit does not stop anything.
    let meters = b.meters("bob", "x");
    spend.principal_day.tokens = 5000;
    let s = statuses(&meters, &spend);
    assert_eq!(s[0].percent, 500);
    assert!(gate(&s).is_none());
    // Cost counts against cost limits only, through the profile's windows.
    let meters = b.meters("bob", "claude");
    spend.profile_month.cost_micros = 2_000_000;
    assert!(gate(&statuses(&meters, &spend)).is_some());
}

#[test]
fn each_threshold_is_announced_once_and_a_jump_announces_the_highest() {
    assert_eq!(threshold(0, 49), None);
    assert_eq!(threshold(0, 50), Some(50));
    assert_eq!(threshold(50, 79), None);
    assert_eq!(threshold(50, 85), Some(80));
    assert_eq!(threshold(0, 130), Some(100));
    assert_eq!(threshold(100, 400), None);
}

#[test]
fn tallies_sum_the_windows_and_announce_once_per_period() {
    let now = Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap();
    let mut t = Tallies::default();
    let spent = |tokens| Spent {
        tokens,
        cost_micros: 0,
    };
    t.add("a", "claude", "2026-12-06", spent(10));
    t.add("a", "other", "2026-12-06", spent(5));
    t.add("a", "claude", "2026-12-01", spent(100));
    t.add("a", "claude", "2026-11-30", spent(1000));
    t.add("b", "claude", "2026-12-06", spent(7));
    let s = t.spend("a", "claude", spent(3), now);
    assert_eq!(s.session.tokens, 3);
    assert_eq!(s.principal_day.tokens, 15);
    assert_eq!(s.profile_day.tokens, 10);
    assert_eq!(s.principal_month.tokens, 115);
    assert_eq!(s.profile_month.tokens, 110);

    let meters = budgets().meters("a", "x");
    let mut spend = s;
    spend.principal_day.tokens = 850;
    let crossed = t.crossings("a", "s1", statuses(&meters, &spend), now);
    assert_eq!(crossed.iter().map(|c| c.1).collect::<Vec<_>>(), [80]);
    assert!(
        t.crossings("a", "s2", statuses(&meters, &spend), now)
            .is_empty()
    );
    spend.principal_day.tokens = 1000;
    let crossed = t.crossings("a", "s1", statuses(&meters, &spend), now);
    assert_eq!(crossed.iter().map(|c| c.1).collect::<Vec<_>>(), [100]);
    // The next day starts over.
    let tomorrow = Utc.with_ymd_and_hms(2026, 12, 7, 0, 0, 1).unwrap();
    t.prune(tomorrow);
    spend.principal_day.tokens = 500;
    let crossed = t.crossings("a", "s1", statuses(&meters, &spend), tomorrow);
    assert_eq!(crossed.iter().map(|c| c.1).collect::<Vec<_>>(), [50]);
}

#[test]
fn windows_reset_at_the_next_utc_day_and_month() {
    let now = Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 0).unwrap();
    assert_eq!(resets_at(Window::Session, now), None);
    assert_eq!(
        resets_at(Window::Day, now).unwrap().to_rfc3339(),
        "2027-01-01T00:00:00+00:00"
    );
    assert_eq!(
        resets_at(Window::Month, now).unwrap().to_rfc3339(),
        "2027-01-01T00:00:00+00:00"
    );
    let mid = Utc.with_ymd_and_hms(2026, 2, 10, 1, 0, 0).unwrap();
    assert_eq!(month_start(mid), "2026-02-01");
    assert_eq!(
        resets_at(Window::Month, mid).unwrap().to_rfc3339(),
        "2026-03-01T00:00:00+00:00"
    );
}

#[test]
fn the_quota_snapshot_has_the_rfds_shape_and_marks_a_used_up_stop_budget() {
    let now = Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap();
    let b = budgets();
    let meters = b.meters("bob", "claude");
    let mut spend = Spend::default();
    spend.principal_day.tokens = 850;
    spend.profile_month.cost_micros = 500_000;
    let pools = quota_pools(&statuses(&meters, &spend), "USD", now);
    assert_eq!(pools[0]["id"], "acpd");
    assert_eq!(pools[0]["state"], "available");
    let day = &pools[0]["meters"][0];
    assert_eq!(day["id"], "default.day.tokens");
    assert_eq!(day["usedPercent"], 85);
    assert_eq!(day["used"], json!({ "value": "850", "unit": "tokens" }));
    assert_eq!(
        day["remaining"],
        json!({ "value": "150", "unit": "tokens" })
    );
    assert_eq!(day["window"], "P1D");
    assert_eq!(day["status"], "warning");
    assert_eq!(day["resetsAt"], "2026-12-07T00:00:00+00:00");
    let cost = &pools[0]["meters"][1];
    assert_eq!(cost["used"], json!({ "value": "0.5", "unit": "USD" }));
    assert_eq!(cost["limit"], json!({ "value": "2", "unit": "USD" }));
    assert_eq!(cost["status"], "ok");
    spend.profile_month.cost_micros = 2_000_001;
    let pools = quota_pools(&statuses(&meters, &spend), "USD", now);
    assert_eq!(pools[0]["state"], "exhausted");
    assert_eq!(pools[0]["meters"][1]["status"], "exceeded");
    assert_eq!(
        pools[0]["meters"][1]["remaining"],
        json!({ "value": "0", "unit": "USD" })
    );
    // A session's budget never resets; no budgets, no pool.
    let alice = quota_pools(&statuses(&b.meters("alice", "x"), &spend), "USD", now);
    assert_eq!(alice[0]["meters"][0].get("window"), None);
    assert_eq!(alice[0]["meters"][0].get("resetsAt"), None);
    assert_eq!(quota_pools(&[], "USD", now), json!([]));
    assert_eq!(decimal_micros(12_340_000), "12.34");
    assert_eq!(decimal_micros(1), "0.000001");
}

#[test]
fn only_day_and_month_budgets_count_other_sessions() {
    let b = budgets();
    assert!(!counts_others(&b.meters("alice", "x")));
    assert!(counts_others(&b.meters("alice", "claude")));
    assert!(counts_others(&b.meters("bob", "x")));
}

#[tokio::test]
async fn the_ledger_wakes_its_watchers_when_spending_is_added_and_not_for_nothing() {
    let ledger = Ledger::default();
    let mut rx = ledger.watch();
    ledger.add("a", "p", "2026-12-06", Spent::default());
    assert!(!rx.has_changed().expect("open"), "nothing was spent");
    ledger.add(
        "b",
        "p",
        "2026-12-06",
        Spent {
            tokens: 5,
            cost_micros: 0,
        },
    );
    tokio::time::timeout(std::time::Duration::from_secs(5), rx.changed())
        .await
        .expect("woken")
        .expect("open");
    let now = Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap();
    assert_eq!(
        ledger
            .spend("b", "p", Spent::default(), now)
            .principal_day
            .tokens,
        5
    );
}

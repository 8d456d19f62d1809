//! Store checks of usage: turn rows summed per principal, profile, day and currency (unknown
//! turns counted, never as zero), filtered by principal, day and session; permission
//! decisions listed per session in order.

use acpd_store::{DecisionRow, TurnUsageRow, UsageQuery};

use super::{on_postgres, open};

both!(sqlite_usage_rollups, postgres_usage_rollups, check_usage);

fn turn(session: &str, principal: &str, day: &str, tokens: Option<(i64, i64)>) -> TurnUsageRow {
    TurnUsageRow {
        session_id: session.into(),
        principal_id: principal.into(),
        profile: "p".into(),
        day: day.into(),
        at_ms: 1,
        known: tokens.is_some(),
        input_tokens: tokens.map(|t| t.0),
        output_tokens: tokens.map(|t| t.1),
        ..TurnUsageRow::default()
    }
}

async fn check_usage(url: String) {
    let store = open(&url).await;
    for row in [
        turn("s1", "alice", "2026-12-01", Some((100, 20))),
        turn("s1", "alice", "2026-12-01", Some((50, 5))),
        turn("s1", "alice", "2026-12-01", None),
        turn("s2", "alice", "2026-12-02", Some((7, 3))),
        turn("s3", "bob", "2026-12-02", None),
        TurnUsageRow {
            cost_micros: Some(1_500_000),
            currency: Some("USD".into()),
            ..turn("s3", "bob", "2026-12-02", None)
        },
    ] {
        store.record_turn_usage(&row).await.expect("record");
    }
    let all = store
        .usage_rollup(&UsageQuery::default())
        .await
        .expect("rollup");
    assert_eq!(all.len(), 4, "{all:?}");
    let first = &all[0];
    assert_eq!(
        (first.principal_id.as_str(), first.day.as_str()),
        ("alice", "2026-12-01")
    );
    assert_eq!((first.turns, first.unknown_turns), (3, 1));
    assert_eq!(
        (first.input_tokens, first.output_tokens),
        (Some(150), Some(25))
    );
    let bob: Vec<_> = all.iter().filter(|r| r.principal_id == "bob").collect();
    assert_eq!(bob.len(), 2, "one row per currency: {bob:?}");
    assert!(bob.iter().any(|r| r.cost_micros == Some(1_500_000)));
    assert!(
        bob.iter().all(|r| r.input_tokens.is_none()),
        "unknown is not zero"
    );

    let q = UsageQuery {
        principal_id: Some("alice".into()),
        since_day: Some("2026-12-02".into()),
        session_id: None,
    };
    let alice = store.usage_rollup(&q).await.expect("rollup");
    assert_eq!(alice.len(), 1);
    assert_eq!(alice[0].input_tokens, Some(7));
    let q = UsageQuery {
        session_id: Some("s1".into()),
        ..UsageQuery::default()
    };
    let s1 = store.usage_rollup(&q).await.expect("rollup");
    assert_eq!(s1.len(), 1);
    assert_eq!(s1[0].turns, 3);

    for (at, automatic) in [(2, false), (1, true)] {
        let row = DecisionRow {
            session_id: "s1".into(),
            at_ms: at,
            tool_call_id: Some(format!("t{at}")),
            option_kind: Some("allow_once".into()),
            outcome: "selected".into(),
            decided_by: (!automatic).then(|| "{\"principal\":\"alice\"}".into()),
            automatic,
            ..DecisionRow::default()
        };
        store.record_decision(&row).await.expect("decision");
    }
    let d = store.decisions_of("s1").await.expect("decisions");
    assert_eq!(d.len(), 2);
    assert!(d[0].automatic && d[0].decided_by.is_none());
    assert!(!d[1].automatic && d[1].decided_by.is_some());
    assert!(store.decisions_of("s2").await.expect("none").is_empty());
    store.close().await;
}

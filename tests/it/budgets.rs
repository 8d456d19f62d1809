//! Budgets and usage end to end: what turns spend is rolled up in the store (both stores,
//! `acpd usage`), a `warn` budget announces each threshold once, a `stop` budget cancels the
//! running turn and refuses the next prompt with its reset time, budgets survive a restart,
//! and `/metrics` carries the counters. The scripted agent reports `usage` and `cost`; the
//! built-in agent's model calls are counted as the scripted model server spends them (100
//! input and 20 output tokens a call). Clients that declared `session.quota` get
//! `quota_update`s, live only; a principal's budget used up in one session stops the turn
//! running in another; `acpd budget` prints every budget with its use.

use std::path::Path;

use serde_json::{Value, json};

use crate::builtin_support::model::{Ev, tool};
use crate::builtin_support::{Acpd, ModelServer, builtin_config, no_caps};
use crate::logging::metric;
use crate::operations::http_get;
use crate::support::{Client, Daemon, DaemonOptions, kind};

/// The error code of a used-up `stop` budget (`quotaExceeded`).
const QUOTA_EXCEEDED: i64 = -32013;

/// A daemon whose config file is `config` (beside the test's other options).
async fn daemon_with(config: &str, opts: DaemonOptions) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("config dir");
    let file = dir.path().join("acpd.toml");
    std::fs::write(&file, config).expect("config file");
    let daemon = Daemon::start_with(opts.arg("--config", file.display())).await;
    (daemon, dir)
}

async fn session(daemon: &Daemon) -> (Client, String) {
    let mut c = daemon.client().await;
    let sid = c.new_session(&daemon.work_dir()).await;
    (c, sid)
}

/// `acpd usage ARGS` against the daemon's store: its table, one line per row.
async fn usage_table(daemon: &Daemon, args: &[&str]) -> Vec<String> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_acpd"))
        .arg("usage")
        .args(["--store", &daemon.store_url()])
        .args([
            "--data-dir",
            &daemon.dir().join("data").display().to_string(),
        ])
        .args(args)
        .env_remove("ACPD_CONFIG")
        .output()
        .await
        .expect("run acpd usage");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "acpd usage failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines().skip(1).map(str::to_owned).collect()
}

fn today() -> String {
    chrono::Utc::now().format("%Y-%m-%d").to_string()
}

/// The `_acpd/session/budget` notifications buffered so far, by event and threshold.
async fn budget_notices(c: &mut Client, n: usize) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let m = c
            .next_notification_where("an _acpd/session/budget notice", |m| {
                m["method"] == "_acpd/session/budget"
            })
            .await;
        let p = &m["params"];
        out.push((
            p["event"].as_str().unwrap_or_default().to_owned(),
            p["threshold"].as_u64().unwrap_or_default(),
        ));
    }
    out
}

#[tokio::test]
async fn usage_rolls_up_per_session_principal_and_day_on_sqlite() {
    usage_rolls_up(DaemonOptions::default().sqlite()).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_pg),
    ignore = "set ACPD_TEST_DATABASE_URL to run the Postgres tests"
)]
async fn usage_rolls_up_per_session_principal_and_day_on_postgres() {
    usage_rolls_up(DaemonOptions::default().postgres()).await;
}

async fn usage_rolls_up(opts: DaemonOptions) {
    let daemon = Daemon::start_with(opts).await;
    let (mut c, a) = session(&daemon).await;
    let r = c
        .prompt(&a, "usage 100 20 5 2\ncost 0.25 USD\necho one")
        .await;
    assert_eq!(r.1.expect("turn")["usage"]["inputTokens"], 100);
    c.prompt(&a, "echo nothing reported").await.1.expect("turn");
    let b = c.new_session(&daemon.work_dir()).await;
    c.prompt(&b, "usage 7 3").await.1.expect("turn");

    let day = today();
    let all = usage_table(&daemon, &[]).await;
    assert_eq!(
        all,
        [format!(
            "{day}\tlocal\tscripted\t3\t1\t107\t23\t5\t2\t0.250000 USD"
        )],
        "three turns, one of unknown usage"
    );
    let only_a = usage_table(&daemon, &["--session", &a]).await;
    assert_eq!(
        only_a,
        [format!(
            "{day}\tlocal\tscripted\t2\t1\t100\t20\t5\t2\t0.250000 USD"
        )]
    );
    let unknown_only =
        usage_table(&daemon, &["--principal", "local", "--since", "2999-01-01"]).await;
    assert!(unknown_only.is_empty(), "{unknown_only:?}");
    // A turn nobody reported on is unknown, never zero.
    c.prompt(&b, "echo silent").await.1.expect("turn");
    let silent = usage_table(&daemon, &["--session", &b]).await;
    assert_eq!(
        silent,
        [format!("{day}\tlocal\tscripted\t2\t1\t7\t3\t0\t0\t?")]
    );

    let (status, metrics) = http_get(daemon.addr, "/metrics").await;
    assert_eq!(status, 200);
    let series = |kind: &str| {
        format!(
            "acpd_usage_tokens_total{{principal=\"local\",profile=\"scripted\",kind=\"{kind}\"}}"
        )
    };
    assert_eq!(metric(&metrics, &series("input")), 107.0, "{metrics}");
    assert_eq!(metric(&metrics, &series("output")), 23.0);
    assert_eq!(
        metric(
            &metrics,
            "acpd_usage_turns_total{principal=\"local\",profile=\"scripted\",known=\"false\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(
            &metrics,
            "acpd_usage_cost_micros_total{principal=\"local\",profile=\"scripted\",currency=\"USD\"}"
        ),
        250_000.0
    );
}

#[tokio::test]
async fn a_warn_budget_announces_each_threshold_once_and_stops_nothing() {
    let config = r#"
[budgets.default]
session = { cost = 1.0, action = "warn" }
"#;
    let (daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
    let (mut c, sid) = session(&daemon).await;
    let script = "cost 0.3 USD\ncost 0.3 USD\ncost 0.3 USD\ncost 0.3 USD\ncost 0.3 USD";
    let r = c
        .prompt(&sid, script)
        .await
        .1
        .expect("a warn budget stops nothing");
    assert_eq!(r["stopReason"], "end_turn");
    let notices = budget_notices(&mut c, 3).await;
    assert_eq!(
        notices,
        [
            ("threshold".to_owned(), 50),
            ("threshold".to_owned(), 80),
            ("threshold".to_owned(), 100)
        ]
    );
    let r = c
        .prompt(&sid, "cost 0.5 USD\necho more")
        .await
        .1
        .expect("turn");
    assert_eq!(r["stopReason"], "end_turn");
    let log = std::fs::read_to_string(daemon.log_path()).unwrap_or_default();
    let audits = log
        .lines()
        .filter(|l| l.contains("acpd::audit") && l.contains("budget threshold reached"))
        .count();
    assert_eq!(audits, 3, "one audit line per threshold:\n{log}");
    // A notice would have come before the turn's answer: none is buffered.
    let extra = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        c.next_notification_where("another budget notice", |m| {
            m["method"] == "_acpd/session/budget"
        }),
    )
    .await;
    assert!(extra.is_err(), "a threshold announced twice: {extra:?}");
}

#[tokio::test]
async fn a_stop_budget_cancels_the_running_turn_and_refuses_the_next_prompt() {
    let config = r#"
[budgets.default]
session = { cost = 1.0, action = "stop" }
"#;
    let (daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
    let (mut c, sid) = session(&daemon).await;
    let r = c
        .prompt(&sid, "cost 0.6 USD\ncost 0.6 USD\nwait_for_cancel")
        .await
        .1
        .expect("the turn ends");
    assert_eq!(r["stopReason"], "cancelled");
    let notices = budget_notices(&mut c, 3).await;
    assert_eq!(notices[0], ("threshold".to_owned(), 50));
    assert_eq!(notices[1], ("threshold".to_owned(), 100));
    assert!(
        notices.contains(&("stopped".to_owned(), 100)),
        "{notices:?}"
    );
    let e = c
        .prompt(&sid, "echo again")
        .await
        .1
        .expect_err("the budget is used up");
    assert_eq!(e.code, QUOTA_EXCEEDED, "{e}");
    let data = e.data.expect("data");
    assert_eq!(data["reason"], "quotaExceeded");
    assert_eq!(data["budget"], "default.session.cost");
    assert_eq!(
        data["resetsAt"],
        Value::Null,
        "a session's budget never resets"
    );
    assert!(e.message.contains("default.session.cost"), "{}", e.message);
    // Another session starts with its own session budget.
    let other = c.new_session(&daemon.work_dir()).await;
    c.prompt(&other, "echo fresh")
        .await
        .1
        .expect("a new session may prompt");
}

#[tokio::test]
async fn a_day_budget_survives_a_restart_and_names_when_it_resets() {
    let config = r#"
[budgets.principals.local]
day = { tokens = 100, action = "stop" }
"#;
    let (mut daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
    let (mut c, sid) = session(&daemon).await;
    c.prompt(&sid, "usage 150 0")
        .await
        .1
        .expect("the turn that spends it");
    let e = c.prompt(&sid, "echo x").await.1.expect_err("used up");
    assert_eq!(e.code, QUOTA_EXCEEDED);
    let tomorrow = (chrono::Utc::now().date_naive() + chrono::Days::new(1)).format("%Y-%m-%d");
    let resets = e.data.as_ref().expect("data")["resetsAt"].clone();
    assert_eq!(resets, json!(format!("{tomorrow}T00:00:00+00:00")));
    drop(c);
    // A stop and a start: the turn's record is written before acpd exits, even when its
    // session ended first (a SIGKILL right after a turn may lose that record).
    daemon.restart_gracefully().await;
    let (mut c, fresh) = session(&daemon).await;
    let e = c
        .prompt(&fresh, "echo after restart")
        .await
        .1
        .expect_err("what was spent before the restart still counts");
    assert_eq!(e.code, QUOTA_EXCEEDED);
    assert_eq!(
        e.data.expect("data")["budget"],
        "principals.local.day.tokens"
    );
}

#[tokio::test]
async fn a_stop_budget_stops_the_builtin_agent_within_one_model_call() {
    let model = ModelServer::start().await;
    let budgets = r#"
[budgets.default]
day = { tokens = 200, action = "stop" }
"#;
    let config = format!("{}{budgets}", builtin_config(model.addr, ""));
    let acpd = Acpd::start(&config).await;
    write(&acpd.work(), "a.txt");
    // 120 tokens a call: the second call passes 200.
    model.push_stream(vec![tool("read_file", json!({ "path": "a.txt" }))]);
    model.push_stream(vec![tool("read_file", json!({ "path": "a.txt" }))]);
    model.push_stream(vec![Ev::Pause(20_000), Ev::Text("too late".into())]);
    model.push_stream(vec![Ev::Text("never".into())]);
    let mut ed = acpd.editor(no_caps()).await;
    let (sid, _) = ed.new_session(&acpd.work(), json!({})).await;
    let r = ed
        .prompt(&sid, "read it twice")
        .await
        .expect("the turn ends");
    assert_eq!(r["stopReason"], "cancelled");
    let calls = model.requests().len();
    assert!(
        (2..=3).contains(&calls),
        "stopped within one model call of crossing: {calls} calls"
    );
    let e = ed.prompt(&sid, "more").await.expect_err("refused");
    assert_eq!(e["code"], QUOTA_EXCEEDED, "{e}");
    assert_eq!(e["data"]["budget"], "default.day.tokens");
    assert!(e["data"]["resetsAt"].is_string(), "{e}");
    assert!(
        acpd.log()
            .contains("budget used up: cancelling the running turn"),
        "the audit line"
    );
}

fn write(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), "hello\n").expect("write");
}

#[tokio::test]
async fn an_automatic_and_a_human_approval_are_both_in_the_audit_list() {
    let agent = crate::support::scripted_agent_bin();
    let config = format!("[agents.reader]\ncommand = {agent:?}\napprove = \"reads\"\n");
    let (daemon, _cfg) = daemon_with(&config, DaemonOptions::default()).await;
    let mut c = Client::connect_ws(&format!("{}?agent=reader", daemon.ws_url()))
        .await
        .expect("connect");
    c.initialize().await;
    let sid = c.new_session(&daemon.work_dir()).await;
    let (updates, r) = c.prompt(&sid, "permission_read").await;
    r.expect("turn");
    assert!(
        crate::support::agent_texts(&updates).contains(&"permission: selected allow-once".into()),
        "{updates:?}"
    );
    assert!(
        c.received_requests.is_empty(),
        "a read was approved without asking the client: {:?}",
        c.received_requests
    );
    let (updates, r) = c.prompt(&sid, "ask_tool").await;
    r.expect("turn");
    assert!(
        crate::support::agent_texts(&updates).contains(&"permission: selected allow-once".into())
    );
    assert_eq!(c.received_requests.len(), 1, "anything else is asked");

    let (status, body) = http_get(daemon.addr, &format!("/web/api/sessions/{sid}/usage")).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    let list = v["permissions"].as_array().expect("permissions").clone();
    assert_eq!(list.len(), 2, "{v}");
    assert_eq!(list[0]["automatic"], true);
    assert_eq!(list[0]["kind"], "read");
    assert_eq!(list[0]["optionKind"], "allow_once");
    assert_eq!(list[0]["decidedBy"], Value::Null);
    assert_eq!(list[1]["automatic"], false);
    assert_eq!(list[1]["optionId"], "allow-once");
    assert_eq!(list[1]["decidedBy"]["principal"], "local");
    assert_eq!(list[1]["decidedBy"]["name"], "acpd-tests");
    assert_eq!(v["usage"][0]["turns"], 2);
    assert_eq!(v["usage"][0]["unknownTurns"], 2);
}

#[tokio::test]
async fn quota_read_answers_the_sessions_budgets_as_a_snapshot() {
    let config = r#"
[budgets.default]
session = { tokens = 1000, action = "stop" }
month = { cost = 10.0, action = "warn" }
"#;
    let (daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
    let (mut c, sid) = session(&daemon).await;
    c.prompt(&sid, "usage 200 50\ncost 2.5 USD")
        .await
        .1
        .expect("turn");
    let snap = c
        .request("quota/read", json!({ "sessionId": sid }))
        .await
        .expect("quota/read");
    let meters = snap["pools"][0]["meters"]
        .as_array()
        .expect("meters")
        .clone();
    assert_eq!(meters.len(), 2, "{snap}");
    let by_id = |id: &str| meters.iter().find(|m| m["id"] == id).cloned().expect(id);
    let tokens = by_id("default.session.tokens");
    assert_eq!(
        (tokens["used"].clone(), tokens["usedPercent"].clone()),
        (json!({ "value": "250", "unit": "tokens" }), json!(25))
    );
    assert_eq!(tokens["status"], "ok");
    assert_eq!(
        tokens.get("resetsAt"),
        None,
        "a session's budget never resets"
    );
    let cost = by_id("default.month.cost");
    assert_eq!(cost["usedPercent"], 25);
    assert_eq!(cost["used"], json!({ "value": "2.5", "unit": "USD" }));
    assert_eq!(cost["window"], "P1M");
    assert!(cost["resetsAt"].is_string());
}

/// A client whose `initialize` declares `caps` (and a name).
async fn client_with(daemon: &Daemon, name: &str, caps: Value) -> Client {
    let mut c = daemon.connect().await;
    let init = json!({
        "protocolVersion": 1,
        "clientCapabilities": caps,
        "clientInfo": { "name": name, "version": "0" },
    });
    c.request("initialize", init).await.expect("initialize");
    c
}

fn quota_updates(updates: &[Value]) -> Vec<Value> {
    updates
        .iter()
        .filter(|u| kind(u) == "quota_update")
        .cloned()
        .collect()
}

/// The meter `id` of a `quota_update`'s params.
fn meter(update: &Value, id: &str) -> Value {
    let meters = update["update"]["pools"][0]["meters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    meters
        .into_iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no meter {id} in {update}"))
}

#[tokio::test]
async fn quota_update_goes_live_to_clients_that_declared_session_quota_and_is_never_replayed() {
    let config = r#"
[budgets.default]
session = { tokens = 1000, action = "stop" }
month = { cost = 10.0, action = "warn" }
"#;
    let (daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
    let quota = json!({ "session": { "quota": {} } });
    let mut a = client_with(&daemon, "quota-aware", quota.clone()).await;
    let sid = a.new_session(&daemon.work_dir()).await;
    let mut plain = client_with(&daemon, "plain", json!({})).await;
    plain.attach_after(&sid, 0).await.1.expect("attach");

    let (ups, r) = a
        .prompt(&sid, "cost 2.5 USD\nusage 200 50\necho marker")
        .await;
    r.expect("turn");
    let quota_ups = quota_updates(&ups);
    // One when the cost is reported, one when the turn's tokens are counted.
    assert_eq!(quota_ups.len(), 2, "{ups:?}");
    let first = &quota_ups[0];
    assert_eq!(meter(first, "default.month.cost")["usedPercent"], 25);
    assert_eq!(meter(first, "default.session.tokens")["usedPercent"], 0);
    let last = &quota_ups[1];
    assert!(last["update"]["updatedAt"].is_string(), "{last}");
    assert_eq!(last["update"]["pools"][0]["state"], "available");
    let tokens = meter(last, "default.session.tokens");
    assert_eq!(tokens["usedPercent"], 25);
    assert_eq!(tokens["used"], json!({ "value": "250", "unit": "tokens" }));
    assert_eq!(
        tokens["limit"],
        json!({ "value": "1000", "unit": "tokens" })
    );
    assert_eq!(tokens["status"], "ok");
    let cost = meter(last, "default.month.cost");
    assert_eq!(cost["usedPercent"], 25);
    assert_eq!(cost["window"], "P1M");
    assert!(cost["resetsAt"].is_string(), "{cost}");
    assert_eq!(
        last.pointer("/_meta/acpd/seq"),
        None,
        "live state: not journaled"
    );

    // The plain client saw the turn, and no quota_update before a later turn's end.
    let mut seen = plain.updates_until_text("marker").await;
    let (_, r) = a.prompt(&sid, "echo fence").await;
    r.expect("turn");
    seen.extend(plain.updates_until_text("fence").await);
    assert!(
        quota_updates(&seen).is_empty(),
        "a client that did not declare session.quota got one: {seen:?}"
    );
    assert!(seen.iter().any(|u| kind(u) == "usage_update"), "{seen:?}");

    // A load replays the history, never a quota_update, even to a client that declared it.
    let mut loader = client_with(&daemon, "quota-aware loader", quota).await;
    let (replayed, r) = loader.load(&sid, &daemon.work_dir()).await;
    r.expect("load");
    assert!(
        replayed.iter().any(|u| kind(u) == "usage_update"),
        "{replayed:?}"
    );
    assert!(
        quota_updates(&replayed).is_empty(),
        "replayed: {replayed:?}"
    );
}

fn next_month_start() -> String {
    use chrono::Datelike;
    let today = chrono::Utc::now().date_naive();
    let (y, m) = if today.month() == 12 {
        (today.year() + 1, 1)
    } else {
        (today.year(), today.month() + 1)
    };
    format!("{y:04}-{m:02}-01T00:00:00+00:00")
}

fn tomorrow_start() -> String {
    let tomorrow = chrono::Utc::now().date_naive() + chrono::Days::new(1);
    format!("{}T00:00:00+00:00", tomorrow.format("%Y-%m-%d"))
}

#[tokio::test]
async fn a_principals_stop_budget_crossed_in_one_session_stops_the_turn_running_in_another() {
    // A principal's day in cost (reported live, mid-turn) and a profile's month in tokens
    // (reported in the prompt's answer, at the turn's end).
    let cases = [
        (
            "[budgets.default]\nday = { cost = 1.0, action = \"stop\" }\n",
            "cost 1.5 USD\necho spent",
            "default.day.cost",
            tomorrow_start(),
        ),
        (
            "[budgets.profiles.scripted]\nmonth = { tokens = 100, action = \"stop\" }\n",
            "usage 150 0\necho spent",
            "profiles.scripted.month.tokens",
            next_month_start(),
        ),
    ];
    for (config, spend, budget, resets) in cases {
        let (daemon, _cfg) = daemon_with(config, DaemonOptions::default()).await;
        let (mut b, b_sid) = session(&daemon).await;
        let running = b.send_prompt(&b_sid, "echo started\nwait_for_cancel").await;
        b.updates_until_text("started").await;

        let (mut a, a_sid) = session(&daemon).await;
        a.prompt(&a_sid, spend)
            .await
            .1
            .expect("the turn that spends");

        let r = b
            .wait_response(&running)
            .await
            .expect("the other session's turn ends");
        assert_eq!(r["stopReason"], "cancelled", "{budget}");
        let stopped = b
            .next_notification_where("the stop notice", |m| {
                m["method"] == "_acpd/session/budget" && m["params"]["event"] == "stopped"
            })
            .await;
        assert_eq!(stopped["params"]["sessionId"], b_sid.as_str());
        assert_eq!(stopped["params"]["meter"]["id"], budget);

        let e = b
            .prompt(&b_sid, "echo again")
            .await
            .1
            .expect_err("the next prompt is refused");
        assert_eq!(e.code, QUOTA_EXCEEDED, "{e}");
        let data = e.data.expect("data");
        assert_eq!(data["budget"], budget);
        assert_eq!(data["resetsAt"], json!(resets), "{budget}");
        let log = std::fs::read_to_string(daemon.log_path()).unwrap_or_default();
        assert!(
            log.contains("budget used up by another session"),
            "the audit line: {log}"
        );
    }
}

/// `acpd budget ARGS` against the daemon's store and `config`, with a container's
/// environment (a listener `serve` would refuse): its lines after the header.
async fn budget_table(daemon: &Daemon, config: &Path, args: &[&str]) -> Vec<String> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_acpd"))
        .arg("budget")
        .args(["--config", &config.display().to_string()])
        .args(["--store", &daemon.store_url()])
        .args([
            "--data-dir",
            &daemon.dir().join("data").display().to_string(),
        ])
        .args(args)
        .env_remove("ACPD_CONFIG")
        .env("ACPD_LISTEN", "0.0.0.0:7420")
        .output()
        .await
        .expect("run acpd budget");
    assert!(
        out.status.success(),
        "acpd budget failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().map(str::to_owned);
    assert_eq!(
        lines.next().as_deref(),
        Some("budget\tscope\tprincipal\twindow\tlimit\taction\tused\tpercent\tresets")
    );
    lines.collect()
}

#[tokio::test]
async fn acpd_budget_prints_every_budget_with_its_use_and_reset() {
    let config = r#"
[budgets]
currency = "USD"

[budgets.default]
day = { tokens = 1000, action = "warn" }

[budgets.principals.ci]
month = { cost = 20.0, action = "stop" }
session = { tokens = 500, action = "stop" }

[budgets.profiles.scripted]
month = { tokens = 400, action = "stop" }
"#;
    let (daemon, dir) = daemon_with(config, DaemonOptions::default()).await;
    let file = dir.path().join("acpd.toml");
    let (mut c, sid) = session(&daemon).await;
    c.prompt(&sid, "usage 200 50\ncost 1.5 USD")
        .await
        .1
        .expect("turn");
    let (day, month) = (tomorrow_start(), next_month_start());
    let want = [
        format!(
            "default.day.tokens\tdefault\tlocal\tday\t1000 tokens\twarn\t250 tokens\t25%\t{day}"
        ),
        "principals.ci.session.tokens\tprincipal\tci\tsession\t500 tokens\tstop\t-\t-\t-"
            .to_owned(),
        format!("principals.ci.month.cost\tprincipal\tci\tmonth\t20 USD\tstop\t0 USD\t0%\t{month}"),
        format!(
            "profiles.scripted.month.tokens\tprofile\tlocal\tmonth\t400 tokens\tstop\t250 tokens\t62%\t{month}"
        ),
    ];
    // The turn's row is written as the turn ends: read until it is there.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut all = budget_table(&daemon, &file, &[]).await;
    while all != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        all = budget_table(&daemon, &file, &[]).await;
    }
    assert_eq!(all, want);

    let ci = budget_table(&daemon, &file, &["--principal", "ci"]).await;
    assert_eq!(
        ci,
        [
            want[1].clone(),
            want[2].clone(),
            format!(
                "profiles.scripted.month.tokens\tprofile\tci\tmonth\t400 tokens\tstop\t0 tokens\t0%\t{month}"
            ),
        ]
    );
    let local = budget_table(&daemon, &file, &["--principal", "local"]).await;
    assert_eq!(local, [want[0].clone(), want[3].clone()]);
}

#[tokio::test]
async fn a_bad_budget_or_approve_preset_exits_64_with_one_line_naming_it() {
    for (config, says) in [
        (
            "[budgets.default]\nday = { action = \"stop\" }\n",
            "invalid budgets.default.day: give tokens, cost or both",
        ),
        (
            "[budgets.principals.ci]\nmonth = { cost = 5.0, action = \"halt\" }\n",
            "invalid budgets.principals.ci.month: action \"halt\"",
        ),
        (
            "[agents.x]\ncommand = \"x\"\napprove = \"all\"\n",
            "approve \"all\": the only preset is \"reads\"",
        ),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("acpd.toml");
        std::fs::write(&file, config).expect("config");
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_acpd"))
            .arg("check-config")
            .arg("--config")
            .arg(&file)
            .args(["--data-dir", &dir.path().join("data").display().to_string()])
            .output()
            .await
            .expect("run acpd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{config}: {stderr}");
        assert!(stderr.contains(says), "{config}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

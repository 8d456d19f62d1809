//! Spend and approvals in the web console (issue 44), in a real headless Chromium
//! (`browser.rs`'s harness): a session whose scripted agent reports usage and cost, one read
//! approved automatically (`approve = "reads"`) and one permission answered by a click; the
//! session's page shows its tokens, cost, turns of unknown usage, its budgets and both
//! decisions with who and what; the sessions page shows today's and this month's spend and a
//! chart with one bar per day with data.

use fantoccini::{Client as Browser, Locator};
use serde_json::{Value, json};

use super::browser::{
    Chromedriver, choose, click, screenshot, screenshot_here, type_prompt, until, until_turn,
    viewport,
};
use super::support::{csp_violations, daemon_with_config, origin, sign_in_link};
use crate::support::scripted_agent_bin;
use crate::support::security_support::{bearer, client};

/// The text of `css`'s first match.
async fn text_of(b: &Browser, css: &str) -> String {
    b.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

/// A figure of the session's panel (`data-figure`), its value.
async fn figure(b: &Browser, name: &str) -> String {
    text_of(
        b,
        &format!("#spend-body [data-figure='{name}'] .figure-value"),
    )
    .await
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn the_console_shows_spend_budgets_and_who_approved_what() {
    let dir = tempfile::tempdir().expect("config dir");
    let config = dir.path().join("acpd.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.reader]\ncommand = {:?}\napprove = \"reads\"\n\
             [budgets.default]\nsession = {{ tokens = 1000, action = \"stop\" }}\n\
             month = {{ cost = 10.0, action = \"warn\" }}\n",
            scripted_agent_bin()
        ),
    )
    .expect("config");
    let driver = Chromedriver::start().await;
    let (d, token) = daemon_with_config(&config).await;
    let (k, v) = bearer(&token);

    // An editor's turns: one reporting tokens and cost, one whose read is approved by acpd
    // (no usage reported: unknown).
    let mut editor = client(&format!("{}?agent=reader", d.ws_url()), &[(k, &v)], None).await;
    let sid = editor.open_session(&d.work_dir()).await;
    let (_, r) = editor
        .prompt(&sid, "usage 100 20 5 2\ncost 0.25 USD\necho spent")
        .await;
    assert_eq!(r.expect("a turn")["stopReason"], "end_turn");
    let (_, r) = editor.prompt(&sid, "permission_read").await;
    assert_eq!(r.expect("a read")["stopReason"], "end_turn");
    assert!(
        editor.received_requests.is_empty(),
        "the read was not asked"
    );
    editor.close().await;

    // A permission answered by a click in the page.
    let b = driver.browser().await;
    let base = origin(&d);
    b.goto(&sign_in_link(&d, "local", "5m").await)
        .await
        .expect("sign in");
    until(&b, "the sessions page", "return location.pathname === '/'").await;
    b.goto(&format!("{base}/s/{sid}?role=controller"))
        .await
        .expect("the session's page");
    until(
        &b,
        "control",
        "return document.body.dataset.role === 'controller'",
    )
    .await;
    type_prompt(&b, "ask_tool").await;
    until(
        &b,
        "the permission's buttons",
        "return !!document.querySelector('.permission button[data-option=\"allow-once\"]')",
    )
    .await;
    choose(&b, "allow-once").await;
    until_turn(&b, "end_turn").await;

    // The session's panel: tokens by kind, cost, unknown turns, budgets, both decisions.
    // It is at the top, under the sticky bar: scrolled to first.
    b.execute("window.scrollTo(0, 0)", vec![])
        .await
        .expect("scroll up");
    b.find(Locator::Css("#spend summary"))
        .await
        .expect("the panel")
        .click()
        .await
        .expect("open it");
    until(
        &b,
        "both decisions in the panel",
        "return document.querySelectorAll('#spend-body tr.decision').length === 2",
    )
    .await;
    assert_eq!(figure(&b, "input").await, "100");
    assert_eq!(figure(&b, "output").await, "20");
    assert_eq!(figure(&b, "cached").await, "5");
    assert_eq!(figure(&b, "thought").await, "2");
    assert_eq!(figure(&b, "cost").await, "0.25 USD");
    assert_eq!(figure(&b, "turns").await, "3");
    let unknown = text_of(&b, "#spend-body .unknown-turns").await;
    assert!(
        unknown.contains("2 of 3 turns reported no usage"),
        "{unknown}"
    );
    let summary = text_of(&b, "#spend-summary").await;
    assert!(summary.contains("122 tokens"), "{summary}");
    let session_budget = text_of(&b, "tr[data-budget='default.session.tokens']").await;
    assert!(
        session_budget.contains("122 of 1,000 tokens")
            && session_budget.contains("12 %")
            && session_budget.contains("stop")
            && session_budget.contains("never"),
        "{session_budget}"
    );
    let month_budget = text_of(&b, "tr[data-budget='default.month.cost']").await;
    assert!(
        month_budget.contains("0.25 of 10 USD") && month_budget.contains("warn"),
        "{month_budget}"
    );
    let decisions: Value = b
        .execute(
            "return [...document.querySelectorAll('#spend-body tr.decision')].map((r) => \
             ({ automatic: r.dataset.automatic, option: r.querySelector('.decision-option').textContent, \
                who: r.querySelector('.decision-who').textContent, text: r.textContent }))",
            vec![],
        )
        .await
        .expect("decisions");
    let automatic = &decisions[0];
    assert_eq!(automatic["automatic"], "true", "{decisions}");
    assert_eq!(automatic["option"], "allow-once (allow_once)");
    assert!(
        automatic["who"]
            .as_str()
            .unwrap_or_default()
            .contains("automatically"),
        "{decisions}"
    );
    assert!(
        automatic["text"]
            .as_str()
            .unwrap_or_default()
            .contains("[read]")
    );
    let human = &decisions[1];
    assert_eq!(human["automatic"], "false", "{decisions}");
    assert_eq!(human["option"], "allow-once (allow_once)");
    assert_eq!(human["who"], "local (acpd-web)", "{decisions}");
    // Tall enough for the whole panel above the dock.
    viewport(&b, 1280, 1100).await;
    b.execute("window.scrollTo(0, 0)", vec![])
        .await
        .expect("scroll up");
    screenshot_here(&b, "session-spend").await;

    // The sessions page: today and this month, and one bar per day with data (today).
    b.goto(&format!("{base}/"))
        .await
        .expect("the sessions page");
    until(
        &b,
        "the spend overview",
        "return document.getElementById('spend').dataset.loaded === 'true'",
    )
    .await;
    for line in ["today", "month"] {
        let text = text_of(&b, &format!("[data-spend='{line}']")).await;
        assert!(
            text.contains("122 tokens")
                && text.contains("0.25 USD")
                && text.contains("3 turns")
                && text.contains("2 of 3 turns reported no usage"),
            "{line}: {text}"
        );
    }
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let bars = b
        .execute(
            "return [...document.querySelectorAll('svg.spend-chart rect.bar-tokens')].map((r) => [r.dataset.day, r.dataset.tokens])",
            vec![],
        )
        .await
        .expect("bars");
    assert_eq!(bars, json!([[today, "122"]]), "one bar per day with data");
    let cost_bars = b
        .execute(
            "return document.querySelectorAll('svg.spend-chart rect.bar-cost').length",
            vec![],
        )
        .await
        .expect("cost bars");
    assert_eq!(cost_bars, json!(1));
    screenshot(&b, "sessions-spend", 1280, 800).await;
    click(&b, "signout").await;

    assert_eq!(
        csp_violations(&d, &token).await,
        0,
        "CSP violations reported"
    );
    b.close().await.expect("close the browser");
}

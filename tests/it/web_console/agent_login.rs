//! An agent's login run from the web console (issue 43), in a real headless Chromium
//! (`browser.rs`'s harness): the sessions page offers the principal's own agents; the login
//! page runs the scripted login on the daemon's host over `/acp/login` with the console's
//! cookie, shows the URL it prints as a link, sends the typed line, delivers the sign-in's
//! loopback redirect through the link and shows success; a failing login and one ended with
//! the Ctrl-C button show failure; a device-code login shows its code and link, without the
//! terminal's escape sequences; another principal's agent shows the daemon's refusal.

use fantoccini::{Client as Browser, Locator};
use serde_json::json;

use super::browser::{Chromedriver, click, screenshot, until, viewport};
use super::support::{csp_violations, daemon_with_config, origin, sign_in_link};
use crate::support::scripted_agent_bin;

/// A device-code login: a bold prompt (escape sequences), a code, a URL; exits 0 on a line.
const DEVICE_LOGIN: &str = "printf '\\033[1mEnter the code\\033[0m WDJB-MJHT at https://device.example.test/activate\\n'; read x; echo done";

/// Waits until the login's screen shows `text`.
async fn until_screen_has(b: &Browser, text: &str) {
    let js = format!(
        "return document.getElementById('screen').textContent.includes({})",
        json!(text)
    );
    until(b, &format!("{text:?} on the login's screen"), &js).await;
}

/// Waits until the login ended `state` (`success` or `failure`); the outcome's text.
async fn until_outcome(b: &Browser, state: &str) -> String {
    let js = format!("return document.body.dataset.login === {}", json!(state));
    until(b, &format!("the login to end in {state}"), &js).await;
    b.find(Locator::Id("outcome"))
        .await
        .expect("the outcome")
        .text()
        .await
        .expect("its text")
}

/// Types a line into the login's input and sends it (Enter).
async fn type_line(b: &Browser, line: &str) {
    let input = b.find(Locator::Id("input")).await.expect("the input");
    input
        .send_keys(&format!("{line}\u{E007}"))
        .await
        .expect("type");
}

/// Starts (or starts again) the login on its page and waits for its question.
async fn start(b: &Browser) {
    until(
        b,
        "the start button",
        "return !document.getElementById('start').hidden",
    )
    .await;
    click(b, "start").await;
    until_screen_has(b, "Paste the code: ").await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn an_agents_login_runs_from_the_console_and_shows_its_url_and_outcome() {
    let dir = tempfile::tempdir().expect("config dir");
    let home = dir.path().join("home-lg");
    let agent = scripted_agent_bin();
    let config = dir.path().join("acpd.toml");
    std::fs::write(
        &config,
        format!(
            "[agents.lg]\ncommand = {agent:?}\nargs = [\"--need-login\"]\nhome = {:?}\n\
             [agents.theirs]\ncommand = {agent:?}\nargs = [\"--need-login\"]\nlogin_principals = [\"bob\"]\n\
             [agents.device]\ncommand = {agent:?}\nlogin = [\"sh\", \"-c\", {DEVICE_LOGIN:?}]\n",
            home.display().to_string()
        ),
    )
    .expect("config");
    let driver = Chromedriver::start().await;
    let (d, token) = daemon_with_config(&config).await;
    let b = driver.browser().await;
    let base = origin(&d);

    // Signed in, the sessions page offers the principal's own agent only.
    b.goto(&sign_in_link(&d, "local", "5m").await)
        .await
        .expect("sign in");
    until(
        &b,
        "the agent login section",
        "return !document.getElementById('agent-logins').hidden",
    )
    .await;
    let offered = b
        .execute(
            "return [...document.querySelectorAll('#agent-login-list li')].map((l) => l.dataset.agent)",
            vec![],
        )
        .await
        .expect("offered");
    let offered: Vec<String> = serde_json::from_value(offered).expect("names");
    assert!(offered.contains(&"lg".to_owned()), "{offered:?}");
    assert!(
        !offered.contains(&"theirs".to_owned()),
        "only the principal's own agents: {offered:?}"
    );
    b.find(Locator::Css("#agent-login-list li[data-agent='lg'] a"))
        .await
        .expect("the login link")
        .click()
        .await
        .expect("open the login page");
    until(
        &b,
        "the login page",
        "return location.pathname === '/agents/lg/login'",
    )
    .await;

    // The URL it prints is a link; the typed line reaches it; its loopback redirect, pasted,
    // is delivered through the link; it succeeds.
    start(&b).await;
    until(
        &b,
        "the sign-in URL as a link",
        "return !!document.querySelector('#urls a[href^=\"https://auth.example.test/authorize\"]')",
    )
    .await;
    let href = b
        .execute("return document.querySelector('#urls a').href", vec![])
        .await
        .expect("href");
    let href = href.as_str().expect("a string").to_owned();
    let port: u16 = href
        .split_once("localhost%3A")
        .and_then(|(_, rest)| rest.split('%').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no callback port in {href}"));
    type_line(&b, "c0de42").await;
    until_screen_has(&b, "waiting for the callback").await;
    until(
        &b,
        "the callback form",
        "return !document.getElementById('callback-form').hidden",
    )
    .await;
    viewport(&b, 1280, 800).await;
    screenshot(&b, "agent-login", 1280, 800).await;
    b.find(Locator::Id("callback-url"))
        .await
        .expect("the callback input")
        .send_keys(&format!("http://localhost:{port}/callback?code=c0de42"))
        .await
        .expect("paste");
    click(&b, "callback-send").await;
    let outcome = until_outcome(&b, "success").await;
    assert!(outcome.contains("Logged in"), "{outcome}");
    let screen = b
        .find(Locator::Id("screen"))
        .await
        .expect("screen")
        .text()
        .await
        .expect("text");
    assert!(
        screen.contains("c0de42") && screen.contains("logged in"),
        "{screen}"
    );
    assert!(
        !screen.contains('\u{1b}'),
        "no escape sequences: {screen:?}"
    );
    let credential = std::fs::read_to_string(home.join(".scripted-login")).expect("credential");
    assert_eq!(credential, "c0de42");

    // A refused code fails with its exit status; the Ctrl-C button ends a login.
    start(&b).await;
    type_line(&b, "fail").await;
    let outcome = until_outcome(&b, "failure").await;
    assert!(outcome.contains("exit status 3"), "{outcome}");
    start(&b).await;
    click(&b, "interrupt").await;
    let outcome = until_outcome(&b, "failure").await;
    assert!(outcome.contains("failed"), "{outcome}");

    // A device-code login: the code in large type, its URL a link, no escape sequences.
    b.goto(&format!("{base}/agents/device/login"))
        .await
        .expect("the device login page");
    until(
        &b,
        "the start button",
        "return !document.getElementById('start').hidden",
    )
    .await;
    click(&b, "start").await;
    until(
        &b,
        "the device code",
        "return !document.getElementById('device-code').hidden",
    )
    .await;
    assert_eq!(
        b.find(Locator::Id("code"))
            .await
            .expect("code")
            .text()
            .await
            .expect("text"),
        "WDJB-MJHT"
    );
    until(
        &b,
        "the activation link",
        "return !!document.querySelector('#urls a[href=\"https://device.example.test/activate\"]')",
    )
    .await;
    until_screen_has(&b, "Enter the code WDJB-MJHT at").await;
    type_line(&b, "").await;
    let outcome = until_outcome(&b, "success").await;
    assert!(outcome.contains("exited with status 0"), "{outcome}");

    // Another principal's agent: the daemon's refusal, and no way to start it.
    b.goto(&format!("{base}/agents/theirs/login"))
        .await
        .expect("their login page");
    until(
        &b,
        "the refusal",
        "return !document.getElementById('refusal').hidden",
    )
    .await;
    let refusal = b
        .find(Locator::Id("refusal"))
        .await
        .expect("refusal")
        .text()
        .await
        .expect("text");
    assert!(
        refusal.contains("may not log in agent \"theirs\""),
        "{refusal}"
    );
    let start_shown = b
        .execute("return !document.getElementById('start').hidden", vec![])
        .await
        .expect("start");
    assert_eq!(start_shown, json!(false));

    assert_eq!(
        csp_violations(&d, &token).await,
        0,
        "CSP violations reported"
    );
    b.close().await.expect("close the browser");
}

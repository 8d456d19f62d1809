//! The console in a real headless Chromium, driven over WebDriver (fantoccini): sign-in by a
//! one-time link, the sessions list, a live turn, a permission answered by a click, a prompt
//! typed in the page, cancel, the observer's page, another principal's session, and no CSP
//! violation. It takes the README's screenshots on the way (`screenshot`).
//!
//! One chromedriver for the module (started here on a free port, killed on drop) and one
//! browser session for the whole walk, so the run stays short.

use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::support::{csp_violations, origin, sign_in_link};
use crate::support::security_support::{bearer, client, local_token, token_create};
use crate::support::{Daemon, DaemonOptions};

pub(super) const WAIT: Duration = Duration::from_secs(15);

/// A chromedriver process of our own, on a free loopback port; killed when dropped.
pub(super) struct Chromedriver {
    _child: Child,
    url: String,
}

impl Chromedriver {
    pub(super) async fn start() -> Chromedriver {
        let path = std::env::var("ACPD_TEST_CHROMEDRIVER").expect("ACPD_TEST_CHROMEDRIVER");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not listen"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Chromedriver {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// WebDriver's "Set Permission" (the Permissions spec's extension, which chromedriver
    /// serves): the browser answers permission `name` as a user who chose `state` would.
    pub(super) async fn set_permission(&self, b: &Browser, name: &str, state: &str) {
        let session = b
            .session_id()
            .await
            .expect("the session id")
            .expect("a session");
        let addr = self.url.trim_start_matches("http://");
        let body = json!({ "descriptor": { "name": name }, "state": state }).to_string();
        // chromedriver keeps the connection open whatever the request says: the answer is
        // read by its Content-Length.
        let answer = async {
            use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let head = format!(
                "POST /session/{session}/permissions HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.expect("write");
            s.write_all(body.as_bytes()).await.expect("write");
            let mut r = tokio::io::BufReader::new(s);
            let (mut status, mut length) = (String::new(), 0usize);
            r.read_line(&mut status).await.expect("status line");
            loop {
                let mut line = String::new();
                r.read_line(&mut line).await.expect("header");
                if line.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().expect("a length");
                }
            }
            let mut text = vec![0; length];
            r.read_exact(&mut text).await.expect("body");
            (status, String::from_utf8_lossy(&text).into_owned())
        };
        let (status, text) = tokio::time::timeout(WAIT, answer)
            .await
            .expect("chromedriver answers");
        assert!(
            status.contains(" 200 "),
            "set permission {name}: {status} {text}"
        );
    }

    pub(super) async fn browser(&self) -> Browser {
        let mut chrome = json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,800", "--hide-scrollbars"],
        });
        if let Ok(bin) = std::env::var("ACPD_TEST_CHROMIUM") {
            chrome["binary"] = json!(bin);
        }
        // chromedriver is plain HTTP, but fantoccini's connector wants a process-wide
        // provider; another test may have installed it already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), chrome);
        let connect = ClientBuilder::rustls()
            .expect("rustls connector")
            .capabilities(caps)
            .connect(&self.url)
            .await;
        connect.expect("a browser session")
    }
}

/// Polls a JavaScript condition (a function body returning a boolean) until it holds. A
/// condition that throws counts as not yet: right after a navigation the page that has its
/// elements may still be loading (seen: `getElementById` null after a sign-in redirect).
pub(super) async fn until(b: &Browser, what: &str, js: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = b.execute(js, vec![]).await;
        if matches!(&v, Ok(Value::Bool(true))) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let text = b
                .execute("return document.body.innerText", vec![])
                .await
                .unwrap_or_default();
            panic!("timed out waiting for {what} (last: {v:?}); the page says:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the conversation shows `text`.
pub(super) async fn until_log_has(b: &Browser, text: &str) {
    let js = format!(
        "return document.getElementById('log').innerText.includes({})",
        json!(text)
    );
    until(b, &format!("{text:?} in the conversation"), &js).await;
}

/// A screenshot of the viewport at `width`×`height` CSS pixels, scrolled to the newest
/// content, into target/screenshots/NAME.png, or into docs/screenshots/ (the README's) with
/// `ACPD_TEST_SCREENSHOTS=docs`: a plain test run leaves the work tree as it was.
pub(super) async fn screenshot(b: &Browser, name: &str, width: u32, height: u32) {
    viewport(b, width, height).await;
    b.execute("window.scrollTo(0, document.body.scrollHeight)", vec![])
        .await
        .expect("scroll");
    screenshot_here(b, name).await;
}

/// A screenshot of the viewport as it is scrolled now (see `screenshot`).
pub(super) async fn screenshot_here(b: &Browser, name: &str) {
    // Layout settles after the resize (a media query may apply).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let png = b.screenshot().await.expect("screenshot");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = match std::env::var("ACPD_TEST_SCREENSHOTS").as_deref() {
        Ok("docs") => root.join("docs/screenshots"),
        _ => root.join("target/screenshots"),
    };
    std::fs::create_dir_all(&dir).expect("the screenshots' folder");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
}

/// Clicks the element with that id.
pub(super) async fn click(b: &Browser, id: &str) {
    b.find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("#{id}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click #{id}: {e}"));
}

/// Answers the waiting permission with `option` (its button's `data-option`).
pub(super) async fn choose(b: &Browser, option: &str) {
    b.find(Locator::Css(&format!(
        ".permission button[data-option='{option}']"
    )))
    .await
    .unwrap_or_else(|e| panic!("the {option} button: {e}"))
    .click()
    .await
    .unwrap_or_else(|e| panic!("click {option}: {e}"));
}

/// Sizes the window so that the viewport (not the window) is `width`×`height`.
pub(super) async fn viewport(b: &Browser, width: u32, height: u32) {
    b.set_window_size(width, height).await.expect("resize");
    let inner = b
        .execute("return [window.innerWidth, window.innerHeight]", vec![])
        .await
        .expect("viewport");
    let (w, h) = (
        inner[0].as_u64().unwrap_or(0),
        inner[1].as_u64().unwrap_or(0),
    );
    let (dw, dh) = (
        u64::from(width).saturating_sub(w),
        u64::from(height).saturating_sub(h),
    );
    if dw > 0 || dh > 0 {
        b.set_window_size(width + dw as u32, height + dh as u32)
            .await
            .expect("resize");
    }
}

pub(super) async fn displayed(b: &Browser, css: &str) -> bool {
    match b.find(Locator::Css(css)).await {
        Ok(e) => e.is_displayed().await.unwrap_or(false),
        Err(_) => false,
    }
}

/// Types `text` into the prompt box as a person would (each line break as Shift+Enter, since
/// Enter sends) and clicks Send.
pub(super) async fn type_prompt(b: &Browser, text: &str) {
    let input = b.find(Locator::Id("prompt")).await.expect("the prompt box");
    // WebDriver keys: Shift (held), Enter, then Null to release the modifiers.
    let keys = text.replace('\n', "\u{E008}\u{E007}\u{E000}");
    input.send_keys(&keys).await.expect("type");
    click(b, "send").await;
}

pub(super) async fn until_turn(b: &Browser, state: &str) {
    let js = format!(
        "return document.getElementById('turn').dataset.state === {}",
        json!(state)
    );
    until(b, &format!("the turn to end {state}"), &js).await;
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn the_console_in_a_real_browser() {
    let driver = Chromedriver::start().await;
    let d = Daemon::start_with(DaemonOptions::default().auth()).await;
    let token = local_token(&d).await;
    let (k, v) = bearer(&token);

    // An editor's session, with a title and a first turn.
    let mut editor = client(&d.ws_url(), &[(k, &v)], None).await;
    editor
        .editor
        .hold
        .insert("session/request_permission".into());
    let sid = editor.open_session(&d.work_dir()).await;
    let (_, r) = editor
        .prompt(&sid, "title Fix the parser\necho **hello** from the editor")
        .await;
    assert_eq!(r.expect("first turn")["stopReason"], "end_turn");
    let other = editor.open_session(&d.work_dir()).await;
    let (_, r) = editor
        .prompt(
            &other,
            "title Write the release notes\nstream 450 8\necho done",
        )
        .await;
    assert_eq!(r.expect("a second session")["stopReason"], "end_turn");
    // Another principal's session.
    let bob_secret = token_create(&d, "bob").await;
    let (bk, bv) = bearer(&bob_secret);
    let mut bob = client(&d.ws_url(), &[(bk, &bv)], None).await;
    let bobs = bob.new_session(&d.work_dir()).await;

    let b = driver.browser().await;
    let base = origin(&d);

    // Sign in with a one-time link; it lands on the sessions list.
    let link = sign_in_link(&d, "local", "5m").await;
    b.goto(&link).await.expect("open the link");
    until(
        &b,
        "the editor's session in the list",
        &format!(
            "return !!document.querySelector('tr[data-session={}]')",
            json!(sid)
        ),
    )
    .await;
    let url = b.current_url().await.expect("url");
    assert_eq!(
        url.as_str(),
        format!("{base}/"),
        "no code left in the address"
    );
    let row = b
        .find(Locator::Css(&format!("tr[data-session='{sid}']")))
        .await
        .expect("row")
        .text()
        .await
        .expect("row text");
    assert!(
        row.contains("Fix the parser") && row.contains("scripted"),
        "{row}"
    );
    assert!(row.contains("controller"), "who is attached: {row}");
    screenshot(&b, "sessions-desktop", 1280, 800).await;
    screenshot(&b, "sessions-phone", 390, 844).await;
    viewport(&b, 1280, 800).await;

    // The link is used up: a second use (a browser without the cookie) is refused clearly.
    b.delete_all_cookies().await.expect("forget the cookie");
    b.goto(&link).await.expect("open the link again");
    until(
        &b,
        "the refusal of a used link",
        "return document.getElementById('message').innerText.includes('already used')",
    )
    .await;
    b.goto(&sign_in_link(&d, "local", "5m").await)
        .await
        .expect("a fresh link");
    until(&b, "the sessions page", "return location.pathname === '/'").await;

    // The observer's page: the history, then a live turn; no controls.
    b.goto(&format!("{base}/s/{sid}"))
        .await
        .expect("session page");
    until(
        &b,
        "attached",
        "return document.body.dataset.role === 'observer'",
    )
    .await;
    until_log_has(&b, "hello from the editor").await;
    let html: String = b
        .find(Locator::Id("log"))
        .await
        .expect("log")
        .html(true)
        .await
        .expect("html");
    assert!(
        html.contains("<strong>hello</strong>"),
        "Markdown rendered: {html}"
    );
    for control in ["#composer", "#cancel", "#prompt", ".permission button"] {
        assert!(
            !displayed(&b, control).await,
            "an observer sees no {control}"
        );
    }
    let (_, r) = editor
        .prompt(
            &sid,
            "thought thinking it over\ntool\nlocate /work/src/parser.rs\necho streamed live",
        )
        .await;
    assert_eq!(r.expect("live turn")["stopReason"], "end_turn");
    until_log_has(&b, "streamed live").await;
    until(
        &b,
        "the thought and the tool call",
        "return !!document.querySelector('.block-thought details') && !!document.querySelector('.block-tool .status-completed')",
    )
    .await;

    // The controller's page: a prompt typed in it runs, a permission is answered by a click.
    b.goto(&format!("{base}/s/{sid}?role=controller"))
        .await
        .expect("take control");
    until(
        &b,
        "control",
        "return document.body.dataset.role === 'controller'",
    )
    .await;
    assert!(displayed(&b, "#composer").await);
    type_prompt(&b, "echo typed in the page").await;
    until_turn(&b, "end_turn").await;
    until_log_has(&b, "typed in the page").await;

    type_prompt(
        &b,
        "locate /work/src/parser.rs\npermission /work/src/parser.rs",
    )
    .await;
    until(
        &b,
        "the permission's buttons",
        "return !!document.querySelector('.permission button[data-option=\"allow-always\"]')",
    )
    .await;
    until(
        &b,
        "the edit's diff",
        "return !!document.querySelector('.block-tool .diff .ins')",
    )
    .await;
    screenshot(&b, "session-desktop", 1280, 800).await;
    screenshot(&b, "session-phone", 390, 844).await;
    viewport(&b, 1280, 800).await;
    choose(&b, "allow-always").await;
    until_turn(&b, "end_turn").await;
    until_log_has(&b, "permission: selected allow-always").await;
    // The agent got the page's answer, and the other controller saw it.
    editor
        .updates_until_text("permission: selected allow-always")
        .await;

    // Mode and config option switches reach the agent (its updates come back to every client).
    b.find(Locator::Id("mode"))
        .await
        .expect("the mode select")
        .select_by_value("plan")
        .await
        .expect("pick a mode");
    until_log_has(&b, "mode: plan").await;
    b.find(Locator::Css("select[data-config='verbosity']"))
        .await
        .expect("the verbosity select")
        .select_by_value("high")
        .await
        .expect("pick a value");
    editor
        .collect_updates_until("the verbosity change", |updates| {
            updates.iter().any(|u| {
                u["update"]["sessionUpdate"] == "config_option_update"
                    && u["update"]["configOptions"][0]["currentValue"] == "high"
            })
        })
        .await;

    // Cancel from the page ends the running turn cancelled.
    type_prompt(&b, "wait_for_cancel").await;
    until(
        &b,
        "the turn running",
        "return document.getElementById('turn').dataset.state === 'running' && !document.getElementById('cancel').disabled",
    )
    .await;
    click(&b, "cancel").await;
    until_turn(&b, "cancelled").await;
    // So is another client's turn, cancelled from the page.
    let id = editor.send_prompt(&sid, "wait_for_cancel").await;
    // The editor's prompt in the conversation, not only a running turn: the status poll can
    // show the page's own cancelled turn as still running (its agent's late answer), and a
    // cancel sent then would end that turn and miss the editor's (seen once under load).
    until(
        &b,
        "the editor's turn to show as running",
        "return document.getElementById('log').innerText.split('wait_for_cancel').length > 2 \
           && !document.getElementById('cancel').disabled",
    )
    .await;
    click(&b, "cancel").await;
    let (_, r) = editor.collect_updates_until_response(&id).await;
    assert_eq!(r.expect("the editor's turn")["stopReason"], "cancelled");

    // A long session opens at its end and pages back on demand.
    b.goto(&format!("{base}/s/{other}"))
        .await
        .expect("the long session");
    until_log_has(&b, "done").await;
    let oldest = "return Number(document.querySelector('#log .block').dataset.seq)";
    let before = b.execute(oldest, vec![]).await.expect("seq").as_i64();
    assert!(before > Some(1), "not the whole journal: {before:?}");
    until(
        &b,
        "the older button",
        "return !document.getElementById('older').hidden",
    )
    .await;
    click(&b, "older").await;
    until(
        &b,
        "older entries",
        &format!("{oldest} < {}", before.unwrap_or(0)),
    )
    .await;

    // Another principal's session is not reachable by URL.
    b.goto(&format!("{base}/s/{bobs}"))
        .await
        .expect("bob's session");
    until(
        &b,
        "the not-found page",
        "return !!document.getElementById('not-found')",
    )
    .await;
    let _ = bob.close().await;

    assert_eq!(
        csp_violations(&d, &token).await,
        0,
        "CSP violations reported"
    );
    b.close().await.expect("close the browser");
}

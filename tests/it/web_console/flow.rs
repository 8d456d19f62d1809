//! The console as a person uses it, in a real headless Chromium (`browser.rs`'s harness): the
//! page follows the stream (a permission in the dock does not stop it) unless the user
//! scrolled up, where "Jump to latest" brings it back; a cancelled or failed turn is marked
//! in the conversation (the built-in agent's missing model with its reason); a session is
//! started from the sessions page; a waiting permission counts in the tab's title, and its
//! answer is confirmed on the page that gave it and on the others.

use fantoccini::{Client as Browser, Locator};
use serde_json::json;
use tokio::io::BufReader;

use super::browser::{
    Chromedriver, choose, click, displayed, screenshot, type_prompt, until, until_log_has,
    until_turn, viewport,
};
use super::support::csp_violations;
use crate::logging::{sigterm, spawn_piped, until_listening};
use crate::support::http::request_path;
use crate::support::{Client, Daemon};

/// Whether the conversation's last piece is in view, above the dock (permissions, composer).
const END_IN_VIEW: &str = "const last = document.getElementById('log').lastElementChild; \
     const dock = document.querySelector('.dock').getBoundingClientRect(); \
     if (!last) return false; const r = last.getBoundingClientRect(); \
     return r.bottom <= dock.top + 1 && r.bottom > 0;";

/// The text of the conversation's markers, in order.
async fn markers(b: &Browser) -> Vec<String> {
    let v = b
        .execute(
            "return [...document.querySelectorAll('#log .marker')].map((m) => m.textContent)",
            vec![],
        )
        .await
        .expect("markers");
    serde_json::from_value(v).expect("a list of strings")
}

/// Waits until a marker containing `text` is the conversation's last piece.
async fn until_last_marker(b: &Browser, text: &str) {
    let js = format!(
        "const last = document.getElementById('log').lastElementChild; \
         return !!last && last.classList.contains('marker') && last.textContent.includes({})",
        json!(text)
    );
    until(
        b,
        &format!("a marker {text:?} at the conversation's end"),
        &js,
    )
    .await;
}

/// Opens `sid`'s page as its controller.
async fn control(b: &Browser, base: &str, sid: &str) {
    b.goto(&format!("{base}/s/{sid}?role=controller"))
        .await
        .expect("the session's page");
    until(
        b,
        "control",
        "return document.body.dataset.role === 'controller'",
    )
    .await;
}

/// A session of the scripted agent with a few turns of history, the page opened on it.
async fn session_with_history(d: &Daemon, b: &Browser) -> (Client, String) {
    let mut editor = d.client().await;
    let sid = editor.open_session(&d.work_dir()).await;
    for n in 0..3 {
        let script =
            format!("echo turn {n} begins\ntool\necho a tool ran\ntool\necho turn {n} ends");
        let (_, r) = editor.prompt(&sid, &script).await;
        assert_eq!(r.expect("a turn of history")["stopReason"], "end_turn");
    }
    control(b, &format!("http://{}", d.addr), &sid).await;
    until_log_has(b, "turn 2 ends").await;
    (editor, sid)
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn the_console_follows_the_stream_through_a_permission_and_jumps_to_latest() {
    let driver = Chromedriver::start().await;
    let d = Daemon::start().await;
    let b = driver.browser().await;
    viewport(&b, 900, 600).await;
    let (mut editor, sid) = session_with_history(&d, &b).await;
    until(&b, "the page at the conversation's end", END_IN_VIEW).await;

    // A permission arrives in the dock, which grows over the end of the conversation: the
    // page keeps the end (the tool call asked about) in view.
    type_prompt(&b, "ask_tool").await;
    until(
        &b,
        "the permission's buttons",
        "return !!document.querySelector('.permission button[data-option=\"allow-once\"]')",
    )
    .await;
    until(
        &b,
        "the tool call asked about, in the conversation",
        "return !!document.querySelector('#log .block-tool .status-pending')",
    )
    .await;
    until(
        &b,
        "the tool call in view above the permission",
        END_IN_VIEW,
    )
    .await;
    choose(&b, "allow-once").await;
    until_turn(&b, "end_turn").await;

    // Later output, and the user's own next prompt, still come into view.
    type_prompt(&b, "echo after the permission\necho and a second line").await;
    until_turn(&b, "end_turn").await;
    until_log_has(&b, "and a second line").await;
    until(&b, "the answer in view", END_IN_VIEW).await;
    assert!(!displayed(&b, "#jump").await, "no jump button at the end");

    // Scrolled up, the page stays where the user is while output arrives, and offers the jump.
    b.execute("window.scrollTo(0, 0)", vec![])
        .await
        .expect("scroll up");
    until(
        &b,
        "the jump button",
        "return !document.getElementById('jump').hidden",
    )
    .await;
    let (_, r) = editor
        .prompt(&sid, "echo from the editor while you read")
        .await;
    assert_eq!(r.expect("the editor's turn")["stopReason"], "end_turn");
    until_log_has(&b, "from the editor while you read").await;
    let y = b
        .execute("return window.scrollY", vec![])
        .await
        .expect("scrollY");
    assert_eq!(y.as_f64(), Some(0.0), "the page stayed where the user was");
    assert!(displayed(&b, "#jump").await, "Jump to latest is offered");
    click(&b, "jump").await;
    until(&b, "the end in view after the jump", END_IN_VIEW).await;
    until(
        &b,
        "the jump button gone",
        "return document.getElementById('jump').hidden",
    )
    .await;
    assert_eq!(csp_violations(&d, "-").await, 0, "CSP violations reported");
    b.close().await.expect("close the browser");
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn the_console_marks_cancelled_and_failed_turns_and_keeps_a_prompts_lines() {
    let driver = Chromedriver::start().await;
    let d = Daemon::start().await;
    let b = driver.browser().await;
    let (_editor, _sid) = session_with_history(&d, &b).await;
    assert!(markers(&b).await.is_empty(), "{:?}", markers(&b).await);

    // A prompt of two lines shows as two lines.
    type_prompt(&b, "echo first line\necho second line").await;
    until_turn(&b, "end_turn").await;
    until(
        &b,
        "the prompt with its line break",
        "const users = document.querySelectorAll('#log .block-user'); \
         return users.length > 0 && users[users.length - 1].innerText.trim() === 'echo first line\\necho second line'",
    )
    .await;
    assert!(markers(&b).await.is_empty(), "a normal end has no marker");

    // Cancel: marked where the turn ended, after the prompt.
    type_prompt(&b, "wait_for_cancel").await;
    until(
        &b,
        "the turn running",
        "return document.getElementById('turn').dataset.state === 'running' && !document.getElementById('cancel').disabled",
    )
    .await;
    click(&b, "cancel").await;
    until_turn(&b, "cancelled").await;
    until_last_marker(&b, "Turn cancelled").await;
    let before = b
        .execute(
            "return document.getElementById('log').lastElementChild.previousElementSibling.innerText",
            vec![],
        )
        .await
        .expect("the block before the marker");
    assert_eq!(before.as_str().map(str::trim), Some("wait_for_cancel"));

    // A failed turn: marked with the agent's reason.
    type_prompt(&b, "echo trying\nerror -32603 the disk is full").await;
    until_turn(&b, "error").await;
    until_last_marker(&b, "Turn failed").await;
    let all = markers(&b).await;
    assert!(
        all.last().is_some_and(|m| m.contains("the disk is full")),
        "{all:?}"
    );
    assert_eq!(all.len(), 2, "{all:?}");
    screenshot(&b, "session-markers", 1280, 800).await;
    b.close().await.expect("close the browser");
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn a_session_starts_from_the_console_and_the_builtin_agent_says_why_it_cannot_answer() {
    let driver = Chromedriver::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // The sessions' directory: beside the data directory, never around it.
    let work = tempfile::tempdir().expect("temp dir");
    let work_dir = work.path().display().to_string();
    // The built-in agent by default, no model key in the environment; the scripted one too.
    let mut child = spawn_piped(
        dir.path(),
        &["--no-auth", "--default-agent", "builtin"],
        &[],
    );
    let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (addr, _) = until_listening(&mut stderr).await;
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
    });
    let base = format!("http://{addr}");
    let b = driver.browser().await;

    // The scripted agent, in a directory typed in.
    b.goto(&format!("{base}/"))
        .await
        .expect("the sessions page");
    until(
        &b,
        "the list",
        "return document.getElementById('status').textContent === 'No sessions yet.'",
    )
    .await;
    click(&b, "new").await;
    until(
        &b,
        "the agent profiles",
        "return document.querySelectorAll('#new-agent option').length === 2",
    )
    .await;
    let default = b
        .execute("return document.getElementById('new-agent').value", vec![])
        .await
        .expect("the default agent");
    assert_eq!(default, json!("builtin"), "the default profile is chosen");
    b.find(Locator::Id("new-agent"))
        .await
        .expect("the agent select")
        .select_by_value("scripted")
        .await
        .expect("pick the scripted agent");
    b.find(Locator::Id("new-cwd"))
        .await
        .expect("the directory")
        .send_keys(&work_dir)
        .await
        .expect("type the directory");
    screenshot(&b, "sessions-new", 1280, 800).await;
    click(&b, "new-create").await;
    until(
        &b,
        "the new session's page, as its controller",
        "return location.pathname.startsWith('/s/') && document.body.dataset.role === 'controller'",
    )
    .await;
    let meta = b
        .execute("return document.getElementById('meta').textContent", vec![])
        .await
        .expect("meta");
    assert_eq!(meta, json!(format!("scripted · {work_dir}")));
    type_prompt(&b, "echo hello from a new session").await;
    until_turn(&b, "end_turn").await;
    until_log_has(&b, "hello from a new session").await;
    let first = b.current_url().await.expect("url");

    // The built-in agent without a model: the session starts; its turn fails, and says why.
    b.goto(&format!("{base}/"))
        .await
        .expect("the sessions page");
    until(
        &b,
        "the first session listed",
        "return document.querySelectorAll('#sessions tbody tr').length === 1",
    )
    .await;
    click(&b, "new").await;
    until(
        &b,
        "the form filled in",
        &format!(
            "return document.getElementById('new-agent').value === 'builtin' && document.getElementById('new-cwd').value === {}",
            json!(work_dir)
        ),
    )
    .await;
    click(&b, "new-create").await;
    until(
        &b,
        "the second session's page",
        &format!(
            "return location.pathname.startsWith('/s/') && location.href !== {} && document.body.dataset.role === 'controller'",
            json!(first.as_str())
        ),
    )
    .await;
    // The built-in agent offers its mode both as session modes and as a config option: one
    // control.
    let modes = b
        .execute(
            "return [...document.querySelectorAll('select')].filter((s) => s.offsetParent !== null \
             && [...s.options].some((o) => o.value === 'plan')).map((s) => s.getAttribute('aria-label'))",
            vec![],
        )
        .await
        .expect("the mode controls");
    assert_eq!(modes, json!(["Mode"]), "one mode control");
    type_prompt(&b, "hello").await;
    until_turn(&b, "error").await;
    until_last_marker(&b, "Turn failed").await;
    let all = markers(&b).await;
    assert!(
        all.last().is_some_and(
            |m| m.contains("no model is configured for the built-in agent")
                && m.contains("ANTHROPIC_API_KEY")
        ),
        "the reason, not only \"Authentication required\": {all:?}"
    );
    until_log_has(&b, "hello").await;

    // Both are in the store, with the agent and directory chosen.
    let listed = request_path(addr, "GET", "/web/api/sessions", &[], "")
        .await
        .json();
    let mut made: Vec<(String, String)> = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| (s["agent"].to_string(), s["cwd"].to_string()))
        .collect();
    made.sort();
    let cwd = json!(work_dir).to_string();
    assert_eq!(
        made,
        [
            ("\"builtin\"".to_string(), cwd.clone()),
            ("\"scripted\"".to_string(), cwd)
        ],
        "{listed}"
    );
    b.close().await.expect("close the browser");
    let status = sigterm(&mut child).await;
    assert!(status.success(), "acpd exited with {status}");
}

#[tokio::test]
#[cfg_attr(
    not(acpd_browser),
    ignore = "set ACPD_TEST_CHROMEDRIVER to a chromedriver (Debian: chromium-driver)"
)]
async fn a_waiting_approval_badges_the_title_and_its_answer_is_confirmed() {
    let driver = Chromedriver::start().await;
    let d = Daemon::start().await;
    let b = driver.browser().await;
    let (mut editor, sid) = session_with_history(&d, &b).await;
    let title = b.title().await.expect("title");
    assert!(title.starts_with("acpd · "), "{title}");

    // The page's own turn asks: "(1)" in the title until the page answers.
    type_prompt(&b, "permission /work/src/a.rs").await;
    until(
        &b,
        "the badge in the title",
        "return document.title.startsWith('(1) acpd · ')",
    )
    .await;
    choose(&b, "allow-always").await;
    until(
        &b,
        "the badge gone",
        "return document.title.startsWith('acpd · ')",
    )
    .await;
    until_turn(&b, "end_turn").await;
    until_log_has(&b, "permission: selected allow-always").await;
    let all = markers(&b).await;
    assert!(
        all.iter()
            .any(|m| m.contains("you (local) chose Allow always")),
        "the answer confirmed in the conversation: {all:?}"
    );

    // Another client's turn asks it, and answers: the page says who chose what.
    let (_, r) = editor.prompt(&sid, "permission /work/src/b.rs").await;
    assert_eq!(r.expect("the editor's turn")["stopReason"], "end_turn");
    until(
        &b,
        "the other client's answer in the conversation",
        "return [...document.querySelectorAll('#log .marker')].some((m) => m.textContent.startsWith('Permission answered by local') && m.textContent.endsWith(': allow-once'))",
    )
    .await;
    until(
        &b,
        "no badge once it is answered",
        "return document.title.startsWith('acpd · ') && !document.querySelector('.permission button')",
    )
    .await;

    // Notifications allowed, the page in a background tab: the request notifies.
    driver.set_permission(&b, "notifications", "granted").await;
    until(
        &b,
        "notifications allowed",
        "return Notification.permission === 'granted'",
    )
    .await;
    editor.editor.hold("session/request_permission");
    type_prompt(&b, "sleep 3000\nask_tool").await;
    let page = b.window().await.expect("the page's tab");
    let other = b.new_window(true).await.expect("another tab");
    b.switch_to_window(other.handle)
        .await
        .expect("look at the other tab");
    // The editor is asked at the same time as the page.
    editor.wait_held_request("session/request_permission").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    b.switch_to_window(page).await.expect("back to the page");
    until(
        &b,
        "the badge, and one notification shown while the page was not looked at",
        "return document.title.startsWith('(1) acpd · ') && document.body.dataset.notified === '1'",
    )
    .await;
    choose(&b, "allow-once").await;
    until_turn(&b, "end_turn").await;
    // No token under --no-auth: /metrics takes any.
    assert_eq!(csp_violations(&d, "-").await, 0, "CSP violations reported");
    b.close().await.expect("close the browser");
}

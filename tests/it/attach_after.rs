//! `_acpd/session/attach` with an `afterSeq` beyond the journal's end is an error carrying
//! the journal's end (`data.lastSeq`), not a silent empty replay after which the client
//! would miss every update up to its number; acp-shim, refused so after a daemon restart,
//! attaches again from that end and the editor gets what comes next.

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::shim_support::{self, Shim, prompt};
use crate::support::{Daemon, seq, session_update_params};

#[tokio::test]
async fn attach_beyond_the_journal_end_is_an_error_with_the_end() {
    let daemon = Daemon::start().await;
    let mut a = daemon.client().await;
    let sid = a.open_session(&daemon.work_dir()).await;
    let (updates, r) = a.prompt(&sid, "echo one\necho two").await;
    r.expect("prompt");
    let last = updates.iter().map(seq).max().expect("updates");

    let mut b = daemon.client().await;
    let e = b
        .request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": last + 1000 }),
        )
        .await
        .expect_err("beyond the end");
    assert_eq!(e.code, -32602, "{e:?}");
    assert_eq!(e.data, Some(json!({ "lastSeq": last })), "{e:?}");
    assert!(e.message.contains("beyond"), "{e:?}");
    // From the end it gives, the attach works and later updates arrive.
    let r = b
        .request(
            "_acpd/session/attach",
            json!({ "sessionId": sid, "afterSeq": last }),
        )
        .await
        .expect("attach at the end");
    assert_eq!(r["lastSeq"], last);
    let id = a.send_prompt(&sid, "echo three").await;
    let ups = b.updates_until_text("three").await;
    assert!(ups.iter().all(|u| seq(u) > last), "{ups:?}");
    a.wait_response(&id).await.expect("prompt");
}

/// Cuts the journal of `sid` back to its first `keep` entries in the (stopped) daemon's
/// SQLite store, as a restore from an older backup would.
async fn truncate_journal(db: &std::path::Path, sid: &str, keep: i64) -> Result<()> {
    let url = format!("sqlite://{}", db.display());
    // Through the store, which splits a row holding entries on both sides of the cut.
    let store = acpd_store::Store::open(&url, acpd::store_options()).await?;
    store
        .replace_journal_range(sid, keep + 1, i64::MAX, &[])
        .await?;
    store.close().await;
    let pool = sqlx::SqlitePool::connect(&url).await?;
    sqlx::query("UPDATE sessions SET last_seq = ? WHERE id = ?")
        .bind(keep)
        .bind(sid)
        .execute(&pool)
        .await?;
    pool.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_attaches_again_from_the_journal_end_after_a_restart() -> Result<()> {
    let d = shim_support::Daemon::start(false).await?;
    let port = d.port;
    let mut shim = Shim::spawn(&d.url(), &[], d.dir.path())?;
    let sid = shim.open_session().await?;
    let id = shim
        .request(
            "session/prompt",
            prompt(&sid, "echo a\necho b\necho c\necho d"),
        )
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let seen: Vec<i64> = msgs
        .iter()
        .filter_map(session_update_params)
        .map(seq)
        .collect();
    assert!(seen.len() >= 4, "{msgs:?}");

    let dir = d.kill().await;
    truncate_journal(&dir.path().join("acpd.db"), &sid, 1).await?;
    let d2 = shim_support::Daemon::start_in(dir.clone(), port, false).await?;
    shim.wait_stderr("attaching from its end").await?;
    // The session goes on, and the editor gets its new updates.
    let id = shim
        .request("session/prompt", prompt(&sid, "echo after"))
        .await?;
    let (done, msgs) = shim.until_response(id).await?;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let texts: Vec<&Value> = msgs
        .iter()
        .filter_map(session_update_params)
        .map(|p| &p["update"]["content"]["text"])
        .collect();
    assert!(texts.contains(&&json!("after")), "{msgs:?}\n{}", d2.log());
    let log = shim.stderr();
    assert!(log.contains("beyond the session's last seq"), "{log}");
    shim.close_stdin();
    shim.wait_exit().await.context("shim exit")?;
    Ok(())
}

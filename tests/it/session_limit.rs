//! The per-principal live-session limit is reserved atomically: many `session/new` at once
//! from one principal, over many connections, never get past it together.

use std::time::Duration;

use serde_json::json;

use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn concurrent_session_news_get_exactly_the_limit() {
    const LIMIT: usize = 100;
    const CONNS: usize = 8;
    const EACH: usize = 75; // 600 in all
    let daemon = Daemon::start_with(
        DaemonOptions::default()
            .arg("--max-sessions-per-principal", LIMIT)
            .arg("--max-requests-per-second", 1000),
    )
    .await;
    let mut clients = Vec::new();
    for _ in 0..CONNS {
        let c = daemon.client().await.with_timeout(Duration::from_secs(60));
        clients.push(c);
    }
    let work = daemon.work_dir();
    let runs = clients.into_iter().map(|mut c| {
        let work = work.clone();
        async move {
            // All sent before any answer is read: they are in flight together.
            let mut ids = Vec::new();
            for _ in 0..EACH {
                ids.push(
                    c.send_request("session/new", json!({ "cwd": work, "mcpServers": [] }))
                        .await,
                );
            }
            let mut results = Vec::new();
            for id in ids {
                results.push(c.wait_response(&id).await);
            }
            results
        }
    });
    let mut ok = 0;
    let mut refused = 0;
    for run in futures_util::future::join_all(runs).await {
        for r in run {
            match r {
                Ok(v) => {
                    assert!(v["sessionId"].is_string(), "{v}");
                    ok += 1;
                }
                Err(e) => {
                    assert!(e.message.contains("too many live sessions"), "{e:?}");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(ok, LIMIT, "{ok} succeeded, {refused} refused");
    assert_eq!(refused, CONNS * EACH - LIMIT);
}

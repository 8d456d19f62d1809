//! Flow on Streamable HTTP streams (issue 16): keep-alive comments on idle streams, a reader
//! that is gone is noticed, and a reader that stops reading lags like a slow WebSocket client
//! (fed from the journal once it reads again) without slowing anyone else.

use std::time::Duration;

use serde_json::json;

use crate::streamable_http::{SSE, open, rpc};
use crate::streamable_http_resume::{assert_exactly_once, chunks, prompt, session, until};
use crate::support::http::{Sse, post};
use crate::support::{Daemon, DaemonOptions};

#[tokio::test]
async fn idle_streams_get_keep_alives_and_a_gone_reader_is_dropped() {
    let opts = DaemonOptions::default()
        .arg("--keepalive-ms", 100)
        .arg("--resume-grace-secs", 1);
    let daemon = Daemon::start_with(opts).await;
    let addr = daemon.addr;
    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    let mut stream = Sse::open(addr, &[c, SSE]).await;
    stream.keepalive().await;
    stream.keepalive().await;
    // The reader goes. Had acpd not noticed, the connection would count as attached and
    // live on; noticed, it has no stream and ends after the grace.
    drop(stream);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = post(addr, &[c], &rpc(2, "session/list", json!({}))).await;
    assert_eq!(r.status, 404, "{r:?}");
}

#[tokio::test]
async fn a_slow_sse_reader_catches_up_from_the_journal_and_slows_no_one_else() {
    const N: usize = 30_000;
    let opts = DaemonOptions::default().arg("--slow-client-cutoff-ms", 600_000);
    let daemon = Daemon::start_with(opts).await;
    let addr = daemon.addr;
    let (conn, sid, _main) = session(&daemon).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    // ~32 MiB: more than the connection holds and the socket buffers, and nobody reads.
    let mut slow = Sse::open_small(addr, &[c, SSE, s]).await;
    prompt(addr, &conn, &sid, 3, &format!("stream {N} 1024")).await;
    daemon.until_lagging().await;

    // Another client, another session, on its own connection: streams as usual.
    let (conn2, sid2, _main2) = session(&daemon).await;
    let c2 = ("acp-connection-id", conn2.as_str());
    let s2 = ("acp-session-id", sid2.as_str());
    let mut other = Sse::open(addr, &[c2, SSE, s2]).await;
    prompt(addr, &conn2, &sid2, 3, "stream 500 32").await;
    let events = until(&mut other, None, Some(3)).await;
    assert_exactly_once(&chunks(&events), 500);
    assert_eq!(
        events.last().unwrap().data["result"]["stopReason"],
        "end_turn"
    );

    // The slow reader reads again: every update once, in order, then the answer.
    let events = until(&mut slow, None, Some(3)).await;
    assert_exactly_once(&chunks(&events), N);
    assert_eq!(
        events.last().unwrap().data["result"]["stopReason"],
        "end_turn"
    );
}

//! Resumable session streams over Streamable HTTP (issue 16): each event on a session's SSE
//! stream has the journal seq as its `id:`, and a GET with `Last-Event-ID` gets exactly what
//! came after it: on the same connection from what it holds, on a fresh one (after a drop or
//! a `kill -9` of acpd) from the journal.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use crate::streamable_http::{SSE, open, rpc};
use crate::support::http::{Sse, SseEvent, post};
use crate::support::{Daemon, chunk_text, kind, seq, session_update_params};

const N: usize = 3000;

/// An HTTP connection with a session: `(connection id, session id, connection stream)`.
pub(crate) async fn session(daemon: &Daemon) -> (String, String, Sse) {
    let addr = daemon.addr;
    let (_, conn) = open(addr, &[]).await;
    let c = ("acp-connection-id", conn.as_str());
    let mut main = Sse::open(addr, &[c, SSE]).await;
    let new = rpc(
        2,
        "session/new",
        json!({ "cwd": daemon.work_dir(), "mcpServers": [] }),
    );
    assert_eq!(post(addr, &[c], &new).await.status, 202);
    let answer = main.until_answer(2).await.pop().unwrap();
    let sid = answer.data["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    (conn, sid, main)
}

pub(crate) async fn prompt(addr: SocketAddr, conn: &str, sid: &str, id: i64, text: &str) {
    let msg = rpc(
        id,
        "session/prompt",
        json!({ "sessionId": sid, "prompt": [{ "type": "text", "text": text }] }),
    );
    let headers = [("acp-connection-id", conn), ("acp-session-id", sid)];
    assert_eq!(post(addr, &headers, &msg).await.status, 202);
}

/// Events until one whose update is the streamed chunk `i` (`i:` prefix), or the answer `id`.
pub(crate) async fn until(
    stream: &mut Sse,
    chunk: Option<usize>,
    id: Option<i64>,
) -> Vec<SseEvent> {
    let mut out = Vec::new();
    loop {
        let e = stream.next().await.expect("the stream ended early");
        let hit = match (chunk, session_update_params(&e.data)) {
            (Some(i), Some(p)) => chunk_text(p).is_some_and(|t| t.starts_with(&format!("{i}:"))),
            _ => false,
        } || (id.is_some()
            && e.data.get("method").is_none()
            && e.data["id"] == id.unwrap());
        out.push(e);
        if hit {
            return out;
        }
    }
}

/// The streamed chunks' updates among `events`, each event's SSE id checked to be its seq.
pub(crate) fn chunks(events: &[SseEvent]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| {
            let p = session_update_params(&e.data)?;
            assert_eq!(e.num(), Some(seq(p) as u64), "SSE id = journal seq: {e:?}");
            (kind(p) == "agent_message_chunk").then(|| p.clone())
        })
        .collect()
}

/// `updates` are the chunks `0..n` in order, each once.
pub(crate) fn assert_exactly_once(updates: &[Value], n: usize) {
    let seqs: Vec<i64> = updates.iter().map(seq).collect();
    assert_eq!(
        seqs.iter().collect::<HashSet<_>>().len(),
        seqs.len(),
        "a seq twice"
    );
    let texts: Vec<&str> = updates.iter().filter_map(chunk_text).collect();
    assert_eq!(texts.len(), n, "every chunk once");
    for (i, t) in texts.iter().enumerate() {
        assert!(t.starts_with(&format!("{i}:")), "chunk {i} is {t}");
    }
}

#[tokio::test]
async fn a_session_stream_cut_mid_turn_and_reopened_gets_every_update_once() {
    let daemon = Daemon::start().await;
    let addr = daemon.addr;
    let (conn, sid, _main) = session(&daemon).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    let mut first = Sse::open(addr, &[c, SSE, s]).await;
    prompt(addr, &conn, &sid, 3, &format!("stream {N} 32")).await;
    let before = until(&mut first, Some(100), None).await;
    let last = before.last().unwrap().id.clone().expect("an SSE id");
    // Cut: the socket goes, mid-turn, with events on their way.
    drop(first);
    let mut again = Sse::open(addr, &[c, SSE, s, ("last-event-id", &last)]).await;
    let after = until(&mut again, None, Some(3)).await;
    let answer = after.last().unwrap();
    assert_eq!(
        answer.data["result"]["stopReason"], "end_turn",
        "{answer:?}"
    );
    // The answer is not journaled: `<seq>.<n>`, the seq of the update before it.
    let label = answer.id.as_deref().unwrap();
    let (at, _) = label.split_once('.').expect("an answer's id is <seq>.<n>");
    let last_update = after.iter().rev().find_map(|e| e.num()).unwrap();
    assert_eq!(at.parse::<u64>().unwrap(), last_update, "{label}");
    let mut updates = chunks(&before);
    updates.extend(chunks(&after));
    assert_exactly_once(&updates, N);
    // Reopened after the answer: nothing more, nothing again.
    let mut third = Sse::open(addr, &[c, SSE, s, ("last-event-id", label)]).await;
    prompt(addr, &conn, &sid, 4, "echo later").await;
    let rest = until(&mut third, None, Some(4)).await;
    let texts: Vec<&str> = rest
        .iter()
        .filter_map(|e| chunk_text(session_update_params(&e.data)?))
        .collect();
    assert_eq!(texts, ["later"], "{rest:?}");
}

#[tokio::test]
async fn a_session_stream_resumes_from_the_journal_after_a_daemon_kill() {
    let mut daemon = Daemon::start().await;
    let addr = daemon.addr;
    let (conn, sid, _main) = session(&daemon).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    let mut first = Sse::open(addr, &[c, SSE, s]).await;
    // Slow enough that the kill lands mid-turn.
    prompt(
        addr,
        &conn,
        &sid,
        3,
        "stream 200 32; sleep 30000; stream 200 32",
    )
    .await;
    let before = until(&mut first, Some(150), None).await;
    let last = before.last().unwrap().id.clone().unwrap();
    daemon.restart().await;
    drop(first);
    let addr = daemon.addr;

    // What the journal holds, every seq (`_acpd/session/attach` from the start on a
    // WebSocket; a load would merge the chunks into one message).
    let mut ws = daemon.client().await.with_timeout(Duration::from_secs(30));
    let (history, result) = ws.attach_after(&sid, 0).await;
    result.expect("attach after the restart");
    let journal: Vec<i64> = history
        .iter()
        .filter(|u| kind(u) == "agent_message_chunk")
        .map(seq)
        .collect();
    let end = *journal.last().unwrap();

    // A fresh connection: initialize, then the session's stream with Last-Event-ID.
    let (_, conn2) = open(addr, &[]).await;
    let c2 = ("acp-connection-id", conn2.as_str());
    let mut resumed = Sse::open(addr, &[c2, SSE, s, ("last-event-id", &last)]).await;
    let mut after = Vec::new();
    while after.last().and_then(SseEvent::num) < Some(end as u64) {
        after.push(resumed.next().await.expect("the replay"));
    }
    let mut updates = chunks(&before);
    updates.extend(chunks(&after));
    let got: Vec<i64> = updates.iter().map(seq).collect();
    assert_eq!(
        got, journal,
        "every journaled update exactly once, in order"
    );
    assert_exactly_once(&updates, journal.len());
    // The connection is attached: a prompt streams on, with nothing replayed again.
    prompt(addr, &conn2, &sid, 5, "echo after the restart").await;
    let rest = until(&mut resumed, None, Some(5)).await;
    let live: Vec<&str> = rest
        .iter()
        .filter_map(|e| {
            let p = session_update_params(&e.data)?;
            assert!(seq(p) > end, "replayed again: {e:?}");
            chunk_text(p)
        })
        .collect();
    assert!(live.contains(&"after the restart"), "{rest:?}");
}

#[tokio::test]
async fn last_event_id_where_the_connection_cannot_resume_is_answered() {
    let daemon = Daemon::start().await;
    let addr = daemon.addr;
    let (conn, sid, mut main) = session(&daemon).await;
    let c = ("acp-connection-id", conn.as_str());
    let s = ("acp-session-id", sid.as_str());
    let get = |extra: Vec<(&'static str, String)>| {
        let conn = conn.clone();
        let sid = sid.clone();
        async move {
            let mut h: Vec<(&str, &str)> =
                vec![("acp-connection-id", &conn), ("acp-session-id", &sid), SSE];
            h.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
            crate::support::http::request(addr, "GET", &h, "")
                .await
                .status
        }
    };
    // Not an id of ours.
    assert_eq!(get(vec![("last-event-id", "abc".into())]).await, 400);
    // The session is in use here (a prompt, its updates on the connection stream) and its
    // stream was never opened: nothing to resume from here.
    prompt(addr, &conn, &sid, 3, "echo one").await;
    let on_main = main.until_answer(3).await;
    // 409, the SDK's "reattach this session": the connection and its other sessions go on.
    assert_eq!(get(vec![("last-event-id", "1".into())]).await, 409);
    let mut stream = Sse::open(addr, &[c, SSE, s]).await;
    // What is not journaled is labelled after the last update the connection got of the
    // session, even on the connection stream: resuming from that label doubles nothing.
    let last_seq = on_main
        .iter()
        .filter_map(|e| session_update_params(&e.data).map(seq))
        .max()
        .unwrap();
    let echo = rpc(9, "_scripted/echo", json!({ "sessionId": sid }));
    assert_eq!(post(addr, &[c, s], &echo).await.status, 202);
    let answer = until(&mut stream, None, Some(9)).await.pop().unwrap();
    let label = answer.id.unwrap();
    assert!(
        label.starts_with(&format!("{last_seq}.")),
        "{label} after {last_seq}"
    );
    prompt(addr, &conn, &sid, 4, "echo two").await;
    until(&mut stream, None, Some(4)).await;
    // An id this stream never had.
    assert_eq!(get(vec![("last-event-id", "999".into())]).await, 409);
    // On a fresh connection, a seq beyond the journal: the stream ends at once.
    let (_, conn2) = open(addr, &[]).await;
    let c2 = ("acp-connection-id", conn2.as_str());
    let mut beyond = Sse::open(addr, &[c2, SSE, s, ("last-event-id", "999")]).await;
    assert!(beyond.next().await.is_none(), "nothing to resume: ended");
    // And on another, a seq it has: the rest, then live.
    let (_, conn3) = open(addr, &[]).await;
    let c3 = ("acp-connection-id", conn3.as_str());
    let mut ok = Sse::open(addr, &[c3, SSE, s, ("last-event-id", "0")]).await;
    let first = ok.next().await.expect("the journal from the start");
    assert!(session_update_params(&first.data).is_some(), "{first:?}");
}

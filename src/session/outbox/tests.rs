//! The outbox's tests: a client's answer and queued updates, held and released in order.
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::session::roles::Role;
use acpd_wire::{InFrame, Incoming, Link};

#[tokio::test]
async fn a_new_clients_answer_held_behind_a_full_queue_survives_its_catch_up() {
    // The test's runtime has one thread: the peer task runs only when the test awaits.
    let c = asked_session_new(1).await;
    let (peer, req) = (c.peer.clone(), c.request);
    // The connection's queue is full (another session on it streamed): by count, since
    // answers are not counted in bytes.
    let chunk: Arc<str> = "x".into();
    while peer.try_send_raw(chunk.clone()).is_ok() {}
    // Updates left the outbox before the client attached: it starts out lagging.
    let mut outbox = Outbox::new(TaskTracker::new(), 5);
    outbox.attach(Attached {
        client: client(peer),
        after: 0,
        reply: Some((req.responder, Ok(json!({"sessionId": "s"})))),
        reply_after_replay: false,
        resend: false,
        hold: Duration::ZERO,
    });
    assert!(
        !outbox.is_empty(),
        "the answer is still owed, held for the client"
    );
}

/// A connection (a peer on channels, its outgoing queue `out_capacity` frames) whose
/// client has sent `session/new`.
struct AskedNew {
    peer: acpd_wire::PeerHandle,
    request: acpd_wire::IncomingRequest,
    out: mpsc::Receiver<acpd_wire::OutFrame>,
    _kept: (mpsc::Sender<InFrame>, mpsc::Receiver<Incoming>),
}

async fn asked_session_new(out_capacity: usize) -> AskedNew {
    let (frames, incoming) = mpsc::channel(8);
    let (outgoing, out) = mpsc::channel(out_capacity);
    let (peer, mut owner, _task) =
        acpd_wire::spawn(Link { incoming, outgoing }, CancellationToken::new());
    let request = r#"{"jsonrpc":"2.0","id":1,"method":"session/new"}"#;
    frames.send(InFrame::Text(request.into())).await.unwrap();
    let Some(Incoming::Request(request)) = owner.recv().await else {
        panic!("no request")
    };
    AskedNew {
        peer,
        request: *request,
        out,
        _kept: (frames, owner),
    }
}

fn client(peer: acpd_wire::PeerHandle) -> Client {
    Client {
        conn: "c1".into(),
        peer,
        init: Arc::new(json!({})),
        role: Role::Controller,
        principal: "p".into(),
        principal_name: "p".into(),
        mcp_tunnel: false,
    }
}

#[tokio::test]
async fn an_implicit_attach_of_an_attached_connection_skips_nothing_queued_for_it() {
    let mut c = asked_session_new(8).await;
    let (peer, req) = (c.peer.clone(), c.request);
    let mut outbox = Outbox::new(TaskTracker::new(), 0);
    outbox.attach(Attached {
        client: client(peer.clone()),
        after: 0,
        reply: Some((req.responder, Ok(json!({"sessionId": "s"})))),
        reply_after_replay: false,
        resend: false,
        hold: Duration::from_secs(600),
    });
    // The agent's first update, durable, held by the bootstrap hold.
    outbox.push(Out::Update {
        seq: 1,
        text: "update 1".into(),
        exclude: None,
        need: None,
    });
    outbox.flush(1).await;
    // A prompt overtook the connection's filing of its new session: an implicit attach
    // of the connection, with seq 1 given out but not yet sent to it.
    let after = outbox.live_from(&"c1".into(), 1);
    outbox.attach(Attached {
        client: client(peer),
        after,
        reply: None,
        reply_after_replay: false,
        resend: false,
        hold: Duration::ZERO,
    });
    outbox.release_hold_by(&"c1".into());
    outbox.flush(1).await;
    let mut sent = vec![];
    while sent.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(5), c.out.recv()).await;
        sent.push(
            frame
                .expect("a frame")
                .expect("the link")
                .as_str()
                .to_owned(),
        );
    }
    assert!(sent[0].contains("sessionId"), "{sent:?}");
    assert_eq!(sent[1], "update 1");
}

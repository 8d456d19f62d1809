//! Fuzzes dispatch: an `acpd_wire::spawn` peer over an in-memory link, fed arbitrary frames
//! (text, oversize, not UTF-8) while its owner answers every request it is handed.
//!
//! Checks: the peer never panics, writes only well-formed JSON-RPC, answers no request id
//! more often than it was used, answers no more often than it was spoken to, and ends once
//! the link closes.

#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use acpd_wire::{InFrame, Incoming, Link, Message, OutFrame, RequestId};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fuzz_target!(|input: Vec<(u8, String)>| {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    else {
        return;
    };
    rt.block_on(run(input));
});

async fn run(input: Vec<(u8, String)>) {
    let frames = input.len();
    // How often each request id was sent: the most successful answers it may get.
    let mut sent: HashMap<String, usize> = HashMap::new();
    for (kind, text) in &input {
        if kind % 8 >= 2
            && let Ok(Message::Request(r)) = Message::parse(text)
            && r.id != RequestId::Null
        {
            *sent.entry(r.id.to_string()).or_default() += 1;
        }
    }
    let (in_tx, in_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel::<OutFrame>(8);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let (_handle, mut incoming, peer) = acpd_wire::spawn(link, CancellationToken::new());

    let feed = async move {
        for (kind, text) in input {
            let frame = match kind % 8 {
                0 => InFrame::TooLarge(text.len()),
                1 => InFrame::NotUtf8,
                _ => InFrame::Text(text),
            };
            if in_tx.send(frame).await.is_err() {
                break;
            }
        }
        // Dropping the sender closes the link: the peer must end.
    };
    let owner = async move {
        while let Some(msg) = incoming.recv().await {
            if let Incoming::Request(r) = msg {
                r.responder.respond(Ok(json!({}))).await;
            }
        }
    };
    let drain = async move {
        let mut written = 0usize;
        let mut answered: HashMap<String, usize> = HashMap::new();
        while let Some(text) = out_rx.recv().await {
            let msg = Message::parse(&text).expect("the peer writes valid JSON-RPC");
            if let Message::Response(r) = msg {
                written += 1;
                if r.result.is_ok() {
                    let n = answered.entry(r.id.to_string()).or_default();
                    *n += 1;
                    let max = sent.get(&r.id.to_string()).copied().unwrap_or(0);
                    assert!(*n <= max, "request {} answered {n} times, sent {max}", r.id);
                }
            }
        }
        assert!(written <= frames, "{written} replies to {frames} frames");
    };
    let all = async {
        tokio::join!(feed, owner, drain);
        let _ = peer.await;
    };
    // A peer that does not end after its link closed is a bug; the fuzzer reports the hang.
    if tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .is_err()
    {
        panic!("the peer did not end after its link closed");
    }
}

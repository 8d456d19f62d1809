//! Fuzzes `acpd_wire::Message::parse`, the first thing every frame from a client meets.
//!
//! Beyond "does not panic": a message that parses writes out as text that parses back to the
//! same message, and a frame that does not parse earns an error reply of the right code that
//! is itself a well-formed response.

#![no_main]

use acpd_wire::{Malformed, Message, RequestId, code};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Frames reach the parser as text; invalid UTF-8 is answered before it (-32700).
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Message::parse(text) {
        Ok(msg) => {
            let written = msg.to_text();
            assert!(
                !written.contains('\n'),
                "one message is one line: {written}"
            );
            let again = Message::parse(&written).expect("what acpd writes parses");
            assert_eq!(again, msg, "round trip changed the message");
        }
        Err(bad) => {
            let expected = match &bad {
                Malformed::Parse(_) => code::PARSE_ERROR,
                Malformed::Batch | Malformed::Invalid { .. } => code::INVALID_REQUEST,
            };
            let reply = bad.reply();
            if matches!(bad, Malformed::Parse(_) | Malformed::Batch) {
                assert_eq!(
                    reply.id,
                    RequestId::Null,
                    "an unreadable id is answered as null"
                );
            }
            let written = Message::Response(reply).to_text();
            match Message::parse(&written) {
                Ok(Message::Response(r)) => {
                    let e = r.result.expect_err("a malformed frame earns an error");
                    assert_eq!(e.code, expected);
                }
                other => panic!("the error reply is not a response: {other:?}"),
            }
        }
    }
});

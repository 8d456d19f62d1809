//! Fuzzes the one-pass envelope read (`RawNotification::read`) against the full parse
//! (`Message::parse`): the fast read is an optimisation and must never read a frame otherwise.
//!
//! Checks: a frame the envelope read accepts is a notification to the full parse too (unless
//! it holds a number no tree can hold, which only the raw read passes on), with the same method
//! and params; its member spans, when known, are exactly the params' members; and a frame it
//! gives back is given back whole.

#![no_main]

use acpd_wire::{Message, RawNotification};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let raw = match RawNotification::read(text.to_owned()) {
        Ok(raw) => raw,
        Err(back) => {
            assert_eq!(back, text, "a refused frame comes back unchanged");
            return;
        }
    };
    let full = match Message::parse(text) {
        Ok(Message::Notification(n)) => n,
        Ok(other) => panic!("read as a notification, parsed as {other:?}: {text}"),
        // Valid JSON a tree cannot hold (a number beyond f64): the raw read passes it on.
        Err(_) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => return,
        Err(e) => panic!("read as a notification, refused by the full parse ({e:?}): {text}"),
    };
    assert_eq!(raw.method(), full.method, "{text}");
    let params: Option<Value> = raw.params().map(|p| serde_json::from_str(p).expect("params"));
    assert_eq!(params, full.params, "{text}");
    if let Some(members) = raw.members() {
        let Some(Value::Object(object)) = &full.params else {
            panic!("members of params that are not an object: {text}");
        };
        assert_eq!(members.iter().count(), object.len(), "{text}");
        for (name, value) in members.iter() {
            let value: Value = serde_json::from_str(value).expect("a member's value");
            assert_eq!(object.get(name), Some(&value), "{text}");
        }
    }
});

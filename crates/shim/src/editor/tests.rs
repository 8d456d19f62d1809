//! The tracker's unit tests: what survives a daemon restart, message by message.
use super::*;

fn fwd(t: &mut Tracker, m: &str) {
    assert_eq!(t.note_daemon(m), FromDaemon::Forward(None), "{m}");
}

#[test]
fn restart_plan_reattaches_and_answers() {
    let mut t = Tracker::new();
    t.note_editor(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#.into(),
    );
    fwd(&mut t, r#"{"jsonrpc":"2.0","id":0,"result":{}}"#);
    t.note_editor(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#.into());
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s1"}}"#,
    );
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{},"_meta":{"acpd":{"seq":7}}}}"#,
    );
    t.note_editor(
        r#"{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s1"}}"#.into(),
    );
    t.note_editor(
        r#"{"jsonrpc":"2.0","id":3,"method":"session/set_mode","params":{"sessionId":"s1"}}"#
            .into(),
    );
    let queued =
        r#"{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"s1"}}"#;
    t.note_editor(queued.into());
    let claims = McpClaims::from([("s1".into(), json!([{"url": "acpd-mcp:1-git"}]))]);
    let late = r#"{"jsonrpc":"2.0","id":9,"result":{}}"#;
    let unsent = vec![queued.into(), late.into()];
    let r = t.on_restart(unsent, claims);
    assert_eq!(r.requeued, vec![queued.to_string()]);
    assert_eq!(r.resend.len(), 2);
    assert!(
        r.resend[0]
            .contains(r#""id":"acp-shim:1","method":"initialize","params":{"protocolVersion":1}"#)
    );
    assert!(r.resend[1].contains(r#""afterSeq":7"#), "{}", r.resend[1]);
    assert!(r.resend[1].contains("acpd-mcp:1-git"), "{}", r.resend[1]);
    assert_eq!(r.private.len(), 2);
    assert_eq!(r.answers.len(), 2);
    assert!(r.answers[0].contains(r#""id":2,"result":{"stopReason":"cancelled"}"#));
    assert!(r.answers[1].contains(r#""id":3,"error":{"code":-32603"#));
    let FromDaemon::Private { ok: true, .. } =
        t.note_daemon(r#"{"jsonrpc":"2.0","id":"acp-shim:2","result":{"lastSeq":7}}"#)
    else {
        panic!("not private")
    };
}

#[test]
fn a_journal_that_ends_early_is_attached_from_its_end_once() {
    let mut t = Tracker::new();
    t.note_editor(r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#.into());
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s1"}}"#,
    );
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{},"_meta":{"acpd":{"seq":9}}}}"#,
    );
    let r = t.on_restart(vec![], HashMap::new());
    assert!(r.resend[0].contains(r#""afterSeq":9"#), "{:?}", r.resend);
    let err = r#"{"jsonrpc":"2.0","id":"acp-shim:1","error":{"code":-32602,"message":"beyond","data":{"lastSeq":4}}}"#;
    let FromDaemon::Private {
        ok: false,
        again: Some((pid, line)),
        ..
    } = t.note_daemon(err)
    else {
        panic!("no second attach")
    };
    assert!(
        line.contains(r#""afterSeq":4"#) && line.contains(&pid),
        "{line}"
    );
    // Refused again (the daemon's end moved on, say): not retried without end.
    let err = err.replace("acp-shim:1", "acp-shim:2");
    let FromDaemon::Private { again: None, .. } = t.note_daemon(&err) else {
        panic!("retried twice")
    };
}

#[test]
fn daemon_request_ids_move_after_a_restart() {
    let mut t = Tracker::new();
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","id":3,"method":"session/request_permission","params":{}}"#,
    );
    t.on_restart(vec![], HashMap::new());
    // A late answer to the dead daemon's request 3 is dropped...
    assert_eq!(
        t.note_editor(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#.into()),
        None
    );
    // ...and the new daemon's request 3 reaches the editor under another id.
    let FromDaemon::Forward(Some(m)) =
        t.note_daemon(r#"{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{}}"#)
    else {
        panic!("not rewritten")
    };
    let shown = serde_json::from_str::<Value>(&m).unwrap()["id"].clone();
    assert_eq!(shown, json!(EPOCH_STRIDE + 3));
    let back = t
        .note_editor(format!(r#"{{"jsonrpc":"2.0","id":{shown},"result":{{}}}}"#))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&back).unwrap()["id"],
        json!(3)
    );
}

#[test]
fn a_daemon_message_must_be_one_json_value() {
    let mut t = Tracker::new();
    // Cut out of a frame that had more after `m`: not one value.
    assert_eq!(
        t.note_daemon(r#"{"jsonrpc":"2.0"},"x":2"#),
        FromDaemon::NotJson
    );
    assert_eq!(t.note_daemon(r#"{"jsonrpc":"2.0","#), FromDaemon::NotJson);
    fwd(&mut t, r#"[{"jsonrpc":"2.0","method":"x"}]"#);
    fwd(&mut t, r#"{"jsonrpc":"2.0","method":"x","params":[1]}"#);
}

#[test]
fn closed_sessions_are_not_reattached() {
    let mut t = Tracker::new();
    t.note_editor(
        r#"{"jsonrpc":"2.0","id":1,"method":"session/load","params":{"sessionId":"a"}}"#.into(),
    );
    t.note_editor(
        r#"{"jsonrpc":"2.0","id":2,"method":"session/close","params":{"sessionId":"a"}}"#.into(),
    );
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","_meta":{"acpd":{"seq":3}}}}"#,
    );
    assert_eq!(t.open_sessions(), 0);
}

#[test]
fn updates_are_tracked_in_acpds_form_and_in_any_other() {
    let mut t = Tracker::new();
    // The agent's own _meta was merged: not acpd's short form, so it is parsed.
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{},"_meta":{"x":1,"acpd":{"seq":4}}}}"#,
    );
    assert_eq!(t.sessions.get("a"), Some(&4));
    fwd(
        &mut t,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":{"text":"\"_meta\":{}}}}"},"_meta":{"acpd":{"seq":5}}}}"#,
    );
    assert_eq!(t.sessions.get("a"), Some(&5));
}

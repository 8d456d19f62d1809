//! How the daemon's journal stores a `session/update`: without its session id and seq, which
//! the row's columns hold (`acpd_store::BodyForm`, journal format 3).
//!
//! An update acpd spliced (`actor/splice.rs`) is `acpd_protocol::update_form`: a fixed head, the
//! session id, the params' other members, a fixed tail around the seq. Only those members are
//! stored (`,"update":{…}`: empty or starting with a comma, which no JSON text does, so a read
//! tells them from a body stored whole); reads put head, id and tail back, byte for byte.
//! Any other body (an agent's own `_meta`, a client request, an id with escapes) is stored
//! whole.

use std::sync::Arc;

use acpd_protocol::update_form::{self, Parts};
use acpd_store::{BodyForm, StoreOptions};

/// The daemon's `BodyForm`; every `Store` the daemon opens uses it (`store_options`).
#[derive(Debug, Default, Clone, Copy)]
pub struct UpdateForm;

/// The store options every `Store` of the daemon starts from (serve, stdio, admin commands,
/// and tools or tests that open its store): the defaults with the daemon's journal form, so
/// that nothing can read a journal without it.
pub fn store_options() -> StoreOptions {
    StoreOptions {
        body_form: Arc::new(UpdateForm),
        ..StoreOptions::default()
    }
}

impl BodyForm for UpdateForm {
    fn shrink<'a>(&self, session_id: &str, seq: i64, body: &'a str) -> Option<&'a str> {
        let parts = update_form::split(body)?;
        (parts.session_id == session_id && parts.seq == seq).then_some(parts.members)
    }

    fn expand(&self, session_id: &str, seq: i64, stored: &str, out: &mut String) -> bool {
        let shrunk = stored.is_empty() || stored.starts_with(',');
        if shrunk {
            let members = stored;
            update_form::join(
                Parts {
                    session_id,
                    members,
                    seq,
                },
                out,
            );
        }
        shrunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(sid: &str, members: &str, seq: i64) -> String {
        let mut text = String::new();
        update_form::join(
            Parts {
                session_id: sid,
                members,
                seq,
            },
            &mut text,
        );
        text
    }

    /// What `expand` gives for `stored`, if it expands it.
    fn expand(sid: &str, seq: i64, stored: &str) -> Option<String> {
        let mut out = String::new();
        UpdateForm.expand(sid, seq, stored, &mut out).then_some(out)
    }

    #[test]
    fn an_update_is_stored_as_its_members_and_read_back_whole() {
        let members = r#","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}"#;
        let text = update("acpd-7", members, 12);
        let stored = UpdateForm.shrink("acpd-7", 12, &text).expect("shrunk");
        assert_eq!(stored, members);
        assert_eq!(expand("acpd-7", 12, stored), Some(text));
        let bare = update("acpd-7", "", 3);
        assert_eq!(UpdateForm.shrink("acpd-7", 3, &bare), Some(""));
        assert_eq!(expand("acpd-7", 3, ""), Some(bare));
    }

    #[test]
    fn other_bodies_are_stored_whole_and_read_as_stored() {
        let text = update("acpd-7", r#","update":{}"#, 12);
        // Not this row's session or seq (a fork's copy is rewritten before it is appended).
        assert_eq!(UpdateForm.shrink("acpd-8", 12, &text), None);
        assert_eq!(UpdateForm.shrink("acpd-7", 13, &text), None);
        for whole in [
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"acpd-7","update":{},"_meta":{"x":1,"acpd":{"seq":3}}}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"session/request_permission","params":{}}"#,
        ] {
            assert_eq!(UpdateForm.shrink("acpd-7", 3, whole), None);
            assert_eq!(expand("acpd-7", 3, whole), None);
        }
    }
}

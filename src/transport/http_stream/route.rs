//! Which SSE stream of a connection an outgoing message goes to: the session's stream when
//! the client opened one (a notification or request naming its `sessionId`, or the answer to
//! a POST that named one), else the connection's stream; and the answers to the
//! `_acpd/session/attach` requests the connection itself makes to resume a session stream from
//! the journal, which go to no stream. Pure.

use acpd_protocol::method;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

/// A stream of a connection: `None` is the connection-scoped one.
pub type StreamKey = Option<String>;

/// What routing reads of a message.
#[derive(Deserialize)]
struct Peek {
    method: Option<serde::de::IgnoredAny>,
    id: Option<Value>,
    params: Option<PeekParams>,
}

#[derive(Deserialize)]
struct PeekParams {
    #[serde(rename = "sessionId")]
    session_id: Option<Value>,
    #[serde(rename = "_meta")]
    meta: Option<Value>,
}

/// Where an outgoing message goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Dest {
    /// The connection's stream.
    Connection,
    /// A session's stream (if the client opened one); `seq` is a journaled update's.
    Session { id: String, seq: Option<i64> },
    /// The answer to the connection's own attach of `session`: no client asked for it.
    Attached { session: String, ok: bool },
}

/// The requests the client POSTed naming a session, by JSON-RPC id, until answered.
#[derive(Debug, Default)]
pub struct Routes {
    pending: HashMap<String, String>,
    /// The connection's own `_acpd/session/attach` requests, by JSON-RPC id.
    attaches: HashMap<String, String>,
    next_attach: u64,
}

/// Most requests remembered per connection (a client that never reads its answers).
const MAX_PENDING: usize = 4096;

/// A POSTed message's `(id, session)` if it is a request naming a session (`header` is
/// `Acp-Session-Id`, else `params.sessionId` counts).
pub fn request_route(msg: &Value, header: Option<&str>) -> Option<(String, String)> {
    msg.get("method")?;
    let id = msg.get("id")?;
    let session = header.map(str::to_owned).or_else(|| {
        msg.pointer("/params/sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
    })?;
    Some((id.to_string(), session))
}

impl Routes {
    /// Remembers the session of a POSTed request.
    pub fn posted(&mut self, route: (String, String)) {
        if self.pending.len() < MAX_PENDING {
            self.pending.insert(route.0, route.1);
        }
    }

    /// The `_acpd/session/attach` request (JSON text) that replays `session` from the journal
    /// after `after_seq` to this connection; its answer comes back as `Dest::Attached`.
    pub fn attach_request(&mut self, session: &str, after_seq: i64) -> String {
        self.next_attach += 1;
        let id = Value::String(format!("_acpd/http/attach/{}", self.next_attach));
        self.attaches.insert(id.to_string(), session.to_owned());
        serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": method::ACPD_SESSION_ATTACH,
            "params": { "sessionId": session, "afterSeq": after_seq },
        })
        .to_string()
    }

    /// Where an outgoing message goes (an answer forgets its request).
    pub fn dest(&mut self, text: &str) -> Dest {
        let Ok(peek) = serde_json::from_str::<Peek>(text) else {
            return Dest::Connection;
        };
        if peek.method.is_some() {
            let Some(params) = peek.params else {
                return Dest::Connection;
            };
            let seq = params
                .meta
                .as_ref()
                .and_then(|m| m.pointer("/acpd/seq"))
                .and_then(Value::as_i64);
            return match params.session_id {
                Some(Value::String(id)) => Dest::Session { id, seq },
                _ => Dest::Connection,
            };
        }
        let Some(id) = peek.id.map(|id| id.to_string()) else {
            return Dest::Connection;
        };
        if let Some(session) = self.attaches.remove(&id) {
            let ok = serde_json::from_str::<Value>(text)
                .ok()
                .is_some_and(|v| v.get("result").is_some());
            return Dest::Attached { session, ok };
        }
        match self.pending.remove(&id) {
            Some(id) => Dest::Session { id, seq: None },
            None => Dest::Connection,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn notifications_by_their_session_answers_by_their_request() {
        let mut r = Routes::default();
        let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","_meta":{"acpd":{"seq":4}}}}"#;
        assert_eq!(r.dest(update), session("s1", Some(4)));
        let list = r#"{"jsonrpc":"2.0","method":"x","params":{}}"#;
        assert_eq!(r.dest(list), Dest::Connection);
        let mut post = |msg: Value, header: Option<&str>| {
            if let Some(route) = request_route(&msg, header) {
                r.posted(route);
            }
        };
        post(
            json!({"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s2"}}),
            None,
        );
        post(
            json!({"jsonrpc":"2.0","id":"a","method":"session/cancel"}),
            Some("s3"),
        );
        post(
            json!({"jsonrpc":"2.0","id":8,"method":"session/list"}),
            None,
        );
        // A client's answer to an agent request is not remembered.
        post(json!({"jsonrpc":"2.0","id":9,"result":{}}), Some("s4"));
        let answer = |id: &str| format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#);
        assert_eq!(r.dest(&answer("7")), session("s2", None));
        assert_eq!(r.dest(&answer("7")), Dest::Connection);
        assert_eq!(r.dest(&answer(r#""a""#)), session("s3", None));
        assert_eq!(r.dest(&answer("8")), Dest::Connection);
        assert_eq!(r.dest(&answer("9")), Dest::Connection);
    }

    fn session(id: &str, seq: Option<i64>) -> Dest {
        Dest::Session { id: id.into(), seq }
    }

    #[test]
    fn the_connections_own_attaches_are_answered_to_no_stream() {
        let mut r = Routes::default();
        let req: Value = serde_json::from_str(&r.attach_request("s1", 12)).unwrap();
        assert_eq!(req["method"], "_acpd/session/attach");
        assert_eq!(req["params"], json!({ "sessionId": "s1", "afterSeq": 12 }));
        let id = req["id"].to_string();
        let err = format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32602}}}}"#);
        let ok = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"lastSeq":12}}}}"#);
        assert_eq!(
            r.dest(&ok),
            Dest::Attached {
                session: "s1".into(),
                ok: true
            }
        );
        assert_eq!(r.dest(&err), Dest::Connection, "answered once");
        let req2: Value = serde_json::from_str(&r.attach_request("s2", 0)).unwrap();
        let err = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602}}}}"#,
            req2["id"]
        );
        assert_eq!(
            r.dest(&err),
            Dest::Attached {
                session: "s2".into(),
                ok: false
            }
        );
    }
}

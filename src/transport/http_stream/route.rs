//! Which SSE stream of a connection an outgoing message goes to: the session's stream when
//! the client opened one (a notification or request naming its `sessionId`, or the answer to
//! a POST that named one), else the connection's stream. Pure.

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
}

/// The requests the client POSTed naming a session, by JSON-RPC id, until answered.
#[derive(Debug, Default)]
pub struct Routes {
    pending: HashMap<String, String>,
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

    /// The session an outgoing message belongs to, if any (an answer forgets its request).
    pub fn session_of(&mut self, text: &str) -> Option<String> {
        let peek: Peek = serde_json::from_str(text).ok()?;
        if peek.method.is_some() {
            return match peek.params?.session_id? {
                Value::String(s) => Some(s),
                _ => None,
            };
        }
        self.pending.remove(&peek.id?.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn notifications_by_their_session_answers_by_their_request() {
        let mut r = Routes::default();
        let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1"}}"#;
        assert_eq!(r.session_of(update).as_deref(), Some("s1"));
        let list = r#"{"jsonrpc":"2.0","method":"x","params":{}}"#;
        assert_eq!(r.session_of(list), None);
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
        assert_eq!(
            r.session_of(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#)
                .as_deref(),
            Some("s2")
        );
        assert_eq!(
            r.session_of(r#"{"jsonrpc":"2.0","id":7,"result":{}}"#),
            None
        );
        assert_eq!(
            r.session_of(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#)
                .as_deref(),
            Some("s3")
        );
        assert_eq!(
            r.session_of(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#),
            None
        );
        assert_eq!(
            r.session_of(r#"{"jsonrpc":"2.0","id":9,"result":{}}"#),
            None
        );
    }
}

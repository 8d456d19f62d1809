//! JSON-RPC 2.0 wire types: dumb data, parsed from and written to one text frame or line.

use std::fmt;

use serde_json::{Map, Value};

/// A request id as the peer sent it: numbers and strings are echoed back exactly.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    Number(serde_json::Number),
    String(String),
    /// Only on error replies to input whose id could not be read.
    Null,
}

impl RequestId {
    pub fn to_value(&self) -> Value {
        match self {
            RequestId::Number(n) => Value::Number(n.clone()),
            RequestId::String(s) => Value::String(s.clone()),
            RequestId::Null => Value::Null,
        }
    }

    /// Reads an id; objects, arrays and booleans are not ids.
    pub fn from_value(v: &Value) -> Option<RequestId> {
        match v {
            Value::Number(n) => Some(RequestId::Number(n.clone())),
            Value::String(s) => Some(RequestId::String(s.clone())),
            Value::Null => Some(RequestId::Null),
            _ => None,
        }
    }
}

impl From<u64> for RequestId {
    fn from(n: u64) -> Self {
        RequestId::Number(n.into())
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
            RequestId::Null => f.write_str("null"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    pub params: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub method: String,
    pub params: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub id: RequestId,
    pub result: Result<Value, ResponseError>,
}

/// The `error` member of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// JSON-RPC and ACP error codes acpd uses.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const REQUEST_CANCELLED: i64 = -32800;
    pub const AUTH_REQUIRED: i64 = -32000;
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

impl ResponseError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ResponseError {
            code,
            message: message.into(),
            data: None,
        }
    }
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
    pub fn parse_error(detail: impl fmt::Display) -> Self {
        Self::new(code::PARSE_ERROR, format!("Parse error: {detail}"))
    }
    pub fn invalid_request(detail: impl fmt::Display) -> Self {
        Self::new(code::INVALID_REQUEST, format!("Invalid request: {detail}"))
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(code::METHOD_NOT_FOUND, "Method not found")
            .with_data(serde_json::json!({ "method": method }))
    }
    pub fn invalid_params(detail: impl fmt::Display) -> Self {
        Self::new(code::INVALID_PARAMS, format!("Invalid params: {detail}"))
    }
    pub fn internal(detail: impl fmt::Display) -> Self {
        Self::new(code::INTERNAL_ERROR, format!("Internal error: {detail}"))
    }
    pub fn request_cancelled() -> Self {
        Self::new(code::REQUEST_CANCELLED, "Request cancelled")
    }

    fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("code".into(), self.code.into());
        m.insert("message".into(), self.message.clone().into());
        if let Some(d) = &self.data {
            m.insert("data".into(), d.clone());
        }
        Value::Object(m)
    }

    fn from_value(v: &Value) -> ResponseError {
        ResponseError {
            code: v
                .get("code")
                .and_then(Value::as_i64)
                .unwrap_or(code::INTERNAL_ERROR),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            data: v.get("data").cloned(),
        }
    }
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ResponseError {}

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request(Request),
    Response(Response),
    Notification(Notification),
}

/// Why a frame is not a message; each maps to the error reply it gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Malformed {
    /// Not JSON at all: `-32700`, `id: null`.
    Parse(String),
    /// A JSON array: batches are not supported, one `-32600` with `id: null`.
    Batch,
    /// JSON, but not a JSON-RPC message; carries the id when one could be read.
    Invalid { id: RequestId, reason: String },
}

impl Malformed {
    /// The reply this input earns.
    pub fn reply(&self) -> Response {
        match self {
            Malformed::Parse(e) => Response {
                id: RequestId::Null,
                result: Err(ResponseError::parse_error(e)),
            },
            Malformed::Batch => Response {
                id: RequestId::Null,
                result: Err(ResponseError::invalid_request("batches are not supported")),
            },
            Malformed::Invalid { id, reason } => Response {
                id: id.clone(),
                result: Err(ResponseError::invalid_request(reason)),
            },
        }
    }
}

/// An f64 holding an integer too large to be exact (beyond 2^53); within 64 bits serde_json
/// would have given an integer, so this came from a longer literal (or an exponent).
fn unsafe_integer(f: f64) -> bool {
    f.fract() == 0.0 && f.abs() >= 9_007_199_254_740_992.0
}

impl Message {
    /// Reads one frame. Unknown members are ignored; params are kept verbatim.
    pub fn parse(text: &str) -> Result<Message, Malformed> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Malformed::Parse(e.to_string()))?;
        Self::from_value(value)
    }

    pub fn from_value(value: Value) -> Result<Message, Malformed> {
        let mut obj = match value {
            Value::Object(o) => o,
            Value::Array(_) => return Err(Malformed::Batch),
            _ => {
                return Err(Malformed::Invalid {
                    id: RequestId::Null,
                    reason: "a message is a JSON object".into(),
                });
            }
        };
        let raw_id = obj.remove("id");
        let id = match &raw_id {
            None => None,
            // serde_json keeps integers within 64 bits exact; a longer one arrives as an f64
            // and would be echoed rounded, as a float: refused instead, plainly.
            Some(Value::Number(n)) if n.is_f64() && n.as_f64().is_some_and(unsafe_integer) => {
                return Err(Malformed::Invalid {
                    id: RequestId::Null,
                    reason: "id: integers beyond 64 bits are not supported".into(),
                });
            }
            Some(v) => match RequestId::from_value(v) {
                Some(id) => Some(id),
                None => {
                    return Err(Malformed::Invalid {
                        id: RequestId::Null,
                        reason: "id must be a string, a number or null".into(),
                    });
                }
            },
        };
        let bad = |id: Option<RequestId>, reason: &str| Malformed::Invalid {
            id: id.unwrap_or(RequestId::Null),
            reason: reason.to_owned(),
        };
        if let Some(v) = obj.get("jsonrpc")
            && v != "2.0"
        {
            return Err(bad(id, "jsonrpc must be \"2.0\""));
        }
        let params = match obj.remove("params") {
            None | Some(Value::Null) => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => return Err(bad(id, "params must be an object or an array")),
        };
        if let Some(method) = obj.remove("method") {
            let Value::String(method) = method else {
                return Err(bad(id, "method must be a string"));
            };
            return Ok(match id {
                Some(id) => Message::Request(Request { id, method, params }),
                None => Message::Notification(Notification { method, params }),
            });
        }
        let Some(id) = id else {
            return Err(bad(
                None,
                "neither a request, a notification nor a response",
            ));
        };
        if let Some(error) = obj.get("error") {
            return Ok(Message::Response(Response {
                id,
                result: Err(ResponseError::from_value(error)),
            }));
        }
        match obj.remove("result") {
            Some(result) => Ok(Message::Response(Response {
                id,
                result: Ok(result),
            })),
            None => Err(bad(Some(id), "a response needs result or error")),
        }
    }

    /// Serializes to one line of compact JSON (no embedded newlines).
    pub fn to_text(&self) -> String {
        let mut m = Map::new();
        m.insert("jsonrpc".into(), "2.0".into());
        match self {
            Message::Request(r) => {
                m.insert("id".into(), r.id.to_value());
                m.insert("method".into(), r.method.clone().into());
                if let Some(p) = &r.params {
                    m.insert("params".into(), p.clone());
                }
            }
            Message::Notification(n) => {
                m.insert("method".into(), n.method.clone().into());
                if let Some(p) = &n.params {
                    m.insert("params".into(), p.clone());
                }
            }
            Message::Response(r) => {
                m.insert("id".into(), r.id.to_value());
                match &r.result {
                    Ok(v) => m.insert("result".into(), v.clone()),
                    Err(e) => m.insert("error".into(), e.to_value()),
                };
            }
        }
        Value::Object(m).to_string()
    }
}

impl From<Request> for Message {
    fn from(r: Request) -> Self {
        Message::Request(r)
    }
}
impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Message::Response(r)
    }
}
impl From<Notification> for Message {
    fn from(n: Notification) -> Self {
        Message::Notification(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_exact_within_64_bits_and_refused_beyond() {
        for id in [
            "9007199254740993",
            "18446744073709551615",
            "-9223372036854775808",
            "1.5",
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"a"}}"#);
            let Ok(Message::Request(r)) = Message::parse(&text) else {
                panic!("{id}")
            };
            assert_eq!(r.id.to_string(), id);
        }
        for id in ["18446744073709551616", "-9223372036854775809", "1e300"] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"a"}}"#);
            assert!(
                matches!(Message::parse(&text), Err(Malformed::Invalid { id: RequestId::Null, ref reason }) if reason.contains("64 bits")),
                "{id}"
            );
        }
    }

    #[test]
    fn classifies_messages_and_garbage() {
        assert!(matches!(
            Message::parse(r#"{"jsonrpc":"2.0","id":1,"method":"a"}"#),
            Ok(Message::Request(_))
        ));
        assert!(matches!(
            Message::parse(r#"{"jsonrpc":"2.0","method":"a"}"#),
            Ok(Message::Notification(_))
        ));
        assert!(matches!(
            Message::parse(r#"{"jsonrpc":"2.0","id":"x","result":{}}"#),
            Ok(Message::Response(_))
        ));
        assert!(matches!(Message::parse("{nope"), Err(Malformed::Parse(_))));
        assert_eq!(Message::parse("[]"), Err(Malformed::Batch));
        let Err(Malformed::Invalid { id, .. }) = Message::parse(r#"{"id":7,"method":3}"#) else {
            panic!()
        };
        assert_eq!(id, RequestId::from(7));
        assert!(matches!(
            Message::parse(r#"{"id":{},"method":"a"}"#),
            Err(Malformed::Invalid { .. })
        ));
    }

    #[test]
    fn ids_round_trip_exactly() {
        for id in ["-5", "\"abc\"", "12345678901234"] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"a"}}"#);
            let Ok(m) = Message::parse(&text) else {
                panic!("{text}")
            };
            let out = m.to_text();
            assert!(out.contains(&format!(r#""id":{id}"#)), "{out}");
            assert_eq!(Message::parse(&out), Ok(m));
        }
    }
}

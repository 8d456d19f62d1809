//! The newline-delimited TCP listener (`--tcp-listen`, loopback only). Its first line is a
//! gate: a web page can make a browser send bytes to a loopback port (`fetch` with
//! `mode: "no-cors"`), so anything that looks like HTTP, or any first line that is not a
//! JSON-RPC object, is refused and the connection closed at once. Unless `--no-auth`, the
//! first line must be `{"jsonrpc":"2.0","method":"_acpd/auth","params":{"token":"…"}}`
//! (a notification; as a request with an `id` it is answered `{}`), checked like a bearer
//! token. Only then does the line stream become a `Link` (`acpd_wire::lines::pump_with`, with the write deadline).

use acpd_protocol::method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::auth::{Denied, Identity};
use crate::acp::connection;
use acpd_wire::code;

/// The method of the first line that carries the token.
pub const AUTH_METHOD: &str = method::ACPD_AUTH;

/// Longest first line read while a token is required (an auth line is tiny).
const AUTH_LINE_MAX: usize = 64 * 1024;

/// What the first line of a TCP connection is.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstLine {
    /// `_acpd/auth` with a string token; `id` when sent as a request.
    Auth { token: String, id: Option<Value> },
    /// Any other JSON-RPC 2.0 object: the connection's first message.
    Message,
    /// An HTTP request line (or an HTTP/2 preface): a browser, a proxy or a scanner.
    Http,
    /// Anything else: not JSON, not an object, not JSON-RPC 2.0, or a malformed auth line.
    NotJsonRpc,
}

/// What to do with a connection, given its first line.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Check this token; answer `id` (if any) once it holds.
    CheckToken { token: String, id: Option<Value> },
    /// No token needed: the connection starts, its first line is its first message.
    PassThrough,
    /// No token needed, an auth line anyway: answer it, drop it, start.
    AcceptAuthLine { id: Option<Value> },
    /// Refuse with an HTTP 400 and close.
    RefuseHttp,
    /// Refuse with this JSON-RPC error (`id: null`) and close.
    Refuse { code: i64, message: &'static str },
}

/// Classifies a first line (without its newline).
pub fn classify(line: &[u8]) -> FirstLine {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if looks_like_http(line) {
        return FirstLine::Http;
    }
    let Ok(Value::Object(msg)) = serde_json::from_slice::<Value>(line) else {
        return FirstLine::NotJsonRpc;
    };
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return FirstLine::NotJsonRpc;
    }
    if msg.get("method").and_then(Value::as_str) != Some(AUTH_METHOD) {
        return FirstLine::Message;
    }
    match msg.get("params").and_then(|p| p.get("token")) {
        Some(Value::String(token)) => FirstLine::Auth {
            token: token.clone(),
            id: msg.get("id").cloned(),
        },
        _ => FirstLine::NotJsonRpc,
    }
}

/// `METHOD SP target SP HTTP/…` (also `PRI * HTTP/2.0`, the HTTP/2 preface).
fn looks_like_http(line: &[u8]) -> bool {
    let mut words = line.split(|b| *b == b' ');
    let (Some(method), Some(target), Some(version)) = (words.next(), words.next(), words.next())
    else {
        return false;
    };
    !method.is_empty()
        && method.iter().all(u8::is_ascii_uppercase)
        && !target.is_empty()
        && version.starts_with(b"HTTP/")
}

/// The decision: the first line, and whether a token is required.
pub fn gate(first: FirstLine, token_required: bool) -> Gate {
    match (first, token_required) {
        (FirstLine::Http, _) => Gate::RefuseHttp,
        (FirstLine::NotJsonRpc, _) => Gate::Refuse {
            code: code::INVALID_REQUEST,
            message: "the first line must be a JSON-RPC 2.0 object",
        },
        (FirstLine::Auth { token, id }, true) => Gate::CheckToken { token, id },
        (FirstLine::Auth { id, .. }, false) => Gate::AcceptAuthLine { id },
        (FirstLine::Message, false) => Gate::PassThrough,
        (FirstLine::Message, true) => Gate::Refuse {
            code: code::AUTH_REQUIRED,
            message: AUTH_REQUIRED.as_str(),
        },
    }
}

/// What a first line other than `_acpd/auth` is answered where a token is required.
static AUTH_REQUIRED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "authentication required: send {{\"jsonrpc\":\"2.0\",\"method\":\"{}\",\"params\":{{\"token\":\"…\"}}}} first",
        method::ACPD_AUTH
    )
});

const HTTP_REFUSAL: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n\
Content-Length: 55\r\nConnection: close\r\n\r\nthis port speaks newline-delimited JSON-RPC, not HTTP\r\n";

/// Raw TCP accept loop. Each connection's gate runs in its own task, so a client that never
/// sends its first line holds up nobody (and is closed after `header_read_timeout`).
pub async fn accept(
    listener: TcpListener,
    st: AppState,
    gate: crate::transport::listen::Gate,
    shutdown: CancellationToken,
) {
    crate::transport::listen::deepen_backlog(&listener);
    while let Some((stream, peer, pass)) =
        crate::transport::listen::accept_gated(&listener, &gate, &shutdown).await
    {
        tracing::debug!(%peer, "tcp connection");
        let st = st.clone();
        let cancel = st.shutdown.child_token();
        st.tasks.clone().spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                // The token check's audit line names the client, as on the HTTP listener.
                _ = tracing::Instrument::instrument(
                    serve_one(stream, peer, pass, st, cancel.clone()),
                    tracing::error_span!("conn", %peer),
                ) => {}
            }
        });
    }
}

/// Reads the first line (bounded in size and time), applies the gate, runs the connection.
async fn serve_one(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    pass: crate::transport::listen::Pass,
    st: AppState,
    cancel: CancellationToken,
) {
    let (r, mut w) = stream.into_split();
    let mut reader = BufReader::new(r);
    let required = !st.config.no_auth;
    let max = st.config.limits.max_message_bytes;
    let limit = if required { AUTH_LINE_MAX } else { max };
    let timeout = st.config.limits.header_read_timeout;
    let Some((first, line)) = first_line(&mut reader, limit, timeout, &pass, peer).await else {
        return;
    };
    let Some((identity, answer, replay)) = admit(first, line, required, &st, &mut w, peer).await
    else {
        return;
    };
    if let Some(id) = answer {
        let ok = json!({ "jsonrpc": "2.0", "id": id, "result": {} });
        if w.write_all(format!("{ok}\n").as_bytes()).await.is_err() {
            return;
        }
    }
    // Authenticated (or no token needed): out of the pending pool, counted till it ends.
    pass.authenticated();
    let _pass = pass;
    let token_id = identity.token_id.clone();
    let conn_id = uuid::Uuid::new_v4().to_string();
    let profile = st.config.default_agent.clone();
    let ctx = super::connection_ctx(&conn_id, identity, profile, &st.config, &st.hub);
    let registration = match st
        .registry
        .open(&ctx.conn_id, &ctx.principal, token_id, cancel.clone())
        .await
    {
        Ok(r) => r,
        Err(e) => {
            metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
            tracing::warn!(%peer, reason = %e, "tcp connection refused");
            refuse(
                &mut w,
                &Value::Null,
                code::INTERNAL_ERROR,
                "too many connections",
            )
            .await;
            return;
        }
    };
    let _registration = registration;
    // The first line was a message (no token needed): it goes first, then the rest.
    let reader: Box<dyn AsyncRead + Unpin + Send> = match replay {
        Some(mut line) => {
            line.push(b'\n');
            Box::new(std::io::Cursor::new(line).chain(reader))
        }
        None => Box::new(reader),
    };
    let deadline = crate::transport::write_deadline(st.config.keepalive);
    let (link, pump) = acpd_wire::lines::pump_with(reader, w, max, Some(deadline), cancel.clone());
    let pump = tokio::spawn(pump);
    connection::run(link, ctx, cancel).await;
    let _ = pump.await;
}

/// The first line, read bounded in size (`limit`) and time, and what it is; `None` when the
/// connection is to be closed (nothing sent, a read error, too slow, displaced).
async fn first_line(
    reader: &mut BufReader<OwnedReadHalf>,
    limit: usize,
    timeout: std::time::Duration,
    pass: &crate::transport::listen::Pass,
    peer: std::net::SocketAddr,
) -> Option<(FirstLine, Vec<u8>)> {
    let mut line = Vec::new();
    let mut bounded = reader.take(limit as u64 + 1);
    let read = bounded.read_until(b'\n', &mut line);
    let read = tokio::time::timeout(timeout, read);
    let first = match tokio::select! {
        r = read => r,
        _ = pass.evicted() => {
            tracing::debug!(%peer, "tcp: pending connection displaced by newer ones: closed");
            return None;
        }
    } {
        Ok(Ok(0)) => return None,
        Ok(Ok(_)) if line.ends_with(b"\n") => {
            line.pop();
            classify(&line)
        }
        // Over the limit, or the stream ended inside the line.
        Ok(Ok(_)) => FirstLine::NotJsonRpc,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "tcp read failed");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, "tcp: no first line in time; closed");
            return None;
        }
    };
    Some((first, line))
}

/// Applies the gate to the first line: the connection's identity, the id of an auth line to
/// answer, the line to replay as its first message; `None` once refused (answered here).
async fn admit(
    first: FirstLine,
    line: Vec<u8>,
    required: bool,
    st: &AppState,
    w: &mut OwnedWriteHalf,
    peer: std::net::SocketAddr,
) -> Option<(Identity, Option<Value>, Option<Vec<u8>>)> {
    let local = || Identity {
        principal: st.auth.local_principal().to_owned(),
        name: super::auth::LOCAL_PRINCIPAL.to_owned(),
        token_id: None,
    };
    let admitted = match gate(first, required) {
        Gate::RefuseHttp => {
            tracing::warn!(target: "acpd::audit", %peer, "tcp: refused an HTTP request");
            let _ = w.write_all(HTTP_REFUSAL).await;
            let _ = w.shutdown().await;
            return None;
        }
        Gate::Refuse { code, message } => {
            tracing::warn!(target: "acpd::audit", %peer, code, "tcp: refused the first line");
            refuse(w, &Value::Null, code, message).await;
            return None;
        }
        Gate::PassThrough => (local(), None, Some(line)),
        Gate::AcceptAuthLine { id } => (local(), id, None),
        Gate::CheckToken { token, id } => match st.auth.check_secret(&token).await {
            Ok(identity) => (identity, id, None),
            Err(denied) => {
                let id = id.unwrap_or(Value::Null);
                let (code, message) = match denied {
                    Denied::Invalid => (code::AUTH_REQUIRED, "invalid token"),
                    Denied::Unavailable => (code::INTERNAL_ERROR, "store unavailable"),
                };
                refuse(w, &id, code, message).await;
                return None;
            }
        },
    };
    Some(admitted)
}

async fn refuse(w: &mut tokio::net::tcp::OwnedWriteHalf, id: &Value, code: i64, message: &str) {
    let err = crate::error::reply(id, code, message);
    let _ = w.write_all(format!("{err}\n").as_bytes()).await;
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_request_lines_are_http() {
        for line in [
            &b"POST / HTTP/1.1\r"[..],
            b"GET /acp HTTP/1.0",
            b"OPTIONS * HTTP/1.1",
            b"PRI * HTTP/2.0",
        ] {
            assert_eq!(classify(line), FirstLine::Http);
            assert_eq!(gate(classify(line), false), Gate::RefuseHttp);
        }
    }

    #[test]
    fn only_json_rpc_objects_pass() {
        for line in [
            &b"{ not json"[..],
            b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}]",
            b"null",
            b"\"text\"",
            b"{\"id\":1,\"method\":\"initialize\"}",
            b"Host: 127.0.0.1",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"_acpd/auth\",\"params\":{\"token\":7}}",
        ] {
            assert_eq!(classify(line), FirstLine::NotJsonRpc, "{line:?}");
            assert!(matches!(gate(classify(line), false), Gate::Refuse { .. }));
        }
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        assert_eq!(classify(init), FirstLine::Message);
        assert_eq!(gate(FirstLine::Message, false), Gate::PassThrough);
    }

    #[test]
    fn a_token_is_required_unless_no_auth() {
        let auth = br#"{"jsonrpc":"2.0","method":"_acpd/auth","params":{"token":"s"}}"#;
        let first = classify(auth);
        assert_eq!(
            first,
            FirstLine::Auth {
                token: "s".into(),
                id: None
            }
        );
        assert_eq!(
            gate(first.clone(), true),
            Gate::CheckToken {
                token: "s".into(),
                id: None
            }
        );
        assert_eq!(gate(first, false), Gate::AcceptAuthLine { id: None });
        let with_id = br#"{"jsonrpc":"2.0","id":0,"method":"_acpd/auth","params":{"token":"s"}}"#;
        assert!(matches!(
            gate(classify(with_id), true),
            Gate::CheckToken { id: Some(_), .. }
        ));
        assert!(matches!(
            gate(FirstLine::Message, true),
            Gate::Refuse {
                code: code::AUTH_REQUIRED,
                ..
            }
        ));
    }

    #[test]
    fn the_http_refusal_is_well_formed() {
        let text = std::str::from_utf8(HTTP_REFUSAL).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(text.contains(&format!("Content-Length: {}\r\n", body.len())));
    }
}

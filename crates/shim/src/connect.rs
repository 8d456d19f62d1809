//! Opening one WebSocket to acpd: TCP, TLS, the upgrade with the token and the resume
//! headers, and sorting failures into "retry" and "give up, with this exit code".

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, Uri};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use acpd_wire::resume::{
    CONNECTION_ID_HEADER, LAST_SEQ_HEADER, MAX_MESSAGE_HEADER, RESUME_HEADER, SUBPROTOCOL,
};

/// Any byte stream a WebSocket can run on (plain TCP or TLS over it).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub type Ws = WebSocketStream<Box<dyn Io>>;

/// Where and how to connect; fixed for the shim's life.
pub struct Target {
    pub uri: Uri,
    pub host: String,
    pub port: u16,
    pub tls: Option<Arc<ClientConfig>>,
    pub token: Option<String>,
    pub handshake_timeout: Duration,
}

/// An upgraded socket.
pub struct Connected {
    pub ws: Ws,
    pub conn_id: String,
    /// On a resume: the last SEQ the daemon received.
    pub peer_received: u64,
    /// The daemon's message limit, when it says (`Acpd-Max-Message-Bytes`).
    pub max_message: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Network trouble or a daemon not (yet) there: try again later.
    #[error("{0}")]
    Unreachable(String),
    /// The resumed link is unknown to the daemon (restarted, or the link expired).
    #[error("the daemon no longer knows this link")]
    Gone,
    #[error("the daemon refused the token ({0})")]
    Auth(StatusCode),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{0}")]
    NotFound(String),
    #[error("protocol: {0}")]
    Protocol(String),
}

impl ConnectError {
    /// Worth another try after a pause.
    pub fn retryable(&self) -> bool {
        matches!(self, ConnectError::Unreachable(_))
    }
}

/// Connects; `resume` is `(connection id, last SEQ received)` of the link to resume.
pub async fn connect(t: &Target, resume: Option<(&str, u64)>) -> Result<Connected, ConnectError> {
    match tokio::time::timeout(t.handshake_timeout, connect_inner(t, resume)).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Unreachable(format!(
            "no answer from {}:{} within {:?}",
            t.host, t.port, t.handshake_timeout
        ))),
    }
}

async fn connect_inner(t: &Target, resume: Option<(&str, u64)>) -> Result<Connected, ConnectError> {
    let stream = open_stream(t).await?;
    let req = upgrade_request(t, resume)?;
    // Messages are bounded by the daemon; the shim accepts what the daemon may send.
    // tungstenite zero-fills its whole read buffer before every read: at the default 128 KiB
    // that memset was the shim's largest cost when streaming small updates.
    let config = WebSocketConfig::default()
        .read_buffer_size(16 * 1024)
        .max_message_size(Some(256 << 20))
        .max_frame_size(Some(256 << 20));
    let (ws, resp) = tokio_tungstenite::client_async_with_config(req, stream, Some(config))
        .await
        .map_err(classify)?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    if header("sec-websocket-protocol").as_deref() != Some(SUBPROTOCOL) {
        return Err(ConnectError::Protocol(format!(
            "the server did not accept the {SUBPROTOCOL} subprotocol (not acpd, or too old)"
        )));
    }
    let conn_id = header(CONNECTION_ID_HEADER)
        .ok_or_else(|| ConnectError::Protocol("no Acp-Connection-Id in the upgrade".into()))?;
    let peer_received = match resume {
        None => 0,
        Some(_) => header(LAST_SEQ_HEADER)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| {
                ConnectError::Protocol("resume answered without Acpd-Last-Seq".into())
            })?,
    };
    let max_message = header(MAX_MESSAGE_HEADER).and_then(|v| v.parse().ok());
    Ok(Connected {
        ws,
        conn_id,
        peer_received,
        max_message,
    })
}

/// The TCP connection to acpd, under TLS when the target says so.
async fn open_stream(t: &Target) -> Result<Box<dyn Io>, ConnectError> {
    let tcp = TcpStream::connect((t.host.as_str(), t.port))
        .await
        .map_err(|e| {
            ConnectError::Unreachable(format!("cannot connect to {}:{}: {e}", t.host, t.port))
        })?;
    let _ = tcp.set_nodelay(true);
    Ok(match &t.tls {
        None => Box::new(tcp),
        Some(config) => {
            let name = ServerName::try_from(t.host.clone())
                .map_err(|e| ConnectError::Tls(format!("invalid server name {}: {e}", t.host)))?;
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name, tcp)
                .await
                .map_err(
                    |e| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                        Some(tls) => ConnectError::Tls(tls.to_string()),
                        // A reset or EOF during the handshake is the network, not TLS.
                        None => ConnectError::Unreachable(format!("TLS handshake: {e}")),
                    },
                )?;
            Box::new(tls)
        }
    })
}

/// The upgrade request: the resumable subprotocol, the token, the link to resume.
fn upgrade_request(
    t: &Target,
    resume: Option<(&str, u64)>,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, ConnectError> {
    let mut req = t
        .uri
        .clone()
        .into_client_request()
        .map_err(|e| ConnectError::Protocol(e.to_string()))?;
    let h = req.headers_mut();
    h.insert(
        "sec-websocket-protocol",
        HeaderValue::from_static(SUBPROTOCOL),
    );
    if let Some(token) = &t.token {
        let v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| ConnectError::Protocol("the token is not a valid header value".into()))?;
        h.insert("authorization", v);
    }
    if let Some((id, last)) = resume {
        let v = HeaderValue::from_str(id)
            .map_err(|_| ConnectError::Protocol("bad connection id".into()))?;
        h.insert(RESUME_HEADER, v);
        h.insert(LAST_SEQ_HEADER, HeaderValue::from(last));
    }
    Ok(req)
}

fn classify(e: tokio_tungstenite::tungstenite::Error) -> ConnectError {
    use tokio_tungstenite::tungstenite::Error as E;
    match e {
        E::Http(resp) => {
            let status = resp.status();
            let body = resp
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                .unwrap_or_default();
            match status {
                StatusCode::GONE => ConnectError::Gone,
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ConnectError::Auth(status),
                StatusCode::NOT_FOUND => ConnectError::NotFound(format!("{status}: {body}")),
                s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                    ConnectError::Unreachable(format!("{status}: {body}"))
                }
                s => ConnectError::Protocol(format!("upgrade refused with {s}: {body}")),
            }
        }
        E::Io(e) => ConnectError::Unreachable(e.to_string()),
        E::ConnectionClosed | E::AlreadyClosed => {
            ConnectError::Unreachable("connection closed during the upgrade".into())
        }
        other => ConnectError::Protocol(other.to_string()),
    }
}

/// Opens the login link (`acpd_wire::login`) at `t.uri`. A refusal comes back with the
/// daemon's reason: not this principal's profile (403), a login already running (409), no
/// such agent (404).
pub async fn connect_login(t: &Target) -> Result<Ws, crate::Exit> {
    use crate::Exit;
    let inner = async {
        let stream = open_stream(t).await.map_err(|e| match e {
            ConnectError::Tls(m) => Exit::Tls(m),
            other => Exit::Unavailable(other.to_string()),
        })?;
        let mut req = t
            .uri
            .clone()
            .into_client_request()
            .map_err(|e| Exit::Usage(e.to_string()))?;
        let h = req.headers_mut();
        h.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(acpd_wire::login::SUBPROTOCOL),
        );
        if let Some(token) = &t.token {
            let v = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| Exit::Usage("the token is not a valid header value".into()))?;
            h.insert("authorization", v);
        }
        let (ws, _) = tokio_tungstenite::client_async(req, stream)
            .await
            .map_err(login_refusal)?;
        Ok(ws)
    };
    match tokio::time::timeout(t.handshake_timeout, inner).await {
        Ok(r) => r,
        Err(_) => Err(Exit::Unavailable(format!(
            "no answer from {}:{} within {:?}",
            t.host, t.port, t.handshake_timeout
        ))),
    }
}

fn login_refusal(e: tokio_tungstenite::tungstenite::Error) -> crate::Exit {
    use crate::Exit;
    use tokio_tungstenite::tungstenite::Error as E;
    let E::Http(resp) = e else {
        return Exit::Unavailable(e.to_string());
    };
    let status = resp.status();
    let body = resp
        .body()
        .as_deref()
        .map(|b| String::from_utf8_lossy(b).trim().to_owned())
        .unwrap_or_default();
    let why = format!("acpd refused the login ({status}): {body}");
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Exit::Auth(why),
        StatusCode::NOT_FOUND => Exit::Usage(why),
        StatusCode::CONFLICT => Exit::Unavailable(why),
        _ => Exit::Protocol(why),
    }
}

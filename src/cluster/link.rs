//! The internal link to a peer replica: a WebSocket to its `/_acpd/peer` endpoint,
//! authenticated by the cluster secret, on behalf of one principal. The far side runs an
//! ordinary client connection for that principal (`server::peer`); this side gets a `Link`
//! like every other transport's, so a `Peer` speaks JSON-RPC over it.

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::Connector;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_util::sync::CancellationToken;

use acpd_wire::{InFrame, Link};

/// The path of the internal endpoint on every replica.
pub const PEER_PATH: &str = "/_acpd/peer";
/// Carries the cluster secret.
pub const SECRET_HEADER: &str = "acpd-cluster-secret";
/// The principal (id) the link acts for, and its name.
pub const PRINCIPAL_HEADER: &str = "acpd-principal";
pub const PRINCIPAL_NAME_HEADER: &str = "acpd-principal-name";
/// The agent profile the client's connection is on.
pub const PROFILE_HEADER: &str = "acpd-profile";

/// A peer that takes no bytes of a frame for this long is gone: the link ends.
const WRITE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Who the link acts for.
pub struct OnBehalf<'a> {
    pub principal: &'a str,
    pub principal_name: &'a str,
    pub profile: Option<&'a str>,
    pub secret: &'a str,
    /// Checks the peer's certificate when its URL is `wss://`; unused for `ws://`.
    pub tls: Arc<rustls::ClientConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("bad peer URL {0:?}")]
    Url(String),
    #[error("cannot reach the peer replica at {url}: {source}")]
    Connect {
        url: String,
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
}

/// Connects to the replica at `advertise_url` (`ws://host:port`, `http://` is read as
/// `ws://`, `https://` as `wss://`, which is dialled over rustls with `who.tls`); the link
/// ends when either side closes it or `cancel` fires.
pub async fn dial(
    advertise_url: &str,
    who: OnBehalf<'_>,
    cancel: CancellationToken,
) -> Result<(Link, impl Future<Output = ()> + Send + 'static), DialError> {
    let base = advertise_url.trim_end_matches('/');
    let base = match base.split_once("://") {
        Some(("http", rest)) => format!("ws://{rest}"),
        Some(("https", rest)) => format!("wss://{rest}"),
        _ => base.to_owned(),
    };
    let url = format!("{base}{PEER_PATH}");
    let mut req = url
        .as_str()
        .into_client_request()
        .map_err(|_| DialError::Url(url.clone()))?;
    let header = |v: &str| HeaderValue::from_str(v).map_err(|_| DialError::Url(url.clone()));
    let h = req.headers_mut();
    h.insert(SECRET_HEADER, header(who.secret)?);
    h.insert(PRINCIPAL_HEADER, header(who.principal)?);
    h.insert(PRINCIPAL_NAME_HEADER, header(who.principal_name)?);
    if let Some(p) = who.profile {
        h.insert(PROFILE_HEADER, header(p)?);
    }
    let connector = Connector::Rustls(who.tls.clone());
    let (ws, _) =
        tokio_tungstenite::connect_async_tls_with_config(req, None, false, Some(connector))
            .await
            .map_err(|e| DialError::Connect {
                url: url.clone(),
                source: Box::new(e),
            })?;
    let (in_tx, in_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<acpd_wire::OutFrame>(acpd_wire::LINK_QUEUE);
    let link = Link {
        incoming: in_rx,
        outgoing: out_tx,
    };
    let pump = async move {
        let (mut sink, mut stream) = ws.split();
        // At most one frame read and not yet taken by the link: reads wait for room, writes
        // never wait for reads (a cycle of full queues cannot stop both directions).
        let mut held: Option<InFrame> = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                out = out_rx.recv() => match out {
                    Some(text) => {
                        let sent = tokio::time::timeout(WRITE_DEADLINE, sink.send(Message::text(text.into_string())));
                        if !matches!(sent.await, Ok(Ok(()))) {
                            break;
                        }
                    }
                    None => break,
                },
                permit = in_tx.reserve(), if held.is_some() => match (permit, held.take()) {
                    (Ok(permit), Some(frame)) => permit.send(frame),
                    _ => break,
                },
                frame = stream.next(), if held.is_none() => match frame {
                    Some(Ok(Message::Text(t))) => held = Some(InFrame::Text(t.as_str().to_owned())),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        let _ = sink.close().await;
    };
    Ok((link, pump))
}

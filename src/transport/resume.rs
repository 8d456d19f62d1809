//! Link resumption (`acpd.resume.v1`): a WebSocket link whose state outlives its socket.
//!
//! A client that offers the subprotocol gets numbered, acknowledged frames (see `window`); the
//! link's owner task keeps the connection's `Link`, the unacked frames and the last received
//! number for `resume_grace` after the socket goes. A reconnect presents `Acpd-Resume: <id>`
//! and `Acpd-Last-Seq: <n>`; the 101 answers with the daemon's own `Acpd-Last-Seq`, and each
//! side resends what the other missed. The connection above never knows: it sees one `Link`.
//! Plain RFD clients (no subprotocol) never reach this module.

mod owner;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use acpd_wire::Link;
use owner::{Control, ControlTx, Owner};

pub use acpd_wire::resume::{
    CONNECTION_ID_HEADER, LAST_SEQ_HEADER, MAX_MESSAGE_HEADER, RESUME_HEADER, SUBPROTOCOL, window,
};

/// Tunables, from `Config`.
#[derive(Debug, Clone)]
pub struct ResumeSettings {
    /// How long a link waits for its client to come back.
    pub grace: Duration,
    /// Ping interval; about three silent intervals mean a dead socket.
    pub keepalive: Duration,
    /// Unacked bytes a link may hold; past it the link is dropped (its sessions detach, the
    /// journal keeps everything for `_acpd/session/attach`).
    pub max_buffer_bytes: usize,
    pub max_message_bytes: usize,
}

/// Why a resume is refused: the client must start a new link (and re-attach its sessions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("unknown or expired link")]
    Gone,
}

/// Room in a link's control queue beside one slot per sender (`futures_channel`'s bound).
const CONTROL_QUEUE: usize = 2;

enum RegistryCmd {
    Insert {
        id: Arc<str>,
        principal: String,
        ctl: ControlTx,
    },
    Find {
        id: String,
        principal: String,
        reply: oneshot::Sender<Option<ControlTx>>,
    },
    Remove {
        id: Arc<str>,
    },
}

/// The live resumable links by connection id. Cheap to clone; one registry task owns the map.
#[derive(Clone)]
pub struct Resumer {
    tx: mpsc::Sender<RegistryCmd>,
    settings: Arc<ResumeSettings>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Resumer {
    pub fn spawn(
        settings: ResumeSettings,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Resumer {
        let (tx, mut rx) = mpsc::channel::<RegistryCmd>(64);
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let mut links: HashMap<Arc<str>, (String, ControlTx)> = HashMap::new();
            loop {
                let cmd = tokio::select! {
                    _ = stop.cancelled() => break,
                    c = rx.recv() => match c { Some(c) => c, None => break },
                };
                match cmd {
                    RegistryCmd::Insert { id, principal, ctl } => {
                        links.insert(id, (principal, ctl));
                    }
                    RegistryCmd::Find {
                        id,
                        principal,
                        reply,
                    } => {
                        let found = links
                            .get(id.as_str())
                            .filter(|(p, ctl)| *p == principal && !ctl.is_closed())
                            .map(|(_, ctl)| ctl.clone());
                        let _ = reply.send(found);
                    }
                    RegistryCmd::Remove { id } => {
                        links.remove(&id);
                    }
                }
            }
        });
        Resumer {
            tx,
            settings: Arc::new(settings),
            tasks,
            shutdown,
        }
    }

    /// Upgrades a request that offered `acpd.resume.v1` (or presented `Acpd-Resume`).
    /// A new link runs `start(link)` (the connection) once its socket is up; a resume hands
    /// the socket to the existing link, or answers 410 before the upgrade.
    pub async fn upgrade<F, Fut>(
        &self,
        ws: WebSocketUpgrade,
        headers: &HeaderMap,
        principal: &str,
        new_id: String,
        start: F,
    ) -> Response
    where
        F: FnOnce(Link) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let ws = ws.protocols([SUBPROTOCOL]);
        if ws.selected_protocol().is_none() {
            let msg = format!("{RESUME_HEADER} needs the WebSocket subprotocol {SUBPROTOCOL}\n");
            return (StatusCode::BAD_REQUEST, msg).into_response();
        }
        let Some(resume_id) = headers.get(RESUME_HEADER) else {
            return self.new_link(ws, principal, new_id, start).await;
        };
        let last_seq = headers
            .get(LAST_SEQ_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let (Ok(id), Some(last_seq)) = (resume_id.to_str(), last_seq) else {
            let msg = format!("{RESUME_HEADER} needs a valid id and {LAST_SEQ_HEADER}\n");
            return (StatusCode::BAD_REQUEST, msg).into_response();
        };
        let gone = || {
            (
                StatusCode::GONE,
                "unknown or expired link; start a new one\n",
            )
        };
        let mut ctl = match self.find(id, principal).await {
            Some(ctl) => ctl,
            None => return gone().into_response(),
        };
        let (reply, rx) = oneshot::channel();
        let reserve = Control::Reserve {
            peer_received: last_seq,
            reply,
        };
        if ctl.send(reserve).await.is_err() {
            return gone().into_response();
        }
        let ours = match rx.await {
            Ok(Ok(n)) => n,
            _ => return gone().into_response(),
        };
        tracing::debug!(link = %id, theirs = last_seq, ours, "resuming a link");
        let tasks = self.tasks.clone();
        let mut resp = ws.on_upgrade(move |socket| {
            tasks.track_future(async move {
                let mut ctl = ctl;
                let attach = Control::Attach {
                    socket: Box::new(socket),
                    peer_received: last_seq,
                };
                let _ = ctl.send(attach).await;
            })
        });
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(id) {
            h.insert(CONNECTION_ID_HEADER, v);
        }
        h.insert(LAST_SEQ_HEADER, HeaderValue::from(ours));
        h.insert(
            MAX_MESSAGE_HEADER,
            HeaderValue::from(self.settings.max_message_bytes),
        );
        resp
    }

    async fn new_link<F, Fut>(
        &self,
        ws: WebSocketUpgrade,
        principal: &str,
        id: String,
        start: F,
    ) -> Response
    where
        F: FnOnce(Link) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let id: Arc<str> = Arc::from(id.as_str());
        let (in_tx, in_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
        let (ctl_tx, ctl_rx) = futures_channel::mpsc::channel(CONTROL_QUEUE);
        let insert = RegistryCmd::Insert {
            id: id.clone(),
            principal: principal.to_owned(),
            ctl: ctl_tx.clone(),
        };
        if self.tx.send(insert).await.is_err() {
            return (StatusCode::SERVICE_UNAVAILABLE, "acpd is shutting down\n").into_response();
        }
        let owner = Owner {
            id: id.clone(),
            settings: (*self.settings).clone(),
            tasks: self.tasks.clone(),
            shutdown: self.shutdown.clone(),
        };
        let registry = self.tx.clone();
        let oid = id.clone();
        self.tasks.spawn(async move {
            owner.run(in_tx, out_rx, ctl_rx).await;
            let _ = registry.send(RegistryCmd::Remove { id: oid }).await;
        });
        let link = Link {
            incoming: in_rx,
            outgoing: out_tx,
        };
        let tasks = self.tasks.clone();
        let mut resp = ws.on_upgrade(move |socket| {
            tasks.track_future(async move {
                let mut ctl_tx = ctl_tx;
                let attach = Control::Attach {
                    socket: Box::new(socket),
                    peer_received: 0,
                };
                if ctl_tx.send(attach).await.is_ok() {
                    drop(ctl_tx);
                    start(link).await;
                }
            })
        });
        if let Ok(v) = HeaderValue::from_str(&id) {
            resp.headers_mut().insert(CONNECTION_ID_HEADER, v);
        }
        let max = HeaderValue::from(self.settings.max_message_bytes);
        resp.headers_mut().insert(MAX_MESSAGE_HEADER, max);
        resp
    }

    async fn find(&self, id: &str, principal: &str) -> Option<ControlTx> {
        let (reply, rx) = oneshot::channel();
        let find = RegistryCmd::Find {
            id: id.to_owned(),
            principal: principal.to_owned(),
            reply,
        };
        self.tx.send(find).await.ok()?;
        rx.await.ok().flatten()
    }
}

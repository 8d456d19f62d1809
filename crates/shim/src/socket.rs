//! One socket of the shim's link: a writer task and a reader task that talk to the relay loop
//! over bounded channels, so the loop never waits on the network.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connect::Ws;

pub(crate) enum WsOut {
    Text(String),
    Close(u16),
}

pub(crate) enum SockEvent {
    /// A text frame, as the socket's own buffer.
    Text(u64, Utf8Bytes),
    Closed(u64, Option<(u16, String)>),
}

/// The loop's end of one socket; dropping it kills the socket's tasks.
pub(crate) struct Socket {
    pub(crate) no: u64,
    pub(crate) writer: mpsc::Sender<WsOut>,
    kill: CancellationToken,
    pub(crate) closing: bool,
}

impl Drop for Socket {
    fn drop(&mut self) {
        if !self.closing {
            self.kill.cancel();
        }
    }
}

/// Starts socket `no`'s writer and reader tasks on `tasks`; the reader reports on `events`.
pub(crate) fn start(
    ws: Ws,
    no: u64,
    tasks: &TaskTracker,
    events: mpsc::Sender<SockEvent>,
) -> Socket {
    let (mut sink, mut stream) = ws.split();
    // Not a child of `cancel`: a closing socket's writer must outlive the loop.
    let kill = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel::<WsOut>(64);
    let k = kill.clone();
    tasks.spawn(async move {
        while let Some(out) = tokio::select! { _ = k.cancelled() => None, o = rx.recv() => o } {
            match out {
                WsOut::Text(t) => {
                    let r = tokio::select! {
                        _ = k.cancelled() => break,
                        r = sink.send(Message::Text(t.into())) => r,
                    };
                    if r.is_err() {
                        break;
                    }
                }
                WsOut::Close(code) => {
                    let frame = CloseFrame {
                        code: code.into(),
                        reason: "".into(),
                    };
                    let close = async {
                        let _ = sink.send(Message::Close(Some(frame))).await;
                        let _ = sink.close().await;
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                    break;
                }
            }
        }
    });
    let k = kill.clone();
    tasks.spawn(async move {
        let close = loop {
            let msg = tokio::select! {
                _ = k.cancelled() => return,
                m = stream.next() => m,
            };
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let ev = SockEvent::Text(no, t);
                    tokio::select! {
                        _ = k.cancelled() => return,
                        r = events.send(ev) => if r.is_err() { return },
                    }
                }
                Some(Ok(Message::Close(f))) => {
                    break f.map(|f| (u16::from(f.code), f.reason.as_str().to_owned()));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "socket read failed");
                    break None;
                }
                None => break None,
            }
        };
        let _ = events.send(SockEvent::Closed(no, close)).await;
    });
    Socket {
        no,
        writer: tx,
        kill,
        closing: false,
    }
}

/// Room in the current socket's writer queue; never resolves while there is no socket.
pub(crate) async fn writer_permit(
    w: Option<mpsc::Sender<WsOut>>,
) -> Option<mpsc::OwnedPermit<WsOut>> {
    match w {
        Some(w) => w.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

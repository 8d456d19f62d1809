//! The owner task of one resumable link (daemon side). It holds the `Link` the connection
//! reads and writes, the window (numbering, unacked frames) and at most one socket at a time;
//! it outlives its sockets for the grace period.
//!
//! Each socket gets a reader and a writer task, so the owner never waits on the network: it
//! keeps reading acks while a write is stuck, a blackholed socket is noticed by the keepalive
//! instead of hanging the link, and a write the client takes no bytes of for the write deadline
//! detaches the link (the client resumes it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::window::{self, Frame, Window, WindowError};
use super::{Rejected, ResumeSettings};
use crate::transport::ws::{BURST, CloseReason};
use acpd_wire::InFrame;

/// What the registry and the upgrade handler tell an owner.
pub(super) enum Control {
    /// A client wants to resume: drop the current socket (the position must not move until the
    /// new one is attached) and check the client's position against the buffer.
    Reserve {
        peer_received: u64,
        reply: oneshot::Sender<Result<u64, Rejected>>,
    },
    /// The upgraded socket of a new link (`peer_received` 0) or of a reserved resume.
    Attach {
        socket: Box<WebSocket>,
        peer_received: u64,
    },
}

enum WsOut {
    Text(String),
    Close(u16, &'static str),
}

enum SockEvent {
    Text(u64, String),
    /// The socket ended; `Some(code)` when the client sent a close frame.
    Closed(u64, Option<u16>),
}

/// The owner's end of one socket. Dropping it kills both I/O tasks at once (socket replaced
/// or dead); `close` lets the writer send a close frame first.
struct Socket {
    sock_no: u64,
    writer: mpsc::Sender<WsOut>,
    kill_reader: CancellationToken,
    kill_writer: CancellationToken,
    closing: bool,
}

impl Socket {
    fn close(mut self, code: u16, reason: &'static str) {
        self.closing = true;
        let _ = self.writer.try_send(WsOut::Close(code, reason));
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.kill_reader.cancel();
        if !self.closing {
            self.kill_writer.cancel();
        }
    }
}

/// Frames received but not yet taken by the connection.
const DELIVER_MAX: usize = 64;
/// Messages taken from the connection but not yet written, while a socket is attached: a slow
/// socket pushes back on the sessions, as with a plain link.
const UNWRITTEN_MAX: u64 = 256;
const WRITER_QUEUE: usize = 64;

pub(super) struct Owner {
    pub id: Arc<str>,
    pub settings: ResumeSettings,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
}

impl Owner {
    /// Runs the link until the connection ends, the client says goodbye, the grace period
    /// passes without a socket, the buffer overflows, or the daemon shuts down.
    pub async fn run(
        self,
        link_in: mpsc::Sender<InFrame>,
        mut link_out: mpsc::Receiver<acpd_wire::OutFrame>,
        mut ctl: mpsc::Receiver<Control>,
    ) {
        let ka = self.settings.keepalive;
        let (ev_tx, mut events) = mpsc::channel::<SockEvent>(DELIVER_MAX);
        let mut window = Window::new();
        let mut socket: Option<Socket> = None;
        let mut sock_no = 0u64;
        let mut to_deliver: VecDeque<InFrame> = VecDeque::new();
        let mut detached_at = Some(Instant::now());
        let mut last_heard = Instant::now();
        let mut last_ping = Instant::now();
        let mut ping_n = 0u64;
        let mut peer_done = false;
        // Whether this link counts in the detached gauge (no socket, waiting for its client).
        let mut counted_detached = false;
        let mut tick = tokio::time::interval(ka.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let end: &str = loop {
            let accept_out = !peer_done
                && if socket.is_some() {
                    window.unwritten() < UNWRITTEN_MAX
                } else {
                    true
                };
            let writer = socket.as_ref().map(|s| s.writer.clone());
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => {
                    if let Some(s) = socket.take() {
                        s.close(CloseReason::SHUTDOWN.code, CloseReason::SHUTDOWN.reason);
                    }
                    break "daemon shutting down";
                }
                c = ctl.recv() => match c {
                    Some(Control::Reserve { peer_received, reply }) => {
                        socket = None;
                        detached_at.get_or_insert_with(Instant::now);
                        let r = window.resume_from(peer_received).map(|()| window.received()).map_err(|e| {
                            tracing::info!(link = %self.id, error = %e, "resume refused");
                            Rejected::Gone
                        });
                        let _ = reply.send(r);
                    }
                    Some(Control::Attach { socket: ws, peer_received }) => {
                        if let Err(e) = window.resume_from(peer_received) {
                            tracing::info!(link = %self.id, error = %e, "stale resume; closing its socket");
                            continue;
                        }
                        sock_no += 1;
                        socket = Some(self.start_socket(*ws, sock_no, ev_tx.clone()));
                        detached_at = None;
                        last_heard = Instant::now();
                        tracing::debug!(link = %self.id, sock_no, from = peer_received, "socket attached");
                    }
                    None => break "registry gone",
                },
                Some(ev) = events.recv(), if to_deliver.len() < DELIVER_MAX => match ev {
                    SockEvent::Text(g, text) if socket.as_ref().is_some_and(|s| s.sock_no == g) => {
                        last_heard = Instant::now();
                        match self.on_frame(&text, &mut window, &mut to_deliver) {
                            Ok(Some(reply)) => { if let Some(s) = &socket { let _ = s.writer.try_send(WsOut::Text(reply)); } }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(link = %self.id, error = %e, "protocol error on a resumable link");
                                if let Some(s) = socket.take() {
                                    s.close(close_code::PROTOCOL, "acpd.resume.v1 violation");
                                }
                                break "protocol error";
                            }
                        }
                        if window.ack_urgent() && let Some(s) = &socket
                            && s.writer.try_send(WsOut::Text(window.ack_frame())).is_ok()
                        {
                            window.ack_sent_now();
                        }
                    }
                    SockEvent::Closed(g, code) if socket.as_ref().is_some_and(|s| s.sock_no == g) => {
                        // Our reader's own verdict on a frame too big to read: say so (1009).
                        if let Some(s) = socket.take() && code == Some(close_code::SIZE) {
                            s.close(CloseReason::TOO_BIG.code, CloseReason::TOO_BIG.reason);
                        }
                        if code == Some(close_code::NORMAL) {
                            break "client closed the link";
                        }
                        tracing::debug!(link = %self.id, ?code, "socket lost; link detached");
                        detached_at = Some(Instant::now());
                    }
                    _ => {} // from a socket already replaced
                },
                permit = writer_permit(writer), if window.has_unwritten() => {
                    if let (Some(p), Some(f)) = (permit, window.next_frame()) {
                        let w = p.send(WsOut::Text(f));
                        // The socket writer takes what it has room for now: one pass of this
                        // loop per burst.
                        while window.has_unwritten() {
                            let Ok(p) = w.try_reserve() else { break };
                            let Some(f) = window.next_frame() else { break };
                            p.send(WsOut::Text(f));
                        }
                    }
                }
                permit = link_in.reserve(), if !to_deliver.is_empty() => match permit {
                    Ok(p) => { if let Some(f) = to_deliver.pop_front() { p.send(f) } }
                    Err(_) => break "connection ended",
                },
                out = link_out.recv(), if accept_out => match out {
                    Some(m) => {
                        window.push(m);
                        // And what else the peer has queued, within the same bounds.
                        while socket.is_none() || window.unwritten() < UNWRITTEN_MAX {
                            match link_out.try_recv() {
                                Ok(m) => window.push(m),
                                Err(_) => break,
                            }
                        }
                        if window.buffered_bytes() > self.settings.max_buffer_bytes {
                            tracing::warn!(link = %self.id, bytes = window.buffered_bytes(), "resume buffer full; dropping the link (sessions stay journaled)");
                            break "buffer overflow";
                        }
                    }
                    None => peer_done = true,
                },
                _ = tick.tick() => {
                    if let Some(at) = detached_at && at.elapsed() > self.settings.grace {
                        break "grace period over";
                    }
                    // Frames waiting in `events` count as heard: the owner is the slow one.
                    if socket.is_some() && last_heard.elapsed() > ka * 3 && events.is_empty() {
                        tracing::info!(link = %self.id, "no keepalive answer; socket presumed dead, link detached");
                        socket = None;
                        detached_at = Some(Instant::now());
                    }
                    if let Some(s) = &socket {
                        if last_ping.elapsed() >= ka {
                            ping_n += 1;
                            last_ping = Instant::now();
                            let _ = s.writer.try_send(WsOut::Text(window::ping_frame(ping_n)));
                        }
                        if window.ack_due() && s.writer.try_send(WsOut::Text(window.ack_frame())).is_ok() {
                            window.ack_sent_now();
                        }
                    }
                }
            }
            if socket.is_none() != counted_detached {
                counted_detached = socket.is_none();
                let g = metrics::gauge!(crate::metrics::CONNECTIONS_DETACHED);
                if counted_detached {
                    g.increment(1)
                } else {
                    g.decrement(1)
                }
            }
            if peer_done && (socket.is_none() || !window.has_unwritten()) {
                // The connection ended on acpd's side (token revoked, client too slow or
                // flooding; a client's own 1000 ended the loop above): 1008, as plain sockets.
                if let Some(s) = socket.take() {
                    let r = if self.shutdown.is_cancelled() {
                        CloseReason::SHUTDOWN
                    } else {
                        CloseReason::CUT_OFF
                    };
                    s.close(r.code, r.reason);
                }
                break "connection ended";
            }
        };
        if counted_detached {
            metrics::gauge!(crate::metrics::CONNECTIONS_DETACHED).decrement(1);
        }
        tracing::debug!(link = %self.id, why = end, "resumable link ended");
        // What the client sent before leaving still reaches the connection.
        let flush = async {
            for f in to_deliver {
                if link_in.send(f).await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), flush).await;
    }

    /// Handles one frame; returns a control frame to answer with.
    fn on_frame(
        &self,
        text: &str,
        window: &mut Window,
        to_deliver: &mut VecDeque<InFrame>,
    ) -> Result<Option<String>, WindowError> {
        match window::parse(text)? {
            Frame::Data { seq, ack, msg } => {
                if let Some(a) = ack {
                    window.on_ack(a)?;
                }
                if window.on_data(seq)? {
                    let m = msg.get();
                    to_deliver.push_back(if m.len() > self.settings.max_message_bytes {
                        InFrame::TooLarge(m.len())
                    } else {
                        InFrame::Text(m.to_owned())
                    });
                }
                Ok(None)
            }
            Frame::Ack(a) => window.on_ack(a).map(|()| None),
            Frame::Ping(n) => Ok(Some(window::pong_frame(n))),
            Frame::Pong(_) => Ok(None),
        }
    }

    fn start_socket(&self, ws: WebSocket, sock_no: u64, events: mpsc::Sender<SockEvent>) -> Socket {
        let (mut sink, mut stream) = ws.split();
        let kill_reader = CancellationToken::new();
        let kill_writer = CancellationToken::new();
        let (tx, mut rx) = mpsc::channel::<WsOut>(WRITER_QUEUE);
        let k = kill_writer.clone();
        let deadline = crate::transport::write_deadline(self.settings.keepalive);
        let lost = events.clone();
        self.tasks.spawn(async move {
            // A message taken off the queue while gathering a burst, not yet handled.
            let mut taken: Option<WsOut> = None;
            loop {
                let out = match taken.take() {
                    Some(o) => Some(o),
                    None => tokio::select! {
                        _ = k.cancelled() => break,
                        o = rx.recv() => o,
                    },
                };
                match out {
                    Some(WsOut::Text(t)) => {
                        // Feed this frame and the text frames already queued, flush once:
                        // one socket write per burst while a turn streams.
                        let burst = async {
                            sink.feed(Message::Text(t.into())).await?;
                            for _ in 1..BURST {
                                match rx.try_recv() {
                                    Ok(WsOut::Text(t)) => {
                                        sink.feed(Message::Text(t.into())).await?
                                    }
                                    Ok(other) => {
                                        taken = Some(other);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                            sink.flush().await
                        };
                        let sent = tokio::select! {
                            _ = k.cancelled() => break,
                            r = tokio::time::timeout(deadline, burst) => r,
                        };
                        match sent {
                            Ok(Ok(())) => continue,
                            Ok(Err(e)) => tracing::debug!(error = %e, "resumable socket write failed"),
                            Err(_) => tracing::info!(?deadline, "resumable socket: write deadline passed (the client takes no bytes); detaching"),
                        }
                        // Tell the owner now rather than at the next keepalive check.
                        tokio::select! {
                            _ = k.cancelled() => {}
                            _ = lost.send(SockEvent::Closed(sock_no, None)) => {}
                        }
                        break;
                    }
                    Some(WsOut::Close(code, reason)) => {
                        let frame = CloseFrame {
                            code,
                            reason: reason.into(),
                        };
                        let close = async {
                            let _ = sink.send(Message::Close(Some(frame))).await;
                            let _ = sink.close().await;
                        };
                        let _ = tokio::time::timeout(deadline.min(Duration::from_secs(1)), close).await;
                        break;
                    }
                    None => break,
                }
            }
        });
        let k = kill_reader.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let code = loop {
                let msg = tokio::select! {
                    _ = k.cancelled() => return,
                    _ = shutdown.cancelled() => {
                        // So the socket is not reset with our close frame unread; bounded
                        // like the writer's close.
                        let drain = crate::transport::ws::linger(&mut stream);
                        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                        return;
                    }
                    m = stream.next() => m,
                };
                let text = match msg {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Close(f))) => break f.map(|f| f.code),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) if crate::transport::ws::is_too_big(&e) => {
                        break Some(close_code::SIZE);
                    }
                    Some(Err(_)) | None => break None,
                };
                tokio::select! {
                    _ = k.cancelled() => return,
                    r = events.send(SockEvent::Text(sock_no, text)) => if r.is_err() { return },
                }
            };
            let _ = events.send(SockEvent::Closed(sock_no, code)).await;
        });
        Socket {
            sock_no,
            writer: tx,
            kill_reader,
            kill_writer,
            closing: false,
        }
    }
}

/// Room in the current socket's writer queue; never ready without a socket.
async fn writer_permit(writer: Option<mpsc::Sender<WsOut>>) -> Option<mpsc::OwnedPermit<WsOut>> {
    match writer {
        Some(w) => w.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

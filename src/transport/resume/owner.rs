//! The owner task of one resumable link (daemon side). It holds the `Link` the connection
//! reads and writes, the window (numbering, unacked frames) and at most one socket at a time;
//! it outlives its sockets for the grace period.
//!
//! Each socket gets a reader and a writer task, so the owner never waits on the network: it
//! keeps reading acks while a write is stuck, a blackholed socket is noticed by the keepalive
//! instead of hanging the link, and a write the client takes no bytes of for the write deadline
//! detaches the link (the client resumes it).

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc::error::SendError;
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
        let shutdown = self.shutdown.clone();
        let (ev_tx, mut events) = mpsc::channel::<SockEvent>(DELIVER_MAX);
        let mut r = Running {
            owner: self,
            window: Window::new(),
            socket: None,
            sock_no: 0,
            events: ev_tx,
            to_deliver: VecDeque::new(),
            detached_at: Some(Instant::now()),
            last_heard: Instant::now(),
            last_ping: Instant::now(),
            ping_n: 0,
            peer_done: false,
            counted_detached: false,
        };
        let mut tick = tokio::time::interval(ka.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let end: &str = loop {
            let accept_out = r.accepts_out();
            let writer = r.socket.as_ref().map(|s| s.writer.clone());
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => r.on_shutdown(),
                c = ctl.recv() => r.on_control(c),
                Some(ev) = events.recv(), if r.to_deliver.len() < DELIVER_MAX => r.on_socket(ev),
                permit = writer_permit(writer), if r.window.has_unwritten() => r.on_writer_room(permit),
                permit = link_in.reserve(), if !r.to_deliver.is_empty() => r.on_link_in_room(permit),
                out = link_out.recv(), if accept_out => r.on_link_out(out, &mut link_out),
                _ = tick.tick() => r.on_tick(events.is_empty()),
            };
            if let ControlFlow::Break(why) = step {
                break why;
            }
            r.count_detached();
            if let ControlFlow::Break(why) = r.check_peer_done() {
                break why;
            }
        };
        if r.counted_detached {
            metrics::gauge!(crate::metrics::CONNECTIONS_DETACHED).decrement(1);
        }
        tracing::debug!(link = %r.owner.id, why = end, "resumable link ended");
        // What the client sent before leaving still reaches the connection.
        let flush = async {
            for f in r.to_deliver {
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
        let (sink, stream) = ws.split();
        let kill_reader = CancellationToken::new();
        let kill_writer = CancellationToken::new();
        let (tx, rx) = mpsc::channel::<WsOut>(WRITER_QUEUE);
        let deadline = crate::transport::write_deadline(self.settings.keepalive);
        self.tasks.spawn(write_socket(
            sink,
            rx,
            kill_writer.clone(),
            deadline,
            sock_no,
            events.clone(),
        ));
        self.tasks.spawn(read_socket(
            stream,
            kill_reader.clone(),
            self.shutdown.clone(),
            sock_no,
            events,
        ));
        Socket {
            sock_no,
            writer: tx,
            kill_reader,
            kill_writer,
            closing: false,
        }
    }
}

/// One socket's writer task: sends what the owner queues, a burst per write, until killed,
/// closed, or the write deadline passes.
async fn write_socket(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<WsOut>,
    k: CancellationToken,
    deadline: Duration,
    sock_no: u64,
    lost: mpsc::Sender<SockEvent>,
) {
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
                            Ok(WsOut::Text(t)) => sink.feed(Message::Text(t.into())).await?,
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
                    Err(_) => tracing::info!(
                        ?deadline,
                        "resumable socket: write deadline passed (the client takes no bytes); detaching"
                    ),
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
}

/// One socket's reader task: hands the owner each text frame, then how the socket ended.
async fn read_socket(
    mut stream: SplitStream<WebSocket>,
    k: CancellationToken,
    shutdown: CancellationToken,
    sock_no: u64,
    events: mpsc::Sender<SockEvent>,
) {
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
}

/// What one step of the owner's loop decided: go on, or end the link (and why).
type Step = ControlFlow<&'static str>;

/// The owner's state while its link runs: `Owner::run`'s select! loop hands each event to one
/// method here.
struct Running {
    owner: Owner,
    window: Window,
    socket: Option<Socket>,
    sock_no: u64,
    /// The sender each new socket's reader and writer report on.
    events: mpsc::Sender<SockEvent>,
    to_deliver: VecDeque<InFrame>,
    detached_at: Option<Instant>,
    last_heard: Instant,
    last_ping: Instant,
    ping_n: u64,
    peer_done: bool,
    /// Whether this link counts in the detached gauge (no socket, waiting for its client).
    counted_detached: bool,
}

impl Running {
    /// Whether to take more of the connection's output now.
    fn accepts_out(&self) -> bool {
        !self.peer_done
            && if self.socket.is_some() {
                self.window.unwritten() < UNWRITTEN_MAX
            } else {
                true
            }
    }

    fn on_shutdown(&mut self) -> Step {
        if let Some(s) = self.socket.take() {
            s.close(CloseReason::SHUTDOWN.code, CloseReason::SHUTDOWN.reason);
        }
        ControlFlow::Break("daemon shutting down")
    }

    fn on_control(&mut self, c: Option<Control>) -> Step {
        let id = &self.owner.id;
        match c {
            Some(Control::Reserve {
                peer_received,
                reply,
            }) => {
                self.socket = None;
                self.detached_at.get_or_insert_with(Instant::now);
                let r = self
                    .window
                    .resume_from(peer_received)
                    .map(|()| self.window.received())
                    .map_err(|e| {
                        tracing::info!(link = %id, error = %e, "resume refused");
                        Rejected::Gone
                    });
                let _ = reply.send(r);
            }
            Some(Control::Attach {
                socket: ws,
                peer_received,
            }) => {
                if let Err(e) = self.window.resume_from(peer_received) {
                    tracing::info!(link = %id, error = %e, "stale resume; closing its socket");
                    return ControlFlow::Continue(());
                }
                self.sock_no += 1;
                let sock_no = self.sock_no;
                self.socket = Some(self.owner.start_socket(*ws, sock_no, self.events.clone()));
                self.detached_at = None;
                self.last_heard = Instant::now();
                tracing::debug!(link = %id, sock_no, from = peer_received, "socket attached");
            }
            None => return ControlFlow::Break("registry gone"),
        }
        ControlFlow::Continue(())
    }

    fn on_socket(&mut self, ev: SockEvent) -> Step {
        let current = |g: u64| self.socket.as_ref().is_some_and(|s| s.sock_no == g);
        match ev {
            SockEvent::Text(g, text) if current(g) => {
                self.last_heard = Instant::now();
                match self
                    .owner
                    .on_frame(&text, &mut self.window, &mut self.to_deliver)
                {
                    Ok(Some(reply)) => {
                        if let Some(s) = &self.socket {
                            let _ = s.writer.try_send(WsOut::Text(reply));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(link = %self.owner.id, error = %e, "protocol error on a resumable link");
                        if let Some(s) = self.socket.take() {
                            s.close(close_code::PROTOCOL, "acpd.resume.v1 violation");
                        }
                        return ControlFlow::Break("protocol error");
                    }
                }
                if self.window.ack_urgent()
                    && let Some(s) = &self.socket
                    && s.writer
                        .try_send(WsOut::Text(self.window.ack_frame()))
                        .is_ok()
                {
                    self.window.ack_sent_now();
                }
            }
            SockEvent::Closed(g, code) if current(g) => {
                // Our reader's own verdict on a frame too big to read: say so (1009).
                if let Some(s) = self.socket.take()
                    && code == Some(close_code::SIZE)
                {
                    s.close(CloseReason::TOO_BIG.code, CloseReason::TOO_BIG.reason);
                }
                if code == Some(close_code::NORMAL) {
                    return ControlFlow::Break("client closed the link");
                }
                tracing::debug!(link = %self.owner.id, ?code, "socket lost; link detached");
                self.detached_at = Some(Instant::now());
            }
            _ => {} // from a socket already replaced
        }
        ControlFlow::Continue(())
    }

    fn on_writer_room(&mut self, permit: Option<mpsc::OwnedPermit<WsOut>>) -> Step {
        if let (Some(p), Some(f)) = (permit, self.window.next_frame()) {
            let w = p.send(WsOut::Text(f));
            // The socket writer takes what it has room for now: one pass of the loop per
            // burst.
            while self.window.has_unwritten() {
                let Ok(p) = w.try_reserve() else { break };
                let Some(f) = self.window.next_frame() else {
                    break;
                };
                p.send(WsOut::Text(f));
            }
        }
        ControlFlow::Continue(())
    }

    fn on_link_in_room(
        &mut self,
        permit: Result<mpsc::Permit<'_, InFrame>, SendError<()>>,
    ) -> Step {
        match permit {
            Ok(p) => {
                if let Some(f) = self.to_deliver.pop_front() {
                    p.send(f)
                }
                ControlFlow::Continue(())
            }
            Err(_) => ControlFlow::Break("connection ended"),
        }
    }

    fn on_link_out(
        &mut self,
        out: Option<acpd_wire::OutFrame>,
        link_out: &mut mpsc::Receiver<acpd_wire::OutFrame>,
    ) -> Step {
        let Some(m) = out else {
            self.peer_done = true;
            return ControlFlow::Continue(());
        };
        self.window.push(m);
        // And what else the peer has queued, within the same bounds.
        while self.socket.is_none() || self.window.unwritten() < UNWRITTEN_MAX {
            match link_out.try_recv() {
                Ok(m) => self.window.push(m),
                Err(_) => break,
            }
        }
        if self.window.buffered_bytes() > self.owner.settings.max_buffer_bytes {
            tracing::warn!(link = %self.owner.id, bytes = self.window.buffered_bytes(), "resume buffer full; dropping the link (sessions stay journaled)");
            return ControlFlow::Break("buffer overflow");
        }
        ControlFlow::Continue(())
    }

    /// The grace period, the keepalive (pings out, silence in) and the periodic ack.
    /// `no_events_waiting`: frames waiting in the event queue count as heard (the owner is the
    /// slow one).
    fn on_tick(&mut self, no_events_waiting: bool) -> Step {
        let ka = self.owner.settings.keepalive;
        if let Some(at) = self.detached_at
            && at.elapsed() > self.owner.settings.grace
        {
            return ControlFlow::Break("grace period over");
        }
        if self.socket.is_some() && self.last_heard.elapsed() > ka * 3 && no_events_waiting {
            tracing::info!(link = %self.owner.id, "no keepalive answer; socket presumed dead, link detached");
            self.socket = None;
            self.detached_at = Some(Instant::now());
        }
        if let Some(s) = &self.socket {
            if self.last_ping.elapsed() >= ka {
                self.ping_n += 1;
                self.last_ping = Instant::now();
                let _ = s
                    .writer
                    .try_send(WsOut::Text(window::ping_frame(self.ping_n)));
            }
            if self.window.ack_due()
                && s.writer
                    .try_send(WsOut::Text(self.window.ack_frame()))
                    .is_ok()
            {
                self.window.ack_sent_now();
            }
        }
        ControlFlow::Continue(())
    }

    /// Keeps the detached gauge in step with whether a socket is attached.
    fn count_detached(&mut self) {
        if self.socket.is_none() != self.counted_detached {
            self.counted_detached = self.socket.is_none();
            let g = metrics::gauge!(crate::metrics::CONNECTIONS_DETACHED);
            if self.counted_detached {
                g.increment(1)
            } else {
                g.decrement(1)
            }
        }
    }

    /// Ends the link once the connection has ended and its last output is written.
    fn check_peer_done(&mut self) -> Step {
        if self.peer_done && (self.socket.is_none() || !self.window.has_unwritten()) {
            // The connection ended on acpd's side (token revoked, client too slow or
            // flooding; a client's own 1000 ended the loop above): 1008, as plain sockets.
            if let Some(s) = self.socket.take() {
                let r = if self.owner.shutdown.is_cancelled() {
                    CloseReason::SHUTDOWN
                } else {
                    CloseReason::CUT_OFF
                };
                s.close(r.code, r.reason);
            }
            return ControlFlow::Break("connection ended");
        }
        ControlFlow::Continue(())
    }
}

/// Room in the current socket's writer queue; never ready without a socket.
async fn writer_permit(writer: Option<mpsc::Sender<WsOut>>) -> Option<mpsc::OwnedPermit<WsOut>> {
    match writer {
        Some(w) => w.reserve_owned().await.ok(),
        None => std::future::pending().await,
    }
}

//! The owner task of one resumable link (daemon side). It holds the `Link` the connection
//! reads and writes, the window (numbering, unacked frames) and at most one socket at a time;
//! it outlives its sockets for the grace period.
//!
//! The owner reads its socket in its own loop and writes it through one write in flight at a
//! time (a burst that borrows the write half and gives it back), so it never waits on the
//! network: it keeps reading acks while a write is stuck, a blackholed socket is noticed by
//! the keepalive instead of hanging the link, and a write the client takes no bytes of for the
//! write deadline detaches the link (the client resumes it). A socket costs no task and no
//! channel of its own; only its close runs in a task (`Socket::close`).

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, close_code};
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

/// The registry's and the upgrade handlers' end of an owner's control queue.
pub(super) type ControlTx = futures_channel::mpsc::Sender<Control>;

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

/// The socket attached to a link. The owner reads it in its own loop and writes it through a
/// write in flight that borrows the write half and gives it back, so the owner never waits on
/// the network and an idle link has no task or channel of its socket's (issue 45's idle
/// connection memory). Dropping it closes the socket at once (replaced, or dead); `close`
/// sends a close frame first.
struct Socket {
    stream: SplitStream<WebSocket>,
    /// The write half while no write is in flight; exactly one of `sink` and `writing` is set.
    sink: Option<SplitSink<WebSocket, Message>>,
    writing: Option<Writing>,
    /// Control frames (acks, pongs, pings) for the next write, at most `CONTROL_MAX`.
    control: VecDeque<String>,
}

/// A burst being written: it owns the write half until the burst is flushed or fails.
type Writing = Pin<Box<dyn Future<Output = Written> + Send>>;
type Written = (
    SplitSink<WebSocket, Message>,
    Result<Result<(), axum::Error>, tokio::time::error::Elapsed>,
);

impl Socket {
    fn new(ws: WebSocket) -> Socket {
        let (sink, stream) = ws.split();
        Socket {
            stream,
            sink: Some(sink),
            writing: None,
            control: VecDeque::new(),
        }
    }

    /// Queues a control frame; `false` (and it is dropped) when `CONTROL_MAX` are waiting:
    /// the client takes no bytes, and the write deadline or the keepalive ends the socket.
    fn queue(&mut self, frame: String) -> bool {
        if self.control.len() >= CONTROL_MAX {
            return false;
        }
        self.control.push_back(frame);
        true
    }

    /// Sends a close frame after the write in flight, then reads what the client still sends
    /// until its own close frame (a socket closed with unread input is reset, and the reset
    /// can throw away our close frame), all within `CLOSE_WAIT`, in a task of its own so the
    /// owner never waits for it.
    fn close(self, reason: CloseReason, tasks: &TaskTracker) {
        let Socket {
            mut stream,
            sink,
            writing,
            ..
        } = self;
        tasks.spawn(async move {
            let mut sink = match (sink, writing) {
                (Some(sink), _) => sink,
                (None, Some(w)) => w.await.0,
                (None, None) => return,
            };
            let close = crate::transport::ws::goodbye(&mut sink, &mut stream, reason);
            let _ = tokio::time::timeout(CLOSE_WAIT, close).await;
        });
    }

    /// Starts a write of the control frames waiting and of what the window has unwritten (up
    /// to `BURST` frames in all, one flush) when none is in flight.
    fn start_write(&mut self, window: &mut Window, deadline: Duration) {
        if self.writing.is_some() || (self.control.is_empty() && !window.has_unwritten()) {
            return;
        }
        let Some(mut sink) = self.sink.take() else {
            return;
        };
        let mut frames: Vec<String> = self.control.drain(..).collect();
        while frames.len() < BURST
            && let Some(f) = window.next_frame()
        {
            frames.push(f);
        }
        self.writing = Some(Box::pin(async move {
            let burst = async {
                for f in frames {
                    sink.feed(Message::Text(f.into())).await?;
                }
                sink.flush().await
            };
            let r = tokio::time::timeout(deadline, burst).await;
            (sink, r)
        }));
    }
}

/// The next frame of the attached socket; never ready without one.
async fn read(stream: Option<&mut SplitStream<WebSocket>>) -> Option<Result<Message, axum::Error>> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// The end of the write in flight; never ready without one.
async fn written(writing: Option<&mut Writing>) -> Written {
    match writing {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// Frames received but not yet taken by the connection.
const DELIVER_MAX: usize = 64;
/// Messages taken from the connection but not yet written, while a socket is attached: a slow
/// socket pushes back on the sessions, as with a plain link.
const UNWRITTEN_MAX: u64 = 256;
/// Control frames waiting for the next write.
const CONTROL_MAX: usize = 64;
/// Longest a closing socket's close frame and the client's reply may take.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

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
        mut ctl: futures_channel::mpsc::Receiver<Control>,
    ) {
        let ka = self.settings.keepalive;
        let shutdown = self.shutdown.clone();
        let deadline = crate::transport::write_deadline(ka);
        let mut r = Running {
            owner: self,
            window: Window::new(),
            socket: None,
            sock_no: 0,
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
            if let Some(s) = r.socket.as_mut() {
                s.start_write(&mut r.window, deadline);
            }
            let accept_out = r.accepts_out();
            let reading = r.to_deliver.len() < DELIVER_MAX;
            // The socket's read half and its write in flight, borrowed apart.
            let (stream, writing) = match r.socket.as_mut() {
                Some(Socket {
                    stream, writing, ..
                }) => (Some(stream), writing.as_mut()),
                None => (None, None),
            };
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => r.on_shutdown(),
                c = ctl.next() => r.on_control(c),
                w = written(writing) => r.on_written(w),
                m = read(stream), if reading => r.on_read(m),
                permit = link_in.reserve(), if !r.to_deliver.is_empty() => r.on_link_in_room(permit),
                out = link_out.recv(), if accept_out => r.on_link_out(out, &mut link_out),
                _ = tick.tick() => r.on_tick(reading),
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
        self.close(CloseReason::SHUTDOWN);
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
                self.socket = Some(Socket::new(*ws));
                self.detached_at = None;
                self.last_heard = Instant::now();
                tracing::debug!(link = %id, sock_no, from = peer_received, "socket attached");
            }
            None => return ControlFlow::Break("registry gone"),
        }
        ControlFlow::Continue(())
    }

    /// Closes the attached socket, if any, with `reason`.
    fn close(&mut self, reason: CloseReason) {
        if let Some(s) = self.socket.take() {
            s.close(reason, &self.owner.tasks);
        }
    }

    fn on_read(&mut self, msg: Option<Result<Message, axum::Error>>) -> Step {
        match msg {
            Some(Ok(Message::Text(t))) => self.on_text(&t),
            Some(Ok(Message::Close(f))) => self.on_closed(f.map(|f| f.code)),
            Some(Ok(_)) => ControlFlow::Continue(()),
            Some(Err(e)) if crate::transport::ws::is_too_big(&e) => {
                self.on_closed(Some(close_code::SIZE))
            }
            Some(Err(_)) | None => self.on_closed(None),
        }
    }

    fn on_text(&mut self, text: &str) -> Step {
        self.last_heard = Instant::now();
        let Some(s) = self.socket.as_mut() else {
            return ControlFlow::Continue(());
        };
        match self
            .owner
            .on_frame(text, &mut self.window, &mut self.to_deliver)
        {
            Ok(Some(reply)) => {
                s.queue(reply);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(link = %self.owner.id, error = %e, "protocol error on a resumable link");
                self.close(CloseReason {
                    code: close_code::PROTOCOL,
                    reason: "acpd.resume.v1 violation",
                });
                return ControlFlow::Break("protocol error");
            }
        }
        if self.window.ack_urgent() && s.queue(self.window.ack_frame()) {
            self.window.ack_sent_now();
        }
        ControlFlow::Continue(())
    }

    /// The socket ended; `Some(code)` when the client sent a close frame.
    fn on_closed(&mut self, code: Option<u16>) -> Step {
        if code == Some(close_code::SIZE) {
            // Our own verdict on a frame too big to read: say so (1009).
            self.close(CloseReason::TOO_BIG);
        }
        self.socket = None;
        if code == Some(close_code::NORMAL) {
            return ControlFlow::Break("client closed the link");
        }
        tracing::debug!(link = %self.owner.id, ?code, "socket lost; link detached");
        self.detached_at = Some(Instant::now());
        ControlFlow::Continue(())
    }

    /// A burst was written (the write half comes back), or it failed or passed the write
    /// deadline: the link is detached then (the client resumes it).
    fn on_written(&mut self, (sink, r): Written) -> Step {
        match r {
            Ok(Ok(())) => {
                if let Some(s) = self.socket.as_mut() {
                    s.writing = None;
                    s.sink = Some(sink);
                }
                return ControlFlow::Continue(());
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "resumable socket write failed"),
            Err(_) => tracing::info!(
                "resumable socket: write deadline passed (the client takes no bytes); detaching"
            ),
        }
        self.socket = None;
        self.detached_at = Some(Instant::now());
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
    /// `reading`: false while the connection has not taken what was read, and the socket is
    /// left unread meanwhile (the connection is the slow one, not the client).
    fn on_tick(&mut self, reading: bool) -> Step {
        let ka = self.owner.settings.keepalive;
        if let Some(at) = self.detached_at
            && at.elapsed() > self.owner.settings.grace
        {
            return ControlFlow::Break("grace period over");
        }
        if self.socket.is_some() && self.last_heard.elapsed() > ka * 3 && reading {
            tracing::info!(link = %self.owner.id, "no keepalive answer; socket presumed dead, link detached");
            self.socket = None;
            self.detached_at = Some(Instant::now());
        }
        if let Some(s) = self.socket.as_mut() {
            if self.last_ping.elapsed() >= ka {
                self.ping_n += 1;
                self.last_ping = Instant::now();
                s.queue(window::ping_frame(self.ping_n));
            }
            if self.window.ack_due() && s.queue(self.window.ack_frame()) {
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
            self.close(if self.owner.shutdown.is_cancelled() {
                CloseReason::SHUTDOWN
            } else {
                CloseReason::CUT_OFF
            });
            return ControlFlow::Break("connection ended");
        }
        ControlFlow::Continue(())
    }
}

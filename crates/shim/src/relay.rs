//! The shim's one loop: editor lines in, daemon frames out and back, reconnects.
//!
//! The loop owns everything mutable: the resumable window, the current socket, the restart
//! bookkeeping, the queues to stdout and of held editor messages. Sockets (`socket.rs`), stdin,
//! stdout and connection attempts are tasks that talk to it over bounded channels, so it never
//! waits on the network or on the editor. It takes what is ready per pass (up to a burst of
//! socket frames, as many stdout lines as the writer has room for).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use backon::ExponentialBackoff;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Exit;
use super::backoff::reconnect_backoff;
use super::bad_line;
use super::connect::{self, ConnectError, Connected, Target, Ws};
use super::editor::{FromDaemon, Tracker};
use super::frame;
use super::map::PathMap;
use super::mcp::{self, LocalMcp};
use super::socket::{self, SockEvent, Socket, WsOut, writer_permit};
use super::stdin::read_stdin;
use super::stdout::{OutLine, write_stdout};
use acpd_wire::lines::Line;
use acpd_wire::resume::window::{self, Frame, Window};
use acpd_wire::{OutFrame, send_ready};

/// Editor messages buffered for the daemon before stdin stops being read.
const BUFFER_MAX: usize = 64 << 20;
const HELD_MAX: usize = 1024;
const STDOUT_MAX: usize = 256;
/// Most socket frames handled in one pass of the relay loop.
const BURST: usize = 64;
/// After stdin closes: how long to finish sending what the editor wrote.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// After stdin closes: how long the answers the editor is still owed may take (an
/// `initialize` may have to start the agent; `printf … | acp-shim URL` must print it).
const ANSWER_WAIT: Duration = Duration::from_secs(15);

struct Relay {
    target: Arc<Target>,
    keepalive: Duration,
    tasks: TaskTracker,
    cancel: CancellationToken,
    window: Window,
    /// The link to resume; `None` until the first upgrade, and after the daemon forgot it.
    conn_id: Option<String>,
    tracker: Tracker,
    /// `--map`: paths rewritten between the editor's machine and the agent's.
    paths: PathMap,
    /// `--mcp local`: the editor's stdio MCP servers, run here for the agent.
    mcp: LocalMcp,
    socket: Option<Socket>,
    sock_no: u64,
    events: mpsc::Sender<SockEvent>,
    ever_connected: bool,
    backoff: ExponentialBackoff,
    /// Largest editor line; longer ones are answered -32600 here. The daemon enforces its own
    /// (smaller) limit with a proper error.
    max_line: usize,
    /// The daemon's message limit (its upgrade says; its default until then).
    daemon_max: usize,
    retry_at: Option<Instant>,
    connecting: Option<oneshot::Receiver<Result<Connected, ConnectError>>>,
    to_stdout: VecDeque<OutLine>,
    /// Editor messages waiting for a re-attach to finish.
    held: VecDeque<String>,
    /// The shim's own requests whose answers the re-attach waits for.
    recovering: HashSet<String>,
    last_heard: Instant,
    last_ping: Instant,
    pings: u64,
}

/// Runs the shim until stdin closes (exit 0) or something fatal happens.
pub async fn run(
    target: Target,
    paths: PathMap,
    mcp_policy: mcp::Policy,
    keepalive: Duration,
    max_line: usize,
) -> Exit {
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let (stdin_tx, mut stdin_rx) = mpsc::channel::<Line>(64);
    tasks.spawn(read_stdin(stdin_tx, max_line, cancel.clone()));
    let (stdout_tx, stdout_rx) = mpsc::channel::<OutLine>(STDOUT_MAX);
    let stdout_task = tokio::spawn(write_stdout(stdout_rx));
    let (events_tx, mut events) = mpsc::channel::<SockEvent>(64);
    let (mcp_tx, mut mcp_rx) = mpsc::channel::<String>(64);
    let mut r = Relay::new(
        target,
        paths,
        LocalMcp::new(mcp_policy, mcp_tx, tasks.clone(), cancel.clone()),
        keepalive,
        max_line,
        (tasks.clone(), cancel.clone()),
        events_tx,
    );
    r.start_connect();
    let mut stdin_open = true;
    let mut closing_since: Option<Instant> = None;
    let mut tick = tokio::time::interval(keepalive.min(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let exit = loop {
        let writer = r.socket.as_ref().map(|s| s.writer.clone());
        let take_stdin =
            stdin_open && r.held.len() < HELD_MAX && r.window.buffered_bytes() < BUFFER_MAX;
        let retry_at = r.retry_at;
        let result = tokio::select! {
            biased;
            line = stdin_rx.recv(), if take_stdin => match line {
                Some(l) => { r.on_editor(l); Ok(()) }
                None => {
                    tracing::debug!("stdin closed");
                    stdin_open = false;
                    closing_since = Some(Instant::now());
                    Ok(())
                }
            },
            Some(ev) = events.recv(), if r.to_stdout.len() < STDOUT_MAX => r.on_socket_burst(ev, &mut events),
            // Answers of the editor's MCP servers, for the daemon.
            Some(answer) = mcp_rx.recv(), if r.window.buffered_bytes() < BUFFER_MAX => {
                r.window.push(answer);
                Ok(())
            }
            permit = writer_permit(writer), if r.window.has_unwritten() && r.socket.is_some() => {
                if let (Some(p), Some(f)) = (permit, r.window.next_frame()) {
                    p.send(WsOut::Text(f));
                }
                Ok(())
            }
            permit = stdout_tx.reserve(), if !r.to_stdout.is_empty() => match permit {
                Ok(p) => { if let Some(m) = r.to_stdout.pop_front() { p.send(m) } send_ready(&mut r.to_stdout, &stdout_tx); Ok(()) }
                Err(_) => Err(Exit::Io("stdout closed".into())),
            },
            res = connected(r.connecting.as_mut()) => {
                r.connecting = None;
                r.on_connect(res.unwrap_or_else(|_| Err(ConnectError::Unreachable("connect task ended".into()))))
            }
            _ = sleep_until(retry_at), if r.connecting.is_none() => { r.start_connect(); Ok(()) }
            _ = tick.tick() => { r.on_tick(&events); Ok(()) }
        };
        if let Err(e) = result {
            break e;
        }
        if let Some(since) = closing_since
            && r.closing_done(since)
        {
            break Exit::Clean;
        }
    };
    wind_down(r, stdout_tx, stdout_task, cancel, tasks).await;
    exit
}

/// Everything already meant for the editor still goes out; then the shim's tasks end
/// (bounded).
async fn wind_down(
    mut r: Relay,
    stdout_tx: mpsc::Sender<OutLine>,
    stdout_task: tokio::task::JoinHandle<()>,
    cancel: CancellationToken,
    tasks: TaskTracker,
) {
    for m in r.to_stdout.drain(..) {
        if stdout_tx.send(m).await.is_err() {
            break;
        }
    }
    drop(stdout_tx);
    cancel.cancel();
    drop(r);
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stdout_task.await;
        tasks.wait().await;
    })
    .await;
}

impl Relay {
    fn new(
        target: Target,
        paths: PathMap,
        mcp: LocalMcp,
        keepalive: Duration,
        max_line: usize,
        (tasks, cancel): (TaskTracker, CancellationToken),
        events: mpsc::Sender<SockEvent>,
    ) -> Relay {
        Relay {
            target: Arc::new(target),
            keepalive,
            tasks,
            cancel,
            window: Window::new(),
            conn_id: None,
            tracker: Tracker::new(),
            paths,
            mcp,
            socket: None,
            sock_no: 0,
            events,
            ever_connected: false,
            backoff: reconnect_backoff(),
            max_line,
            daemon_max: acpd_wire::resume::DEFAULT_MAX_MESSAGE,
            retry_at: None,
            connecting: None,
            to_stdout: VecDeque::new(),
            held: VecDeque::new(),
            recovering: HashSet::new(),
            last_heard: Instant::now(),
            last_ping: Instant::now(),
            pings: 0,
        }
    }

    /// Whether the shim, its stdin closed `since` then, is done: its last messages are written
    /// and its editor's last requests answered (each bounded), or there is no link left.
    fn closing_done(&mut self, since: Instant) -> bool {
        let flushed =
            !self.window.has_unwritten() && self.held.is_empty() && self.recovering.is_empty();
        // The editor's last requests are answered before the link goes (bounded).
        let answered = self.tracker.owed() == 0 || since.elapsed() > ANSWER_WAIT;
        if flushed
            && answered
            && let Some(s) = self.socket.as_mut()
        {
            // A normal close tells acpd the link is done (no grace period to wait out).
            s.closing = true;
            let _ = s.writer.try_send(WsOut::Close(1000));
            return true;
        }
        let too_long = (!flushed && since.elapsed() > CLOSE_WAIT)
            || since.elapsed() > ANSWER_WAIT + CLOSE_WAIT;
        if (self.socket.is_none() && self.connecting.is_none()) || too_long {
            if self.window.has_unwritten() || !self.held.is_empty() {
                tracing::warn!("stdin closed while messages were still unsent to acpd");
            }
            return true;
        }
        false
    }

    fn on_editor(&mut self, line: Line) {
        // Never put what cannot be relayed inside a frame: answer the editor here, as a server
        // would, and go on.
        let too_big = || bad_line::over_daemon_limit(&line, self.daemon_max);
        if let Some(answer) = bad_line::answer(&line, self.max_line).or_else(too_big) {
            tracing::warn!("an editor line could not be relayed; answered with an error");
            self.to_stdout.push_back(answer.into());
            return;
        }
        let Line::Text(line) = line else { return };
        if let Err(e) = serde_json::from_str::<&RawValue>(&line) {
            self.to_stdout
                .push_back(bad_line::parse_error(&line, &e).into());
            return;
        }
        // JSON, but no message (a scalar, a batch): framed, acpd would close the link.
        if let Some(answer) = bad_line::not_an_object(&line) {
            tracing::warn!(
                "an editor line is JSON but not a JSON-RPC object; answered with an error"
            );
            self.to_stdout.push_back(answer.into());
            return;
        }
        let line = self.paths.editor_to_daemon(&line).unwrap_or(line);
        let line = self.mcp.editor_to_daemon(&line).unwrap_or(line);
        let Some(line) = self.tracker.note_editor(line) else {
            return;
        };
        if self.recovering.is_empty() {
            self.window.push(line);
        } else {
            self.held.push_back(line);
        }
    }

    /// Handles `first` and what else the socket's reader has queued, up to `BURST` and while
    /// the editor's queue has room: one pass of the loop per burst, not per frame, while a
    /// turn streams.
    fn on_socket_burst(
        &mut self,
        first: SockEvent,
        events: &mut mpsc::Receiver<SockEvent>,
    ) -> Result<(), Exit> {
        self.on_socket(first)?;
        for _ in 1..BURST {
            if self.to_stdout.len() >= STDOUT_MAX {
                break;
            }
            match events.try_recv() {
                Ok(ev) => self.on_socket(ev)?,
                Err(_) => break,
            }
        }
        Ok(())
    }

    fn on_socket(&mut self, ev: SockEvent) -> Result<(), Exit> {
        let current = |no: u64| self.socket.as_ref().is_some_and(|s| s.no == no);
        match ev {
            SockEvent::Text(no, text) if current(no) => {
                self.last_heard = Instant::now();
                self.on_frame(text)
                    .map_err(|e| Exit::Protocol(e.to_string()))?;
                if self.window.ack_urgent() {
                    self.send_ack();
                }
                Ok(())
            }
            SockEvent::Closed(no, close) if current(no) => {
                self.socket = None;
                match close {
                    Some((1001 | 1012, reason)) => {
                        tracing::info!(%reason, "acpd is restarting; reconnecting")
                    }
                    // 1008 (cut off: too slow, token revoked) is a reconnect: a revoked
                    // token is then refused (401, exit), a slow editor reloads.
                    Some((code @ (1002 | 1003 | 1007), reason)) => {
                        return Err(Exit::Protocol(format!(
                            "acpd closed the link ({code} {reason})"
                        )));
                    }
                    other => tracing::info!(close = ?other, "link to acpd lost; reconnecting"),
                }
                self.schedule_reconnect();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_frame(&mut self, text: Utf8Bytes) -> Result<(), window::WindowError> {
        // The hot path: `m` is written as it came; the tracker reads an update off its ends.
        if let Some((seq, ack, m)) = frame::split_data(&text) {
            self.window.on_ack(ack)?;
            if self.window.on_data(seq)? {
                self.deliver(OutLine::Slice(text, m))?;
            }
            return Ok(());
        }
        match window::parse(&text)? {
            Frame::Data { seq, ack, msg } => {
                if let Some(a) = ack {
                    self.window.on_ack(a)?;
                }
                if self.window.on_data(seq)? {
                    // `msg` is a slice of `text`: where it starts is how far it is into `text`.
                    let start = msg.get().as_ptr() as usize - text.as_ptr() as usize;
                    let m = start..start + msg.get().len();
                    self.deliver(OutLine::Slice(text.clone(), m))?;
                }
            }
            Frame::Ack(a) => self.window.on_ack(a)?,
            Frame::Ping(n) => {
                if let Some(s) = &self.socket {
                    let _ = s.writer.try_send(WsOut::Text(window::pong_frame(n)));
                }
            }
            Frame::Pong(_) => {}
        }
        Ok(())
    }

    fn deliver(&mut self, m: OutLine) -> Result<(), window::WindowError> {
        if let mcp::FromDaemon::Handled(answer) = self.mcp.daemon_to_editor(m.as_str()) {
            if let Some(a) = answer {
                self.window.push(a);
            }
            return Ok(());
        }
        match self.tracker.note_daemon(m.as_str()) {
            FromDaemon::Forward(None) => match self.paths.daemon_to_editor(m.as_str()) {
                None => self.to_stdout.push_back(m.one_line()),
                Some(mapped) => self.to_stdout.push_back(mapped.into()),
            },
            FromDaemon::Forward(Some(rewritten)) => {
                let mapped = self.paths.daemon_to_editor(&rewritten);
                self.to_stdout.push_back(mapped.unwrap_or(rewritten).into());
            }
            FromDaemon::NotJson => {
                let e = format!("a message that is not JSON: {:.200}", m.as_str());
                return Err(window::WindowError::Malformed(e));
            }
            FromDaemon::Private { id, ok, again } => {
                if !ok {
                    tracing::warn!(%id, "re-attach request failed: {}", m.as_str());
                }
                if let Some((pid, line)) = again {
                    self.recovering.insert(pid);
                    self.window.push(line);
                }
                if self.recovering.remove(&id) && self.recovering.is_empty() {
                    tracing::info!("re-attached; resuming the editor's traffic");
                    while let Some(h) = self.held.pop_front() {
                        self.window.push(h);
                    }
                }
            }
        }
        Ok(())
    }

    fn on_connect(&mut self, res: Result<Connected, ConnectError>) -> Result<(), Exit> {
        match res {
            Ok(c) => {
                let resumed = self.conn_id.is_some();
                self.window
                    .resume_from(c.peer_received)
                    .map_err(|e| Exit::Protocol(format!("cannot resume the link: {e}")))?;
                if !resumed {
                    self.conn_id = Some(c.conn_id.clone());
                }
                self.daemon_max = c.max_message.unwrap_or(self.daemon_max);
                tracing::info!(link = %c.conn_id, resumed, "connected to acpd");
                self.ever_connected = true;
                self.backoff = reconnect_backoff();
                self.start_socket(c.ws);
                Ok(())
            }
            Err(ConnectError::Gone) if self.conn_id.is_some() => {
                self.restart();
                self.retry_at = Some(Instant::now());
                Ok(())
            }
            Err(e) if e.retryable() && self.ever_connected => {
                tracing::info!(error = %e, "reconnect failed; retrying");
                self.schedule_reconnect();
                Ok(())
            }
            Err(e) => Err(match e {
                ConnectError::Unreachable(m) => Exit::Unavailable(m),
                ConnectError::Auth(s) => Exit::Auth(format!(
                    "acpd refused the token ({s}); check --token-file or ACPD_TOKEN"
                )),
                ConnectError::Tls(m) => Exit::Tls(m),
                ConnectError::NotFound(m) => {
                    Exit::Usage(format!("acpd has no such endpoint or agent profile ({m})"))
                }
                ConnectError::Gone => Exit::Protocol("a new link was answered 410".into()),
                ConnectError::Protocol(m) => Exit::Protocol(m),
            }),
        }
    }

    /// The daemon no longer knows the link: start a new one and re-attach the sessions.
    fn restart(&mut self) {
        let unsent = self.window.take_unwritten();
        let unsent = unsent.into_iter().map(OutFrame::into_string).collect();
        self.window = Window::new();
        self.conn_id = None;
        let plan = self.tracker.on_restart(unsent, self.mcp.claims());
        tracing::warn!(
            sessions = self.tracker.open_sessions(),
            answered = plan.answers.len(),
            "acpd restarted (or the link expired): re-attaching sessions"
        );
        self.to_stdout
            .extend(plan.answers.into_iter().map(OutLine::from));
        for m in plan.resend {
            self.window.push(m);
        }
        let mut held: VecDeque<String> = plan.requeued.into();
        held.append(&mut self.held);
        self.recovering = plan.private;
        if self.recovering.is_empty() {
            for m in held {
                self.window.push(m);
            }
        } else {
            self.held = held;
        }
    }

    fn on_tick(&mut self, events: &mpsc::Receiver<SockEvent>) {
        let Some(s) = &self.socket else { return };
        if self.last_heard.elapsed() > self.keepalive * 3 && events.is_empty() {
            tracing::info!("acpd stopped answering (keepalive); reconnecting");
            self.socket = None;
            self.backoff = reconnect_backoff();
            self.retry_at = Some(Instant::now());
            return;
        }
        if self.last_ping.elapsed() >= self.keepalive {
            self.pings += 1;
            self.last_ping = Instant::now();
            let _ = s
                .writer
                .try_send(WsOut::Text(window::ping_frame(self.pings)));
        }
        if self.window.ack_due() {
            self.send_ack();
        }
    }

    fn send_ack(&mut self) {
        if let Some(s) = &self.socket
            && s.writer
                .try_send(WsOut::Text(self.window.ack_frame()))
                .is_ok()
        {
            self.window.ack_sent_now();
        }
    }

    fn schedule_reconnect(&mut self) {
        // `without_max_times`: the schedule never runs out; the cap is only a fallback.
        let wait = self.backoff.next().unwrap_or(Duration::from_secs(5));
        self.retry_at = Some(Instant::now() + wait);
    }

    fn start_connect(&mut self) {
        self.retry_at = None;
        let target = self.target.clone();
        let resume = self.conn_id.clone().map(|id| (id, self.window.received()));
        let (tx, rx) = oneshot::channel();
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            let attempt = connect::connect(&target, resume.as_ref().map(|(i, n)| (i.as_str(), *n)));
            tokio::select! {
                _ = cancel.cancelled() => {}
                r = attempt => { let _ = tx.send(r); }
            }
        });
        self.connecting = Some(rx);
    }

    fn start_socket(&mut self, ws: Ws) {
        self.sock_no += 1;
        let events = self.events.clone();
        self.socket = Some(socket::start(ws, self.sock_no, &self.tasks, events));
        self.last_heard = Instant::now();
        self.last_ping = Instant::now();
    }
}

async fn connected(
    rx: Option<&mut oneshot::Receiver<Result<Connected, ConnectError>>>,
) -> Result<Result<Connected, ConnectError>, oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

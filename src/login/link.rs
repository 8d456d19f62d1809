//! One remote login from start to end: the command resolved and started in a terminal, then
//! one `select!` loop that carries the terminal and the forwarded ports over the socket until
//! the login exits, the client leaves, the timeout passes or acpd stops.

use std::collections::BTreeSet;
use std::time::Duration;

use acpd_wire::login::{Control, Data};
use axum::extract::ws::{Message, WebSocket};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::pty::{Ended, Pty};
use super::tunnel::{TunnelEvent, Tunnels};
use super::urls::UrlScanner;
use crate::config::AgentProfile;

/// How often the login's listening ports are looked up.
const PORT_POLL: Duration = Duration::from_millis(200);
/// How long output and forwarded answers may still come after the login exited.
const DRAIN: Duration = Duration::from_secs(2);
/// The exit code of a login acpd ended, as `timeout(1)` has it.
const TIMED_OUT: i32 = 124;

/// What one login runs with.
pub struct Run {
    pub principal_name: String,
    pub profile: AgentProfile,
    pub cols: u16,
    pub rows: u16,
    pub shutdown: CancellationToken,
}

/// Runs the login on `socket` to its end.
pub async fn run(mut socket: WebSocket, run: Run) {
    let login = match crate::agent::login::command_for(&run.profile).await {
        Ok(c) => c,
        Err(e) => return fail(&mut socket, e.to_string()).await,
    };
    let shown = shell_words::join(std::iter::once(&login.program).chain(&login.args));
    let pty = match super::pty::spawn(&login, &run.profile, run.cols, run.rows) {
        Ok(p) => p,
        Err(e) => return fail(&mut socket, e.to_string()).await,
    };
    tracing::info!(target: "acpd::audit", principal = %run.principal_name, agent = %run.profile.name, command = %shown, "remote login started");
    let started = Control::Started { command: shown };
    let (tun_tx, tun_rx) = mpsc::channel(64);
    let mut state = State {
        socket,
        pty,
        urls: UrlScanner::default(),
        ports: BTreeSet::new(),
        tunnels: Tunnels::new(tun_tx),
        tunnel_events: tun_rx,
        ended: None,
    };
    if state.send_control(&started).await.is_err() {
        return;
    }
    let (code, message) = state.run(run.profile.login_timeout, &run.shutdown).await;
    tracing::info!(target: "acpd::audit", principal = %run.principal_name, agent = %run.profile.name, code, reason = message.as_deref().unwrap_or("exited"), "remote login ended");
    let _ = state.send_control(&Control::Exit { code, message }).await;
    let _ = state.socket.send(Message::Close(None)).await;
}

async fn fail(socket: &mut WebSocket, message: String) {
    let text = serde_json::to_string(&Control::Error { message }).unwrap_or_default();
    let _ = socket.send(Message::Text(text.into())).await;
    let _ = socket.send(Message::Close(None)).await;
}

/// Everything the loop waits on.
enum Event {
    FromClient(Option<Message>),
    Output(Option<Vec<u8>>),
    Exited(Ended),
    Tunnel(TunnelEvent),
    PollPorts,
    /// The login exited and its output had `DRAIN` to finish.
    Drained,
    Timeout,
    Shutdown,
}

struct State {
    socket: WebSocket,
    pty: Pty,
    urls: UrlScanner,
    ports: BTreeSet<u16>,
    tunnels: Tunnels,
    tunnel_events: mpsc::Receiver<TunnelEvent>,
    ended: Option<Ended>,
}

/// Why the loop stops: the exit code and what to say about it.
type Outcome = (i32, Option<String>);

impl State {
    async fn run(&mut self, timeout: Duration, shutdown: &CancellationToken) -> Outcome {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut poll = tokio::time::interval(PORT_POLL);
        let mut output_open = true;
        let drain = tokio::time::sleep(Duration::MAX);
        tokio::pin!(drain);
        loop {
            let exited = self.ended.is_some();
            let event = tokio::select! {
                m = self.socket.recv() => Event::FromClient(m.and_then(Result::ok)),
                o = self.pty.output.recv(), if output_open => Event::Output(o),
                e = &mut self.pty.exited, if !exited => Event::Exited(e.unwrap_or(Ended { code: 1, signal: None })),
                Some(t) = self.tunnel_events.recv() => Event::Tunnel(t),
                _ = poll.tick(), if !exited => Event::PollPorts,
                _ = &mut deadline, if !exited => Event::Timeout,
                _ = &mut drain, if exited => Event::Drained,
                _ = shutdown.cancelled() => Event::Shutdown,
            };
            match event {
                Event::FromClient(Some(m)) => self.on_client(m).await,
                Event::FromClient(None) => {
                    self.pty.kill();
                    return (1, Some("the terminal went away".into()));
                }
                Event::Output(Some(bytes)) => self.on_output(bytes).await,
                Event::Output(None) => output_open = false,
                Event::Exited(e) => {
                    self.ended = Some(e);
                    drain.as_mut().reset(tokio::time::Instant::now() + DRAIN);
                }
                Event::Drained => {}
                Event::Tunnel(t) => self.on_tunnel(t).await,
                Event::PollPorts => self.poll_ports().await,
                Event::Timeout => {
                    self.pty.kill();
                    let secs = timeout.as_secs();
                    return (TIMED_OUT, Some(format!("timed out after {secs} s")));
                }
                Event::Shutdown => {
                    self.pty.kill();
                    return (1, Some("acpd is shutting down".into()));
                }
            }
            // Exited, and its output and its callbacks' answers are all out (or are taking
            // too long): done.
            if let Some(e) = &self.ended
                && ((!output_open && self.tunnels.all_carried()) || drain.is_elapsed())
            {
                let message = e.signal.clone().map(|s| format!("ended by {s}"));
                return (e.code, message);
            }
        }
    }

    async fn on_client(&mut self, m: Message) {
        match m {
            Message::Binary(b) => match Data::decode(&b) {
                Some(Data::Terminal(bytes)) => {
                    self.pty.type_in(bytes.to_vec()).await;
                }
                Some(Data::Tunnel { conn, bytes }) => {
                    self.tunnels.write(conn, bytes.to_vec()).await
                }
                None => {}
            },
            Message::Text(t) => match serde_json::from_str::<Control>(&t) {
                Ok(Control::Resize { cols, rows }) => self.pty.resize(cols, rows),
                Ok(Control::Open { conn, port }) if self.ports.contains(&port) => {
                    self.tunnels.open(conn, port)
                }
                // Only the login's own ports are reachable.
                Ok(Control::Open { conn, .. }) => {
                    let _ = self.send_control(&Control::Close { conn }).await;
                }
                Ok(Control::Close { conn }) => self.tunnels.close(conn),
                _ => {}
            },
            _ => {}
        }
    }

    async fn on_output(&mut self, bytes: Vec<u8>) {
        for url in self.urls.feed(&bytes) {
            let _ = self.send_control(&Control::Url { url }).await;
        }
        let _ = self
            .socket
            .send(Message::Binary(Data::Terminal(&bytes).encode().into()))
            .await;
    }

    async fn on_tunnel(&mut self, (conn, bytes): TunnelEvent) {
        let _ = match bytes {
            Some(bytes) => {
                let frame = Data::Tunnel {
                    conn,
                    bytes: &bytes,
                }
                .encode();
                self.socket.send(Message::Binary(frame.into())).await
            }
            None => {
                self.tunnels.ended(conn);
                self.send_control(&Control::Close { conn }).await
            }
        };
    }

    async fn poll_ports(&mut self) {
        let Some(pid) = self.pty.pid() else {
            return;
        };
        let now = tokio::task::spawn_blocking(move || super::ports::listening(pid))
            .await
            .unwrap_or_default();
        for port in now.difference(&self.ports).copied().collect::<Vec<_>>() {
            tracing::debug!(port, "the login listens; forwarding it");
            let _ = self.send_control(&Control::Listening { port }).await;
        }
        self.ports.extend(now);
    }

    async fn send_control(&mut self, c: &Control) -> Result<(), axum::Error> {
        let text = serde_json::to_string(c).unwrap_or_default();
        self.socket.send(Message::Text(text.into())).await
    }
}

//! `acp-shim … --login NAME`: runs agent NAME's login on the daemon's host, in this terminal.
//!
//! An editor that runs terminal logins (`clientCapabilities.auth.terminal`) re-runs its agent
//! command — acp-shim with the daemon's URL — with the auth method's `args`, which acpd made
//! `--login NAME`. The shim opens the login link (`acpd_wire::login`) with the same URL and
//! token, puts the terminal in raw mode and carries it both ways (size included, Ctrl-C as the
//! byte it is), listens here on each loopback port the login listens on there and carries its
//! connections (an OAuth redirect to `http://localhost:PORT/…` then reaches the login), opens
//! the URLs the login prints in this machine's browser, and exits with the login's status.

mod forward;
mod terminal;

use std::process::Command;

use acpd_wire::login::{Control, Data};
use futures_util::{SinkExt, StreamExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use crate::Exit;
use crate::connect::{self, Target, Ws};
use forward::{Forwarded, Forwards};

/// How long the answers forwarded to local connections may take to go out at the end.
const FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// How a login run ends: the login's own exit status, or the shim's failure.
pub enum Ended {
    Status(i32),
    Failed(Exit),
}

/// Runs the login of `agent` on `target`'s daemon.
pub async fn run(mut target: Target, agent: &str) -> Ended {
    if agent.is_empty()
        || !agent
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Ended::Failed(Exit::Usage(format!("invalid --login {agent:?}")));
    }
    let (cols, rows) = terminal::size();
    let path = match target.uri.path() {
        "" | "/" => "/acp",
        p => p,
    };
    let authority = target
        .uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let scheme = target.uri.scheme_str().unwrap_or("ws").to_owned();
    let uri = format!(
        "{scheme}://{authority}{path}{}?agent={agent}&cols={cols}&rows={rows}",
        acpd_wire::login::PATH_SUFFIX
    );
    target.uri = match uri.parse() {
        Ok(u) => u,
        Err(e) => return Ended::Failed(Exit::Usage(format!("invalid URL {uri:?}: {e}"))),
    };
    let ws = match connect::connect_login(&target).await {
        Ok(ws) => ws,
        Err(e) => return Ended::Failed(e),
    };
    let host = std::env::var("ACP_SHIM_FORWARD_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let (fwd_tx, fwd_rx) = mpsc::channel(64);
    let mut login = Login {
        ws,
        forwards: Forwards::new(host, fwd_tx),
        forwarded: fwd_rx,
    };
    let _raw = terminal::RawMode::enter();
    login.run().await
}

struct Login {
    ws: Ws,
    forwards: Forwards,
    forwarded: mpsc::Receiver<Forwarded>,
}

/// What the loop waits on.
enum Event {
    Key(Option<Vec<u8>>),
    FromDaemon(Option<Message>),
    Forwarded(Forwarded),
    Resized,
}

impl Login {
    async fn run(&mut self) -> Ended {
        let mut keys = terminal::keystrokes();
        let mut keys_open = true;
        let mut winch = signal(SignalKind::window_change()).ok();
        loop {
            let event = tokio::select! {
                k = keys.recv(), if keys_open => Event::Key(k),
                m = self.ws.next() => Event::FromDaemon(m.and_then(Result::ok)),
                Some(f) = self.forwarded.recv() => Event::Forwarded(f),
                Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => None } } => Event::Resized,
            };
            match event {
                Event::Key(Some(bytes)) => self.send_data(Data::Terminal(&bytes)).await,
                // No more input (stdin closed): the login goes on; it may not need any.
                Event::Key(None) => keys_open = false,
                Event::FromDaemon(Some(m)) => {
                    if let Some(end) = self.on_daemon(m).await {
                        self.forwards.finish(FLUSH).await;
                        return end;
                    }
                }
                Event::FromDaemon(None) => {
                    return Ended::Failed(Exit::Unavailable(
                        "the daemon closed the login link before the login ended".into(),
                    ));
                }
                Event::Forwarded(f) => self.on_forwarded(f).await,
                Event::Resized => {
                    let (cols, rows) = terminal::size();
                    self.send_control(&Control::Resize { cols, rows }).await;
                }
            }
        }
    }

    async fn on_daemon(&mut self, m: Message) -> Option<Ended> {
        match m {
            Message::Binary(b) => match Data::decode(&b) {
                Some(Data::Terminal(bytes)) => terminal::show(bytes),
                Some(Data::Tunnel { conn, bytes }) => {
                    self.forwards.write(conn, bytes.to_vec()).await
                }
                None => {}
            },
            Message::Text(t) => match serde_json::from_str::<Control>(&t) {
                Ok(c) => return self.on_control(c).await,
                Err(e) => tracing::debug!(error = %e, "unknown login control message"),
            },
            Message::Close(_) => {
                return Some(Ended::Failed(Exit::Unavailable(
                    "the daemon closed the login link before the login ended".into(),
                )));
            }
            _ => {}
        }
        None
    }

    async fn on_control(&mut self, c: Control) -> Option<Ended> {
        match c {
            Control::Started { command } => {
                terminal::say(&format!("running `{command}` on the acpd host"));
            }
            Control::Listening { port } => {
                if let Err(e) = self.forwards.listen(port).await {
                    terminal::say(&format!(
                        "cannot forward port {port} from this machine ({e}); a browser here cannot reach the login's callback"
                    ));
                }
            }
            Control::Url { url } => open_url(&url),
            Control::Close { conn } => self.forwards.close(conn),
            Control::Exit { code, message } => {
                if let Some(m) = message {
                    terminal::say(&format!("the login ended: {m}"));
                }
                return Some(Ended::Status(code));
            }
            Control::Error { message } => {
                terminal::say(&message);
                return Some(Ended::Status(1));
            }
            Control::Resize { .. } | Control::Open { .. } => {}
        }
        None
    }

    async fn on_forwarded(&mut self, f: Forwarded) {
        match f {
            Forwarded::Accepted { port, stream } => {
                let conn = self.forwards.carry(stream);
                self.send_control(&Control::Open { conn, port }).await;
            }
            Forwarded::Bytes {
                conn,
                bytes: Some(bytes),
            } => {
                self.send_data(Data::Tunnel {
                    conn,
                    bytes: &bytes,
                })
                .await
            }
            Forwarded::Bytes { conn, bytes: None } => {
                self.send_control(&Control::Close { conn }).await
            }
        }
    }

    async fn send_data(&mut self, d: Data<'_>) {
        let _ = self.ws.send(Message::Binary(d.encode().into())).await;
    }

    async fn send_control(&mut self, c: &Control) {
        let text = serde_json::to_string(c).unwrap_or_default();
        let _ = self.ws.send(Message::Text(text.into())).await;
    }
}

/// Opens a URL the login printed in this machine's browser: `ACP_SHIM_BROWSER` (a program
/// given the URL; empty: none), else the system's (`opener`). Loopback URLs are the login's
/// own callback, not a page to open. What cannot be opened is printed.
fn open_url(url: &str) {
    if is_loopback(url) {
        return;
    }
    let opened = match std::env::var("ACP_SHIM_BROWSER") {
        Ok(b) if b.is_empty() => false,
        Ok(b) => Command::new(&b)
            .arg(url)
            .stdin(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        Err(_) => opener::open_browser(url).is_ok(),
    };
    if opened {
        terminal::say(&format!("opened {url} in the browser"));
    } else {
        terminal::say(&format!("open this URL in a browser: {url}"));
    }
}

/// Whether `url` points at loopback (the login's own callback).
fn is_loopback(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    matches!(host, "localhost" | "127.0.0.1" | "[::1]")
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn only_the_logins_own_callback_urls_are_loopback() {
        assert!(is_loopback("http://localhost:8085/callback?code=x"));
        assert!(is_loopback("http://127.0.0.1:1455/auth"));
        assert!(is_loopback("http://[::1]:9000"));
        assert!(!is_loopback(
            "https://accounts.example.com/o/oauth2?redirect_uri=http://localhost:1"
        ));
        assert!(!is_loopback("https://localhost.example.com/"));
    }
}

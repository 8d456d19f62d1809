//! HTTP connections on the daemon's own accept loop (plain and TLS alike), for every
//! listener (main, metrics, the MCP tunnel): each socket admitted by `gate`, then hyper-util's
//! HTTP/1 builder with a header read timeout (HTTP/2 where TLS negotiated `h2`). A slowloris
//! client (half a request line, or nothing at all) holds one pending slot for at most
//! `header_read_timeout`, and over the gate's caps an older pending connection makes room, so
//! descriptors and memory stay bounded while authenticated connections go on.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use super::gate::{Gate, Pass};

/// Pause after a failed `accept` (e.g. out of file descriptors) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// HTTP/2 PINGs on a quiet connection, and how long an answer may take: a peer that is gone
/// is noticed (its SSE streams end) even when nothing else is sent.
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Which HTTP a connection speaks: TLS's ALPN chose it; plain TCP is HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    /// Streamable HTTP (POST, SSE, DELETE) only: WebSockets over HTTP/2 (RFC 8441) are not
    /// offered, WebSocket clients negotiate `http/1.1`.
    Http2,
}

/// The next accepted socket, with TCP_NODELAY on; `None` once `shutdown` fires. Every
/// listener (plain, TLS, raw TCP) accepts through this.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // Out of descriptors: retrying at once would spin.
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // Without TCP_NODELAY, a frame written right after another (a prompt's answer after
        // its last update) waits for the peer's delayed ACK: up to 40 ms on Linux.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        return Some((stream, peer));
    }
}

/// Listen backlog of every listener (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: libc::c_int = 4096;

/// Raises `listener`'s accept backlog from tokio's 1024. Under a flood of sockets that
/// reconnect as the gate displaces them, a full backlog drops a real client's handshake and
/// its SYN is retried only a second later; a deeper one keeps it queued instead. The
/// listeners come bound (by `cli`, the tests), and `listen(2)` on a listening socket just
/// sets the new backlog.
pub fn deepen_backlog(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor `listener` owns for this call.
    if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot deepen the listen backlog");
    }
}

/// Serves `app` over plain TCP until `shutdown` fires.
pub async fn serve_plain(
    listener: TcpListener,
    app: Router,
    gate: Gate,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    deepen_backlog(&listener);
    while let Some((stream, peer, pass)) = accept_gated(&listener, &gate, &shutdown).await {
        tasks.spawn(serve_connection(
            TokioIo::new(stream),
            Protocol::Http1,
            peer,
            pass,
            app.clone(),
            gate.header_read_timeout,
            tasks.clone(),
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// The next accepted socket the gate admits (those it refuses are closed here); `None` once
/// `shutdown` fires. Every listener accepts through this.
pub async fn accept_gated(
    listener: &TcpListener,
    gate: &Gate,
    shutdown: &CancellationToken,
) -> Option<(TcpStream, SocketAddr, Pass)> {
    loop {
        let (stream, peer) = accept(listener, shutdown).await?;
        if let Some(pass) = gate.admit(peer) {
            return Some((stream, peer, pass));
        }
    }
}

/// HTTP/1 (with upgrades) or HTTP/2 on one connection. Each request carries a clone of
/// `pass` (an extension): a handler that authenticates the connection for good (an SSE
/// stream) takes it out of the pending pool, an upgraded WebSocket keeps it counted. A
/// connection still pending when the gate displaces it is closed at once.
#[allow(clippy::too_many_arguments)]
pub async fn serve_connection<I>(
    io: TokioIo<I>,
    protocol: Protocol,
    peer: SocketAddr,
    pass: Pass,
    app: Router,
    header_read_timeout: Duration,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let builder = auto::Builder::new(Tracked(tasks));
    // One protocol, chosen before: `auto`'s sniffing would wait for bytes without a deadline.
    let builder = match protocol {
        // WebSockets need HTTP/1. The timer makes the header read timeout work; it also runs
        // while a kept-alive connection waits for its next request.
        Protocol::Http1 => {
            let mut builder = builder.http1_only();
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            builder
        }
        Protocol::Http2 => {
            let mut builder = builder.http2_only();
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(H2_PING_INTERVAL)
                .keep_alive_timeout(H2_PING_TIMEOUT);
            builder
        }
    };
    let extension = pass.clone();
    // What a request logs (an audit line above all) names the client's address. An error
    // span, so that a `warn` filter does not drop it from the warnings it frames.
    let span = tracing::error_span!("conn", %peer);
    // Each request carries the pass, and counts as being answered until its response is
    // ready (the gate then displaces idle sockets of its source before it).
    let app = tower::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let serving = extension.serving();
        req.extensions_mut().insert(extension.clone());
        let response = tower::ServiceExt::oneshot(app.clone(), req);
        tracing::Instrument::instrument(
            async move {
                let response = response.await;
                drop(serving);
                response
            },
            span.clone(),
        )
    });
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        _ = pass.evicted() => {
            tracing::debug!(%peer, "pending connection displaced by newer ones: closed");
            return;
        }
    };
    drop(pass);
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
    }
}

/// hyper's executor on the server's `TaskTracker`, so shutdown waits for what it spawns.
#[derive(Clone)]
struct Tracked(TaskTracker);

impl<F> hyper::rt::Executor<F> for Tracked
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        self.0.spawn(fut);
    }
}

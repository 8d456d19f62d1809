//! HTTP connections on the daemon's own accept loop (plain and TLS alike): hyper-util's
//! HTTP/1 builder with a header read timeout (HTTP/2 where TLS negotiated `h2`), and a cap on
//! connections that have not been upgraded yet. A slowloris client (half a request line, or nothing at all) holds one
//! pending slot for at most `header_read_timeout`; beyond `max_pending_connections` new
//! connections are closed at accept, so descriptors and memory stay bounded while
//! established WebSockets (which left the pending set at their 101) go on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// The accept-time limits, shared by the plain and the TLS listener.
#[derive(Clone)]
pub struct Gate {
    pub header_read_timeout: Duration,
    /// `None`: no cap.
    pending: Option<Arc<Semaphore>>,
}

/// A pending slot: held from accept until the connection is upgraded or ends.
pub struct Slot(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl Gate {
    pub fn new(header_read_timeout: Duration, max_pending: usize) -> Gate {
        Gate {
            header_read_timeout,
            pending: (max_pending > 0).then(|| Arc::new(Semaphore::new(max_pending))),
        }
    }

    /// A slot for a new connection, or `None` when all are taken (close it).
    pub fn admit(&self) -> Option<Slot> {
        match &self.pending {
            None => Some(Slot(None)),
            Some(s) => s.clone().try_acquire_owned().ok().map(|p| Slot(Some(p))),
        }
    }
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

/// Serves `app` over plain TCP until `shutdown` fires.
pub async fn serve_plain(
    listener: TcpListener,
    app: Router,
    gate: Gate,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    while let Some((stream, peer)) = accept(&listener, &shutdown).await {
        let Some(slot) = gate.admit() else {
            refused(peer);
            continue;
        };
        tasks.spawn(serve_connection(
            TokioIo::new(stream),
            Protocol::Http1,
            peer,
            slot,
            app.clone(),
            gate.header_read_timeout,
            tasks.clone(),
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// Logs (and counts) a connection closed at accept because the pending slots are taken.
pub fn refused(peer: SocketAddr) {
    metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
    tracing::warn!(%peer, "too many connections not yet upgraded: closed at accept");
}

/// HTTP/1 (with upgrades) or HTTP/2 on one connection; `slot` is released once hyper is done
/// with it, which for a WebSocket is right after the 101 (an HTTP/2 connection, like a
/// kept-alive HTTP/1.1 one, holds it for its life).
#[allow(clippy::too_many_arguments)]
pub async fn serve_connection<I>(
    io: TokioIo<I>,
    protocol: Protocol,
    peer: SocketAddr,
    slot: Slot,
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
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    drop(slot);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_and_come_back() {
        let gate = Gate::new(Duration::from_secs(1), 2);
        let a = gate.admit().expect("first");
        let _b = gate.admit().expect("second");
        assert!(gate.admit().is_none());
        drop(a);
        assert!(gate.admit().is_some());
        let open = Gate::new(Duration::from_secs(1), 0);
        let all: Vec<_> = (0..1000).map(|_| open.admit()).collect();
        assert!(all.iter().all(Option::is_some));
    }
}

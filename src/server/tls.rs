//! TLS on the HTTP listener: rustls from PEM files, re-read on SIGHUP; ALPN offers `h2`
//! (Streamable HTTP) beside `http/1.1` (WebSockets, and clients without ALPN).
//!
//! `axum::serve` only takes plain TCP, so with TLS the daemon runs its own accept loop (axum's
//! low-level-rustls pattern): a rustls handshake, then hyper serving the same `Router` with
//! upgrades enabled so `/acp` WebSockets work. The current `ServerConfig` sits in a `watch`
//! channel; each accept takes the latest one, so a reload changes what new handshakes present
//! and leaves established connections alone.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::TlsFiles;
use crate::transport::listen::{Gate, Pass};

/// A client that has not finished its handshake by then is dropped, so half-open
/// connections cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Pem { path: String, message: String },
    #[error("certificate and key are not a usable pair: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot watch SIGHUP: {0}")]
    Signal(std::io::Error),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Reads and checks the pair: at least one certificate, a private key, and a key that
/// belongs to the first certificate.
pub fn load(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let pem_err = |path: &Path, message: String| TlsError::Pem {
        path: path.display().to_string(),
        message,
    };
    let cert_pem = read(&files.cert)?;
    let certs = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(&files.cert, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(pem_err(&files.cert, "no CERTIFICATE in the file".into()));
    }
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| pem_err(&files.key, format!("no usable private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    // HTTP/2 for Streamable HTTP (the RFD requires it), HTTP/1.1 for WebSockets (RFC 8441
    // over HTTP/2 is not offered) and for clients without ALPN.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// SHA-256 of the first certificate in `files.cert`, hex; for the log after a (re)load.
fn fingerprint(files: &TlsFiles) -> String {
    read(&files.cert)
        .ok()
        .and_then(|pem| CertificateDer::from_pem_slice(&pem).ok())
        .map(|der| super::cert::plain_hex(&Sha256::digest(der.as_ref())))
        .unwrap_or_default()
}

/// The TLS listener, ready to run: the first configuration is loaded and SIGHUP is watched
/// from here on (so a SIGHUP right after start cannot kill the daemon).
pub struct TlsListener {
    listener: TcpListener,
    files: TlsFiles,
    current: watch::Sender<Arc<ServerConfig>>,
    hangup: Signal,
}

impl TlsListener {
    pub fn new(listener: TcpListener, files: TlsFiles) -> Result<TlsListener, TlsError> {
        let config = load(&files)?;
        let hangup = signal(SignalKind::hangup()).map_err(TlsError::Signal)?;
        tracing::info!(cert = %files.cert.display(), sha256 = %fingerprint(&files), "TLS certificate loaded");
        Ok(TlsListener {
            listener,
            files,
            current: watch::channel(config).0,
            hangup,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `app` until `shutdown` fires. Connections (and the reload watcher) are tasks of
    /// `tasks`; on shutdown they finish their requests and close.
    pub async fn serve(
        self,
        app: Router,
        gate: Gate,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> std::io::Result<()> {
        let TlsListener {
            listener,
            files,
            current,
            hangup,
        } = self;
        crate::transport::listen::deepen_backlog(&listener);
        let configs = current.subscribe();
        tasks.spawn(reload_on_sighup(files, current, hangup, shutdown.clone()));
        while let Some((stream, peer, pass)) =
            crate::transport::listen::accept_gated(&listener, &gate, &shutdown).await
        {
            let acceptor = TlsAcceptor::from(configs.borrow().clone());
            tasks.spawn(connection(
                stream,
                peer,
                pass,
                acceptor,
                app.clone(),
                gate.header_read_timeout,
                tasks.clone(),
                shutdown.clone(),
            ));
        }
        Ok(())
    }
}

/// Swaps in a freshly read pair on every SIGHUP; a bad pair is logged and the old one kept.
async fn reload_on_sighup(
    files: TlsFiles,
    current: watch::Sender<Arc<ServerConfig>>,
    mut hangup: Signal,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            got = hangup.recv() => if got.is_none() { break },
        }
        match load(&files) {
            Ok(config) => {
                current.send_replace(config);
                tracing::info!(cert = %files.cert.display(), sha256 = %fingerprint(&files), "SIGHUP: TLS certificate reloaded; new connections use it");
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: cannot reload the TLS certificate; keeping the current one");
            }
        }
    }
}

/// One client: the TLS handshake, then HTTP (and its WebSocket upgrade) over it.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    pass: Pass,
    acceptor: TlsAcceptor,
    app: Router,
    header_read_timeout: Duration,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    let tls = tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = pass.evicted() => return,
        r = handshake => match r {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
    };
    let protocol = match tls.get_ref().1.alpn_protocol() {
        Some(b"h2") => crate::transport::listen::Protocol::Http2,
        _ => crate::transport::listen::Protocol::Http1,
    };
    crate::transport::listen::serve_connection(
        TokioIo::new(tls),
        protocol,
        peer,
        pass,
        app,
        header_read_timeout,
        tasks,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> TlsFiles {
        let pair = super::super::cert::generate(vec!["localhost".into()]).expect("generate");
        let files = TlsFiles {
            cert: dir.join(format!("{name}-cert.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert, &pair.cert_pem).expect("write cert");
        std::fs::write(&files.key, &pair.key_pem).expect("write key");
        files
    }

    #[test]
    fn a_matching_pair_loads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = write_pair(dir.path(), "a");
        let config = load(&files).expect("load");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn mismatched_missing_or_garbage_files_are_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = write_pair(dir.path(), "a");
        let b = write_pair(dir.path(), "b");
        let mixed = TlsFiles {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        assert!(
            matches!(load(&mixed), Err(TlsError::Rustls(_))),
            "mismatched key"
        );
        let swapped = TlsFiles {
            cert: a.key.clone(),
            key: a.cert.clone(),
        };
        assert!(
            matches!(load(&swapped), Err(TlsError::Pem { .. })),
            "swapped files"
        );
        let missing = TlsFiles {
            cert: dir.path().join("nope.pem"),
            key: a.key.clone(),
        };
        assert!(matches!(load(&missing), Err(TlsError::Read { .. })));
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not pem").expect("write");
        let bad = TlsFiles {
            cert: garbage,
            key: a.key,
        };
        assert!(matches!(load(&bad), Err(TlsError::Pem { .. })));
    }
}

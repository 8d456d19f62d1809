//! The one accept gate of every listener acpd opens (main, TLS, the metrics listener, raw
//! TCP, the editor-MCP tunnel; the web console and `/_acpd/peer` are routes of the main one):
//! a connection is admitted through `Gate::admit` and holds a `Pass` for its life. The
//! decisions are `admission::Admission` (pure, unit-tested); this file is the glue: one
//! `Admission` behind a std `Mutex` (held for a map update, never across an await, so an
//! accept never waits on a task hop), a `CancellationToken` per pending connection that
//! closes it when it is displaced, and the descriptor budget read from `RLIMIT_NOFILE`.
//!
//! A `Pass` leaves the pending pool when the connection authenticates (`authenticated`: an
//! SSE stream, a TCP auth line; a WebSocket's 101 hands the socket to the upgrade, whose
//! task keeps a clone) and stops counting when the last clone drops. The header read
//! timeout is the other half: no pending connection lives longer than it without a request.

pub mod admission;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use admission::{Admission, ConnId, Decision, Limits, Source};

/// Descriptors kept back from the gate's connections: the store, agent pipes, MCP servers
/// and log files need theirs when clients hold all they can.
const MIN_DESCRIPTOR_RESERVE: usize = 256;

/// The gate shared by every listener; cheap to clone.
#[derive(Clone)]
pub struct Gate {
    pub header_read_timeout: Duration,
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    admission: Admission,
    /// Fired to close a pending connection that was displaced.
    evict: HashMap<ConnId, CancellationToken>,
}

/// How many connections the descriptor limit leaves room for (0: no limit known).
fn descriptor_budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a plain syscall on a struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return 0;
    }
    let soft = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    let reserve = (soft / 8).max(MIN_DESCRIPTOR_RESERVE);
    soft.saturating_sub(reserve).max(1)
}

impl Gate {
    pub fn new(limits: &crate::config::Limits) -> Gate {
        let max_open = descriptor_budget();
        tracing::info!(
            max_open,
            max_pending = limits.max_pending_connections,
            max_pending_per_source = limits.max_pending_per_source,
            "accept gate: connections allowed by the open-file limit"
        );
        Gate::with(
            limits.header_read_timeout,
            Limits {
                max_pending: limits.max_pending_connections,
                max_pending_per_source: limits.max_pending_per_source,
                max_open,
                max_streams_per_principal: limits.max_streams_per_principal,
            },
        )
    }

    pub fn with(header_read_timeout: Duration, limits: Limits) -> Gate {
        Gate {
            header_read_timeout,
            inner: Arc::new(Mutex::new(Inner {
                admission: Admission::new(limits),
                evict: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pass for a connection just accepted from `peer`, or `None`: close it at once.
    pub fn admit(&self, peer: SocketAddr) -> Option<Pass> {
        let mut inner = self.lock();
        let (id, evict) = match inner.admission.admit(Source::from(peer.ip())) {
            Decision::Admit { id, evict } => (id, evict),
            Decision::Refuse => {
                drop(inner);
                metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
                tracing::warn!(%peer, "out of descriptors for connections: closed at accept");
                return None;
            }
        };
        if let Some(victim) = evict.and_then(|v| inner.evict.remove(&v)) {
            victim.cancel();
            metrics::counter!(crate::metrics::CONNECTIONS_EVICTED_TOTAL).increment(1);
        }
        let evicted = CancellationToken::new();
        inner.evict.insert(id, evicted.clone());
        metrics::gauge!(crate::metrics::CONNECTIONS_PENDING).set(inner.admission.pending() as f64);
        drop(inner);
        if evict.is_some() {
            tracing::debug!(%peer, "pending connections over a cap: the oldest closed");
        }
        Some(Pass(Arc::new(Entry {
            id,
            gate: self.clone(),
            evicted,
        })))
    }

    /// A place for one more SSE stream of `principal`, or `None` (over its limit).
    pub fn open_stream(&self, principal: &str) -> Option<StreamPermit> {
        self.lock()
            .admission
            .open_stream(principal)
            .then(|| StreamPermit {
                gate: self.clone(),
                principal: principal.to_owned(),
            })
    }
}

struct Entry {
    id: ConnId,
    gate: Gate,
    evicted: CancellationToken,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut inner = self.gate.lock();
        inner.admission.closed(self.id);
        inner.evict.remove(&self.id);
        metrics::gauge!(crate::metrics::CONNECTIONS_PENDING).set(inner.admission.pending() as f64);
    }
}

/// A connection's place at the gate; it counts until the last clone drops. Cloned into each
/// request's extensions, so a handler can authenticate its connection or keep it counted
/// (an upgraded WebSocket's task, an SSE body).
#[derive(Clone)]
pub struct Pass(Arc<Entry>);

impl Pass {
    /// The connection authenticated: it leaves the pending pool and is never displaced.
    pub fn authenticated(&self) {
        let mut inner = self.0.gate.lock();
        inner.admission.authenticated(self.0.id);
        inner.evict.remove(&self.0.id);
        metrics::gauge!(crate::metrics::CONNECTIONS_PENDING).set(inner.admission.pending() as f64);
    }

    /// A request of this connection is being answered until the guard drops: the gate
    /// displaces idle pending connections before it.
    pub fn serving(&self) -> Serving {
        self.0.gate.lock().admission.request_started(self.0.id);
        Serving(self.clone())
    }

    /// Resolves when the connection was displaced by a newer one (close it).
    pub async fn evicted(&self) {
        self.0.evicted.cancelled().await
    }
}

/// One request being answered (`Pass::serving`).
pub struct Serving(Pass);

impl Drop for Serving {
    fn drop(&mut self) {
        let entry = &(self.0).0;
        entry.gate.lock().admission.request_ended(entry.id);
    }
}

/// One open SSE stream of a principal; the place is given back on drop.
pub struct StreamPermit {
    gate: Gate,
    principal: String,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.gate.lock().admission.close_stream(&self.principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max_pending: usize) -> Gate {
        Gate::with(
            Duration::from_secs(1),
            Limits {
                max_pending,
                max_pending_per_source: 0,
                max_open: 0,
                max_streams_per_principal: 1,
            },
        )
    }

    #[tokio::test]
    async fn a_displaced_pass_hears_it_and_drops_count_down() {
        let g = gate(2);
        let peer: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let first = g.admit(peer).expect("first");
        let second = g.admit(peer).expect("second");
        second.authenticated();
        let _third = g.admit(peer).expect("third");
        let _fourth = g.admit(peer).expect("fourth");
        tokio::time::timeout(Duration::from_secs(1), first.evicted())
            .await
            .expect("the oldest pending one is told");
        drop(first);
        drop(second);
        assert_eq!(g.lock().admission.open(), 2);
        let permit = g.open_stream("p").expect("a stream");
        assert!(g.open_stream("p").is_none());
        drop(permit);
        assert!(g.open_stream("p").is_some());
    }
}

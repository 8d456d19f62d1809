//! The accept gate's decisions, pure: which connection to admit, which pending one to close
//! to make room, when to refuse, and how many SSE streams a principal holds. No I/O, no
//! clock: `gate.rs` feeds it accepts, authentications, closes and streams.
//!
//! A connection is *pending* from accept until it authenticates (a WebSocket's 101, an
//! authenticated SSE stream, a TCP auth line) or closes. Pending connections are what an
//! unauthenticated client can pile up, so they are capped per source and in total; over a
//! cap the new connection is still admitted and the oldest pending one of the source over
//! its cap (or of the busiest source) is closed instead, an idle one before one whose request
//! is being answered. So a flood of idle sockets from one host only ever displaces that
//! host's sockets, and an unauthenticated request in progress (`/healthz` from the same host
//! as the flood) is answered rather than cut. A real client on the flooding host itself is
//! served only if acpd reads its headers before the flood has reopened a source's worth of
//! sockets after it: the caps cannot tell the two apart. Refusal is left
//! for descriptors: when every connection the gate counts is authenticated and the
//! descriptor budget is spent, a new one is refused before the store runs out of files.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// One connection, numbered in accept order (so a smaller id is an older connection).
pub type ConnId = u64;

/// Where a connection comes from, as the caps count it: an IPv4 address, or an IPv6 /64
/// (one host usually holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let mut prefix = [0; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    Source::V6Prefix(prefix)
                }
            },
        }
    }
}

/// The caps; 0 is no cap.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pending: usize,
    pub max_pending_per_source: usize,
    /// Connections (pending or not) the descriptor budget allows.
    pub max_open: usize,
    pub max_streams_per_principal: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Serve `id`; close `evict` first (a pending connection that made room).
    Admit { id: ConnId, evict: Option<ConnId> },
    /// Close the new connection at once: the descriptor budget is spent and nothing pending
    /// can make room.
    Refuse,
}

#[derive(Debug)]
struct Conn {
    source: Source,
    pending: bool,
    /// Requests of this connection being answered (HTTP/2 has several at once).
    serving: u32,
}

/// The gate's whole state.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    next: ConnId,
    conns: HashMap<ConnId, Conn>,
    /// Pending connections by source, oldest first.
    pending: HashMap<Source, BTreeSet<ConnId>>,
    pending_total: usize,
    streams: HashMap<String, usize>,
}

fn over(count: usize, cap: usize) -> bool {
    cap > 0 && count >= cap
}

impl Admission {
    pub fn new(limits: Limits) -> Admission {
        Admission {
            limits,
            next: 1,
            conns: HashMap::new(),
            pending: HashMap::new(),
            pending_total: 0,
            streams: HashMap::new(),
        }
    }

    /// Connections counted (pending or authenticated).
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.conns.len()
    }

    pub fn pending(&self) -> usize {
        self.pending_total
    }

    /// A new connection from `source`.
    pub fn admit(&mut self, source: Source) -> Decision {
        let from_source = self.pending.get(&source).map_or(0, BTreeSet::len);
        let evict = if over(from_source, self.limits.max_pending_per_source) {
            self.oldest_of(source)
        } else if over(self.pending_total, self.limits.max_pending)
            || over(self.conns.len(), self.limits.max_open)
        {
            self.oldest_of_busiest()
        } else {
            None
        };
        if evict.is_none() && over(self.conns.len(), self.limits.max_open) {
            return Decision::Refuse;
        }
        if let Some(victim) = evict {
            self.closed(victim);
        }
        let id = self.next;
        self.next += 1;
        self.conns.insert(
            id,
            Conn {
                source,
                pending: true,
                serving: 0,
            },
        );
        self.pending.entry(source).or_default().insert(id);
        self.pending_total += 1;
        Decision::Admit { id, evict }
    }

    /// The source's oldest pending connection with no request being answered, else its
    /// oldest (requests that never end must not make a source's connections untouchable).
    fn oldest_of(&self, source: Source) -> Option<ConnId> {
        let ids = self.pending.get(&source)?;
        ids.iter()
            .find(|id| self.conns.get(id).is_some_and(|c| c.serving == 0))
            .or_else(|| ids.first())
            .copied()
    }

    /// A request of `id` is being answered (until `request_ended`).
    pub fn request_started(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.serving += 1;
        }
    }

    pub fn request_ended(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.serving = conn.serving.saturating_sub(1);
        }
    }

    fn oldest_of_busiest(&self) -> Option<ConnId> {
        let busiest = self
            .pending
            .iter()
            .max_by_key(|(_, ids)| ids.len())
            .map(|(s, _)| *s)?;
        self.oldest_of(busiest)
    }

    fn leave_pending(&mut self, id: ConnId, source: Source) {
        if let Some(ids) = self.pending.get_mut(&source)
            && ids.remove(&id)
        {
            self.pending_total -= 1;
            if ids.is_empty() {
                self.pending.remove(&source);
            }
        }
    }

    /// `id` authenticated: it is no longer pending (never evicted), still counted as open.
    pub fn authenticated(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.get_mut(&id)
            && conn.pending
        {
            conn.pending = false;
            let source = conn.source;
            self.leave_pending(id, source);
        }
    }

    /// `id` is closed (or was evicted): it counts no more. Unknown ids are ignored.
    pub fn closed(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.remove(&id)
            && conn.pending
        {
            self.leave_pending(id, conn.source);
        }
    }

    /// Whether `principal` may open one more SSE stream (and if so, it is counted).
    pub fn open_stream(&mut self, principal: &str) -> bool {
        let n = self.streams.get(principal).copied().unwrap_or(0);
        if over(n, self.limits.max_streams_per_principal) {
            return false;
        }
        *self.streams.entry(principal.to_owned()).or_default() += 1;
        true
    }

    pub fn close_stream(&mut self, principal: &str) {
        if let Some(n) = self.streams.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                self.streams.remove(principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Source = Source::V4([10, 0, 0, 1]);
    const B: Source = Source::V4([10, 0, 0, 2]);

    fn limits(max_pending: usize, per_source: usize, max_open: usize) -> Limits {
        Limits {
            max_pending,
            max_pending_per_source: per_source,
            max_open,
            max_streams_per_principal: 2,
        }
    }

    fn id(d: Decision) -> (ConnId, Option<ConnId>) {
        match d {
            Decision::Admit { id, evict } => (id, evict),
            Decision::Refuse => panic!("refused"),
        }
    }

    #[test]
    fn a_source_over_its_cap_displaces_its_own_oldest() {
        let mut g = Admission::new(limits(0, 2, 0));
        let (a1, _) = id(g.admit(A));
        let (a2, _) = id(g.admit(A));
        let (b1, _) = id(g.admit(B));
        let (a3, evicted) = id(g.admit(A));
        assert_eq!(evicted, Some(a1));
        assert_eq!(id(g.admit(A)).1, Some(a2));
        // B was never touched.
        assert_eq!(g.pending(), 3);
        g.closed(b1);
        g.closed(a3);
        assert_eq!(g.pending(), 1);
    }

    #[test]
    fn a_request_being_answered_is_displaced_after_the_idle_ones() {
        let mut g = Admission::new(limits(0, 2, 0));
        let (a1, _) = id(g.admit(A));
        let (a2, _) = id(g.admit(A));
        g.request_started(a1);
        // The idle a2 goes, though a1 is older.
        let (a3, evicted) = id(g.admit(A));
        assert_eq!(evicted, Some(a2));
        // Every pending one answering: the oldest goes all the same.
        g.request_started(a3);
        assert_eq!(id(g.admit(A)).1, Some(a1));
        // Answered: a3 is idle again, and the oldest.
        g.request_ended(a3);
        assert_eq!(id(g.admit(A)).1, Some(a3));
    }

    #[test]
    fn over_the_total_the_busiest_source_pays() {
        let mut g = Admission::new(limits(3, 0, 0));
        let (a1, _) = id(g.admit(A));
        id(g.admit(A));
        let (b1, _) = id(g.admit(B));
        // B's new connection displaces A's oldest, not B's own.
        assert_eq!(id(g.admit(B)).1, Some(a1));
        assert_eq!(g.pending(), 3);
        g.closed(b1);
        assert_eq!(id(g.admit(B)).1, None);
    }

    #[test]
    fn authenticated_connections_are_never_displaced() {
        let mut g = Admission::new(limits(2, 0, 0));
        let (a1, _) = id(g.admit(A));
        g.authenticated(a1);
        let (a2, _) = id(g.admit(A));
        id(g.admit(A));
        assert_eq!(id(g.admit(A)).1, Some(a2));
        assert_eq!(g.open(), 3);
        // An evicted id's own close later changes nothing.
        g.closed(a2);
        assert_eq!(g.open(), 3);
        assert_eq!(g.pending(), 2);
    }

    #[test]
    fn the_descriptor_budget_refuses_only_when_nothing_pending_can_go() {
        let mut g = Admission::new(limits(0, 0, 2));
        let (a1, _) = id(g.admit(A));
        let (b1, _) = id(g.admit(B));
        g.authenticated(a1);
        // Full: B's pending one makes room.
        let (b2, evicted) = id(g.admit(A));
        assert_eq!(evicted, Some(b1));
        g.authenticated(b2);
        assert_eq!(g.admit(B), Decision::Refuse);
        assert_eq!(g.open(), 2);
        g.closed(a1);
        assert_eq!(id(g.admit(B)).1, None);
    }

    #[test]
    fn no_caps_admit_everything() {
        let mut g = Admission::new(limits(0, 0, 0));
        for _ in 0..10_000 {
            assert_eq!(id(g.admit(A)).1, None);
        }
        assert_eq!(g.pending(), 10_000);
    }

    #[test]
    fn streams_are_capped_per_principal() {
        let mut g = Admission::new(limits(0, 0, 0));
        assert!(g.open_stream("p"));
        assert!(g.open_stream("p"));
        assert!(!g.open_stream("p"));
        assert!(g.open_stream("q"));
        g.close_stream("p");
        assert!(g.open_stream("p"));
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_v4_as_v4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::from(a), Source::from(b));
        assert_ne!(Source::from(a), Source::from(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Source::from(mapped), A);
    }
}

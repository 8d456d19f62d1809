//! Streamable HTTP transport (the HTTP half of the ACP "Streamable HTTP & WebSocket" RFD): one
//! connection is a `Link` fed by POST bodies and read by GETs' SSE streams. One pump task per
//! connection owns the link's outgoing side and an `EventLog` per stream: events wait there
//! (bounded) while no response reads the stream, each carries an SSE `id:`, and a GET with
//! `Last-Event-ID` replays what came after it. A connection with no stream and no POST for
//! `grace` ends.
//!
//! On a session's stream the `id:` is the journal seq of a `session/update` (the same number
//! as its `_meta.acpd.seq`) and `<seq>.<n>` for what is not journaled (answers, agent
//! requests: `seq` of the update before it). A GET with `Last-Event-ID` for a session this
//! connection has not seen yet (a fresh connection after a drop or a daemon restart) attaches
//! the session with `_acpd/session/attach` after that seq: the session's outbox replays the
//! rest from the journal, then goes on live, so nothing is lost or doubled.

pub mod log;
pub mod route;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use acpd_wire::{InFrame, Link};

pub use log::Gone;
use route::Dest;
pub use route::{StreamKey, request_route};

/// Most streams (session streams + the connection's) one connection holds.
const MAX_STREAMS: usize = 256;
/// Most sessions a connection remembers having seen (beyond, a GET may attach one again,
/// which the outbox answers without sending a seq twice).
const MAX_SEEN: usize = 4096;
/// Events queued towards one SSE response before the pump waits for it.
const STREAM_QUEUE: usize = 64;
/// Bytes of undelivered events a connection holds before it stops reading its link.
pub const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;

/// Why a request cannot reach a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("the connection has ended")]
    Closed,
    #[error(transparent)]
    Gone(#[from] Gone),
    #[error("too many session streams on this connection")]
    TooMany,
}

enum Cmd {
    /// A POST arrived (the connection is in use), perhaps a request naming a session.
    Posted { route: Option<(String, String)> },
    Attach {
        stream: StreamKey,
        last_event_id: Option<String>,
        reply: oneshot::Sender<Result<StreamOpen, StreamError>>,
    },
}

/// `(id, data)` of the SSE events of one response.
pub type Events = mpsc::Receiver<(String, String)>;

/// A stream just attached.
pub struct StreamOpen {
    pub events: Events,
    /// The `_acpd/session/attach` request to POST on the connection's behalf: the stream
    /// resumes from the journal.
    pub resume: Option<String>,
}

/// One live connection, as the request handlers see it.
#[derive(Clone)]
pub struct Handle {
    /// Whose connection it is: requests of anyone else are answered as if it did not exist.
    pub principal: String,
    input: mpsc::Sender<InFrame>,
    cmd: mpsc::Sender<Cmd>,
    kick: CancellationToken,
}

impl Handle {
    /// Hands one POST body to the connection (`route` from `route::request_route`); waits
    /// while the connection is busy.
    pub async fn post(
        &self,
        frame: InFrame,
        route: Option<(String, String)>,
    ) -> Result<(), StreamError> {
        // First: the pump must know where the answer goes before it can come out.
        self.cmd
            .send(Cmd::Posted { route })
            .await
            .map_err(|_| StreamError::Closed)?;
        self.input
            .send(frame)
            .await
            .map_err(|_| StreamError::Closed)
    }

    /// Attaches a new SSE stream, the connection's (`None`) or a session's; a stream already
    /// attached there ends.
    pub async fn attach(
        &self,
        stream: StreamKey,
        last_event_id: Option<String>,
    ) -> Result<StreamOpen, StreamError> {
        let (reply, rx) = oneshot::channel();
        self.cmd
            .send(Cmd::Attach {
                stream,
                last_event_id,
                reply,
            })
            .await
            .map_err(|_| StreamError::Closed)?;
        rx.await.map_err(|_| StreamError::Closed)?
    }

    /// Ends the connection (`DELETE`).
    pub fn close(&self) {
        self.kick.cancel();
    }
}

/// A connection just opened: its first outgoing message is the answer to `initialize`.
pub struct Opened {
    pub handle: Handle,
    pub first: oneshot::Receiver<String>,
}

/// The live Streamable HTTP connections by `Acp-Connection-Id`. Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    map: Arc<Mutex<HashMap<String, Handle>>>,
    grace: Duration,
}

impl Connections {
    pub fn new(grace: Duration) -> Connections {
        Connections {
            map: Arc::default(),
            grace,
        }
    }

    pub fn get(&self, conn_id: &str) -> Option<Handle> {
        self.lock().get(conn_id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection and starts its pump (on `tasks`). Returns the link for
    /// `acp::connection::run`; `kick` ends the pump (and should end the connection too).
    pub fn open(
        &self,
        conn_id: String,
        principal: String,
        kick: CancellationToken,
        tasks: &TaskTracker,
    ) -> (Link, Opened) {
        let (in_tx, in_rx) = mpsc::channel(acpd_wire::LINK_QUEUE);
        let (out_tx, out_rx) = mpsc::channel::<acpd_wire::OutFrame>(acpd_wire::LINK_QUEUE);
        let (cmd_tx, cmd_rx) = mpsc::channel(16);
        let (first_tx, first) = oneshot::channel();
        let handle = Handle {
            principal,
            input: in_tx,
            cmd: cmd_tx,
            kick: kick.clone(),
        };
        self.lock().insert(conn_id.clone(), handle.clone());
        let pump = Pump {
            streams: HashMap::new(),
            routes: route::Routes::default(),
            seen: HashMap::new(),
            out_rx,
            cmd_rx,
            first: Some(first_tx),
            grace: self.grace,
        };
        let conns = self.clone();
        tasks.spawn(async move {
            pump.run(kick).await;
            conns.lock().remove(&conn_id);
            tracing::debug!(%conn_id, "streamable HTTP connection ended");
        });
        let link = Link {
            incoming: in_rx,
            outgoing: out_tx,
        };
        (link, Opened { handle, first })
    }
}

/// One SSE stream of a connection: its events and the response reading them, if attached.
struct Stream {
    log: log::EventLog,
    tx: Option<mpsc::Sender<(String, String)>>,
    /// A session stream's last journal seq pushed (or resumed after).
    seq: i64,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            log: log::EventLog::new(MAX_HELD_BYTES),
            tx: None,
            seq: 0,
        }
    }

    /// Hands the attached response what it has room for; detaches it once it is gone.
    fn flush(&mut self) {
        let Some(tx) = &self.tx else { return };
        while let Some((id, text)) = self.log.next() {
            match tx.try_reserve() {
                Ok(p) => {
                    p.send((id.to_owned(), text.to_owned()));
                    self.log.advance();
                }
                Err(mpsc::error::TrySendError::Full(())) => return,
                Err(mpsc::error::TrySendError::Closed(())) => break,
            }
        }
        if tx.is_closed() {
            self.tx = None;
        }
    }
}

/// How a GET's `Last-Event-ID` is served.
#[derive(Debug, PartialEq, Eq)]
enum Resume {
    /// No id: the stream goes on where the last one stopped.
    Continue,
    /// After this event (its number) of what the connection holds.
    Held(u64),
    /// A fresh session stream, replayed from the journal after this seq.
    Journal(i64),
}

/// Pure: the plan for a GET on a session stream (`session`) or the connection's, given the
/// stream's log if it exists, whether the connection has seen the session, and the id.
fn resume_plan(
    session: bool,
    held: Option<&log::EventLog>,
    seen: bool,
    last_event_id: Option<&str>,
) -> Result<Resume, Gone> {
    let Some(id) = last_event_id else {
        return Ok(Resume::Continue);
    };
    if !session {
        return id.parse().map(Resume::Held).map_err(|_| Gone);
    }
    if let Some(log) = held {
        return log.find(id).map(Resume::Held).ok_or(Gone);
    }
    // A session the connection has used is attached here from some point on: the outbox
    // would not send it those seqs again.
    if seen {
        return Err(Gone);
    }
    id.split('.')
        .next()
        .and_then(|s| s.parse().ok())
        .map(Resume::Journal)
        .ok_or(Gone)
}

struct Pump {
    /// The connection's stream (`None`), created at the first event, and the session
    /// streams the client opened.
    streams: HashMap<StreamKey, Stream>,
    routes: route::Routes,
    /// Sessions this connection has sent or been sent something about (it is attached, or
    /// will be): their streams cannot resume from the journal, the outbox would not resend.
    /// With the last seq the connection was sent of each, on whichever stream: a session
    /// stream opened later labels its first unjournaled events after it.
    seen: HashMap<String, i64>,
    out_rx: mpsc::Receiver<acpd_wire::OutFrame>,
    cmd_rx: mpsc::Receiver<Cmd>,
    first: Option<oneshot::Sender<String>>,
    grace: Duration,
}

impl Pump {
    fn attached(&self) -> bool {
        self.streams.values().any(|s| s.tx.is_some())
    }

    fn has_room(&self) -> bool {
        self.streams.values().all(|s| s.log.has_room())
    }

    fn see(&mut self, session: &str, seq: Option<i64>) {
        let seq = seq.unwrap_or(0);
        let room = self.seen.len() < MAX_SEEN;
        match self.seen.get_mut(session) {
            Some(last) => *last = (*last).max(seq),
            None if room => {
                self.seen.insert(session.to_owned(), seq);
            }
            None => {}
        }
    }

    /// Where an outgoing message goes: its session's stream if the client opened one.
    fn push(&mut self, text: String) {
        let (key, seq) = match self.routes.dest(&text) {
            Dest::Connection => (None, None),
            Dest::Session { id, seq } => {
                self.see(&id, seq);
                let key = Some(id);
                if self.streams.contains_key(&key) {
                    (key, seq)
                } else {
                    (None, None)
                }
            }
            Dest::Attached { session, ok: true } => {
                tracing::debug!(%session, "session stream resumed from the journal");
                return;
            }
            Dest::Attached { session, ok: false } => {
                // Unknown session, or a seq beyond its journal (the session is attached from
                // its end then): the stream ends, the client sees it at once.
                tracing::info!(%session, "session stream cannot resume from the journal: ended");
                self.streams.remove(&Some(session));
                return;
            }
        };
        let session = key.is_some();
        let stream = self.streams.entry(key).or_insert_with(Stream::new);
        let label = match (session, seq) {
            (false, _) => None,
            (true, Some(seq)) => {
                stream.seq = seq;
                Some(seq.to_string())
            }
            (true, None) => Some(format!("{}.{}", stream.seq, stream.log.next_number())),
        };
        stream.log.push(label, text);
        stream.flush();
    }

    fn attach(
        &mut self,
        key: StreamKey,
        last_event_id: Option<String>,
    ) -> Result<StreamOpen, StreamError> {
        let exists = self.streams.contains_key(&key);
        if !exists && self.streams.len() >= MAX_STREAMS {
            return Err(StreamError::TooMany);
        }
        let seen = key.as_ref().and_then(|s| self.seen.get(s)).copied();
        let held = self.streams.get(&key).map(|s| &s.log);
        let plan = resume_plan(
            key.is_some(),
            held,
            seen.is_some(),
            last_event_id.as_deref(),
        )?;
        let resume = match (&plan, &key) {
            (Resume::Journal(seq), Some(session)) => {
                Some(self.routes.attach_request(session, *seq))
            }
            _ => None,
        };
        if let Some(session) = key.clone() {
            self.see(&session, None);
        }
        let stream = self.streams.entry(key).or_insert_with(|| {
            let mut s = Stream::new();
            s.seq = seen.unwrap_or(0);
            s
        });
        match plan {
            Resume::Continue => {}
            Resume::Held(n) => stream.log.resume(Some(n))?,
            Resume::Journal(seq) => stream.seq = seq,
        }
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        stream.tx = Some(tx);
        stream.flush();
        Ok(StreamOpen { events: rx, resume })
    }

    /// Waits until an attached response has room for more, or is gone.
    fn wake(&self) -> Option<impl Future<Output = ()> + use<>> {
        let waits: Vec<_> = self
            .streams
            .values()
            .filter_map(|s| {
                let tx = s.tx.clone()?;
                let blocked = s.log.next().is_some();
                Some(Box::pin(async move {
                    if blocked {
                        let _ = tx.reserve().await;
                    } else {
                        tx.closed().await;
                    }
                }))
            })
            .collect();
        if waits.is_empty() {
            return None;
        }
        Some(async move {
            futures_util::future::select_all(waits).await;
        })
    }

    async fn run(mut self, kick: CancellationToken) {
        let bytes_out = metrics::counter!(crate::metrics::BYTES_OUT_TOTAL);
        let mut idle_since = Instant::now();
        loop {
            let attached = self.attached();
            let wake = self.wake();
            tokio::select! {
                // The commands first: a POST's route is known before its answer is taken.
                biased;
                _ = kick.cancelled() => break,
                cmd = self.cmd_rx.recv() => match cmd {
                    None => break,
                    Some(Cmd::Posted { route }) => {
                        idle_since = Instant::now();
                        if let Some(r) = route {
                            self.see(&r.1, None);
                            self.routes.posted(r);
                        }
                    }
                    Some(Cmd::Attach { stream, last_event_id, reply }) => {
                        let _ = reply.send(self.attach(stream, last_event_id));
                    }
                },
                out = self.out_rx.recv(), if self.has_room() => match out {
                    // The connection ended on acpd's side; what is held is lost with it.
                    None => break,
                    Some(text) => {
                        bytes_out.increment(text.len() as u64);
                        match self.first.take() {
                            Some(first) => { let _ = first.send(text.into_string()); }
                            None => self.push(text.into_string()),
                        }
                    }
                },
                _ = async { wake.expect("guarded").await }, if wake.is_some() => {
                    for s in self.streams.values_mut() {
                        s.flush();
                    }
                    if attached && !self.attached() {
                        idle_since = Instant::now();
                    }
                }
                _ = tokio::time::sleep_until(idle_since + self.grace), if !attached => {
                    tracing::info!(grace = ?self.grace, "streamable HTTP connection idle (no stream, no POST): ended");
                    break;
                }
            }
        }
        kick.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_event_id_is_served_from_what_is_held_or_from_the_journal() {
        let plan = resume_plan;
        assert_eq!(plan(false, None, false, None), Ok(Resume::Continue));
        assert_eq!(plan(true, None, true, None), Ok(Resume::Continue));
        // The connection stream: event numbers only.
        assert_eq!(plan(false, None, false, Some("7")), Ok(Resume::Held(7)));
        assert_eq!(plan(false, None, false, Some("7.1")), Err(Gone));
        // A session stream the connection holds: by label.
        let mut log = log::EventLog::new(1000);
        log.push(Some("12".into()), "u".into());
        log.push(Some("12.2".into()), "answer".into());
        assert_eq!(
            plan(true, Some(&log), true, Some("12")),
            Ok(Resume::Held(1))
        );
        assert_eq!(
            plan(true, Some(&log), false, Some("12.2")),
            Ok(Resume::Held(2))
        );
        assert_eq!(plan(true, Some(&log), false, Some("11")), Err(Gone));
        // A session stream not open here: from the journal, unless the session is in use.
        assert_eq!(plan(true, None, false, Some("12")), Ok(Resume::Journal(12)));
        assert_eq!(
            plan(true, None, false, Some("12.2")),
            Ok(Resume::Journal(12))
        );
        assert_eq!(plan(true, None, true, Some("12")), Err(Gone));
        assert_eq!(plan(true, None, false, Some("x")), Err(Gone));
    }
}

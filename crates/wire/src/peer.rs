//! The JSON-RPC peer: one task per link that numbers outgoing requests, matches their
//! responses, hands incoming requests and notifications to its owner, and makes sure every
//! incoming request is answered exactly once.
//!
//! The task owns both pending maps (ours and theirs); nothing else touches them. It never
//! blocks on one side while the other waits: frames to deliver and frames to write sit in
//! small local queues, and each source is read only while its queue has room.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::envelope::RawNotification;
use super::msg::{Malformed, Message, Notification, Request, RequestId, Response, ResponseError};
use super::out_frame::OutFrame;

mod forward;
mod incoming;
mod lane;
mod memory;
pub use forward::{Forward, MapError, PendingForward};
pub use lane::{Answer, LaneRequest, QueueError};
use lane::{LaneItem, QUEUE_MESSAGES, Queued};
pub use memory::memory_pair;

/// What a transport hands the peer.
#[derive(Debug)]
pub enum InFrame {
    Text(String),
    /// A frame over the size limit, dropped unread; carries its size.
    TooLarge(usize),
    /// A frame whose bytes are not UTF-8 (newline transports; WebSocket checks this itself).
    NotUtf8,
}

/// Both directions of a transport, as channels. Closing `incoming` ends the peer.
pub struct Link {
    pub incoming: mpsc::Receiver<InFrame>,
    pub outgoing: mpsc::Sender<OutFrame>,
}

/// Failure of a request we sent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    #[error("the peer answered with an error: {0}")]
    Remote(ResponseError),
    #[error("the connection closed before an answer arrived")]
    Disconnected,
}

/// A request or notification from the other side, for the owner to handle.
///
/// Small, because the deliver queue's tokio channel allocates 32 of these up front on every
/// link (144 bytes each made it 4.6 KiB): a request and an in-band answer are boxed, one
/// allocation each; the notification (a streamed update) is not.
#[derive(Debug)]
pub enum Incoming {
    Request(Box<IncomingRequest>),
    /// Params as sent: an owner that streams them on never builds them into a tree.
    Notification(RawNotification),
    /// The answer to a request sent with `PeerHandle::request_in_band`, delivered in wire
    /// order with everything else the other side sent before it.
    Response {
        route: String,
        tag: u64,
        result: Box<Result<Value, ResponseError>>,
    },
}

#[derive(Debug)]
pub struct IncomingRequest {
    pub method: String,
    pub params: Option<Value>,
    pub responder: Responder,
    /// Fired by `$/cancel_request` for this request, or when the link closes.
    pub cancelled: CancellationToken,
}

/// Where the answer to one of our requests goes.
enum Reply {
    Oneshot(oneshot::Sender<Result<Value, PeerError>>),
    InBand {
        route: String,
        tag: u64,
    },
    /// Straight to the asker of a request this link relays (`PeerHandle::try_forward`).
    Forward(Box<Forward>),
}

/// What the command queue carries. Small, because its tokio channel allocates 32 slots up
/// front on every link (136-byte `Command`s: 4.3 KiB per connection): the big commands go
/// boxed, one allocation per request, notification or answer; `Raw` (a forwarded update) and
/// `Forget` stay inline.
enum Slot {
    Raw(String),
    Forget { id: u64, notify_peer: bool },
    Boxed(Box<Command>),
}

impl From<Command> for Slot {
    fn from(cmd: Command) -> Slot {
        match cmd {
            Command::Raw(text) => Slot::Raw(text),
            Command::Forget { id, notify_peer } => Slot::Forget { id, notify_peer },
            cmd => Slot::Boxed(Box::new(cmd)),
        }
    }
}

impl From<Slot> for Command {
    fn from(slot: Slot) -> Command {
        match slot {
            Slot::Raw(text) => Command::Raw(text),
            Slot::Forget { id, notify_peer } => Command::Forget { id, notify_peer },
            Slot::Boxed(cmd) => *cmd,
        }
    }
}

enum Command {
    Request {
        id: u64,
        method: String,
        params: Option<Value>,
        reply: Reply,
    },
    Notify {
        method: String,
        params: Option<Value>,
    },
    Raw(String),
    Reply {
        id: RequestId,
        result: Result<Value, ResponseError>,
    },
    Forget {
        id: u64,
        notify_peer: bool,
    },
}

/// Sends requests and notifications to the other side. Cheap to clone.
#[derive(Clone)]
pub struct PeerHandle {
    tx: mpsc::Sender<Slot>,
    next_id: Arc<AtomicU64>,
    closed: CancellationToken,
    /// Ends the peer task; not a channel message, so it works when the link is jammed.
    stop: CancellationToken,
    /// The peer's helper tasks (a send a `Drop` could not finish); the peer task waits for them.
    tasks: TaskTracker,
    /// The owner's outgoing queue (`try_send_raw`, `try_respond`): deep, bounded by bytes,
    /// never awaited. `tx` keeps its small bound for everything else.
    lane: mpsc::Sender<LaneItem>,
    queued: Arc<Queued>,
}

impl std::fmt::Debug for PeerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHandle")
            .field("closed", &self.closed.is_cancelled())
            .finish()
    }
}

impl PeerHandle {
    /// Sends a request and waits for its answer. Dropping the future withdraws the request
    /// (`$/cancel_request`), so an abandoned request never leaks a pending entry.
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, PeerError> {
        self.start_request(method, params).await?.wait().await
    }

    /// Sends a request and returns a handle to its answer.
    pub async fn start_request(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<OutgoingRequest, PeerError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Request {
            id,
            method: method.to_owned(),
            params,
            reply: Reply::Oneshot(reply),
        };
        self.tx
            .send(cmd.into())
            .await
            .map_err(|_| PeerError::Disconnected)?;
        Ok(OutgoingRequest {
            id,
            rx,
            tx: self.tx.clone(),
            tasks: self.tasks.clone(),
            done: false,
        })
    }

    /// Sends a request whose answer comes back through the owner's `Incoming` stream as
    /// `Incoming::Response { route, tag, .. }`, after every message that preceded it on the
    /// wire. A turn's reply then never overtakes the turn's updates. If the link closes first,
    /// no answer comes: the owner learns of the closed link instead.
    pub async fn request_in_band(
        &self,
        method: &str,
        params: Option<Value>,
        route: &str,
        tag: u64,
    ) -> Result<u64, PeerError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let reply = Reply::InBand {
            route: route.to_owned(),
            tag,
        };
        let cmd = Command::Request {
            id,
            method: method.to_owned(),
            params,
            reply,
        };
        self.tx
            .send(cmd.into())
            .await
            .map_err(|_| PeerError::Disconnected)?;
        Ok(id)
    }

    /// Asks the other side to stop working on a request (`$/cancel_request`).
    pub fn cancel_request(&self, id: u64) {
        let _ = self.tx.try_send(Slot::Forget {
            id,
            notify_peer: false,
        });
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), PeerError> {
        let cmd = Command::Notify {
            method: method.to_owned(),
            params,
        };
        self.tx
            .send(cmd.into())
            .await
            .map_err(|_| PeerError::Disconnected)
    }

    /// Sends a message that is already serialized (journaled updates are sent byte for byte).
    pub async fn send_raw(&self, text: String) -> Result<(), PeerError> {
        self.tx
            .send(Slot::Raw(text))
            .await
            .map_err(|_| PeerError::Disconnected)
    }

    /// Ends the link: the peer stops, pending requests fail, the transport closes. Used to
    /// cut off a client that cannot keep up or whose token was revoked.
    pub fn close(&self) {
        self.stop.cancel();
    }

    /// Fires when the peer's loop has ended: nothing more goes out or comes in through it,
    /// and it fires before any pending request is told `Disconnected`.
    pub fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }
}

/// An answer on its way. Dropped before it arrives, it withdraws the request.
pub struct OutgoingRequest {
    id: u64,
    rx: oneshot::Receiver<Result<Value, PeerError>>,
    tx: mpsc::Sender<Slot>,
    tasks: TaskTracker,
    done: bool,
}

impl OutgoingRequest {
    /// The wire id of this request on its link.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Asks the other side to stop working on it (`$/cancel_request`); the answer still comes.
    pub fn cancel(&self) {
        let _ = self.tx.try_send(Slot::Forget {
            id: self.id,
            notify_peer: false,
        });
    }

    pub async fn wait(mut self) -> Result<Value, PeerError> {
        let r = (&mut self.rx).await.unwrap_or(Err(PeerError::Disconnected));
        self.done = true;
        r
    }
}

impl Drop for OutgoingRequest {
    fn drop(&mut self) {
        if !self.done {
            send_from_drop(
                &self.tx,
                &self.tasks,
                Command::Forget {
                    id: self.id,
                    notify_peer: true,
                },
            );
        }
    }
}

/// Answers one incoming request. Dropped unanswered, it answers `-32603` so the other side
/// never waits forever.
#[derive(Debug)]
pub struct Responder {
    id: Option<RequestId>,
    tx: mpsc::Sender<Slot>,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

impl Responder {
    pub async fn respond(mut self, result: Result<Value, ResponseError>) {
        if let Some(id) = self.id.take() {
            let _ = self.tx.send(Command::Reply { id, result }.into()).await;
        }
    }

    /// Answers without waiting: the link's queue, or a task of that link when it is full.
    pub fn respond_now(mut self, result: Result<Value, ResponseError>) {
        if let Some(id) = self.id.take() {
            send_from_drop(&self.tx, &self.tasks, Command::Reply { id, result });
        }
    }

    pub fn id(&self) -> Option<&RequestId> {
        self.id.as_ref()
    }

    /// Whether this answers a request that came over `peer`'s link.
    pub fn is_for(&self, peer: &PeerHandle) -> bool {
        self.tx.same_channel(&peer.tx)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let result = Err(ResponseError::internal(
                "the request was dropped without an answer",
            ));
            send_from_drop(&self.tx, &self.tasks, Command::Reply { id, result });
        }
    }
}

/// Drop cannot await: try the channel, and if it is full, finish the send on a task of the
/// peer's tracker (queued behind what is already sent, so a `Forget` never overtakes its
/// request). The peer task waits for these before it ends; once it stops reading commands,
/// their sends fail at once.
fn send_from_drop(tx: &mpsc::Sender<Slot>, tasks: &TaskTracker, cmd: Command) {
    if let Err(mpsc::error::TrySendError::Full(cmd)) = tx.try_send(cmd.into())
        && tokio::runtime::Handle::try_current().is_ok()
    {
        let tx = tx.clone();
        tasks.spawn(async move {
            let _ = tx.send(cmd).await;
        });
    }
}

/// Queue limits: how far each side may run ahead before its source stops being read.
const DELIVER_QUEUE: usize = 64;
const WRITE_QUEUE: usize = 256;
const COMMANDS: usize = 256;

/// Starts the peer task. Returns its handle, the stream of incoming requests and
/// notifications, and the task's waiter (which the caller owns). The task ends when the link
/// closes or `shutdown` fires; pending outgoing requests then fail with `Disconnected`.
pub fn spawn(
    link: Link,
    shutdown: CancellationToken,
) -> (
    PeerHandle,
    mpsc::Receiver<Incoming>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(COMMANDS);
    let (lane, lane_rx) = mpsc::channel(QUEUE_MESSAGES);
    let (in_tx, in_rx) = mpsc::channel(DELIVER_QUEUE);
    let closed = CancellationToken::new();
    let stop = shutdown.child_token();
    let tasks = TaskTracker::new();
    let queued = Arc::new(Queued::default());
    let handle = PeerHandle {
        queued: queued.clone(),
        lane,
        stop: stop.clone(),
        tx: tx.clone(),
        next_id: Arc::new(AtomicU64::new(1)),
        closed: closed.clone(),
        tasks: tasks.clone(),
    };
    let task = PeerTask {
        closed,
        queued,
        self_tx: tx,
        tasks: tasks.clone(),
        ours: HashMap::new(),
        theirs: HashMap::new(),
        to_deliver: VecDeque::new(),
        to_write: VecDeque::new(),
    };
    let join = tokio::spawn(async move {
        // `run` drops the command queue when it ends, so the drop-senders finish at once.
        task.run(link, rx, lane_rx, in_tx, stop).await;
        tasks.close();
        tasks.wait().await;
    });
    (handle, in_rx, join)
}

struct PeerTask {
    /// Cancelled once the loop ends, before pending requests are told `Disconnected`.
    closed: CancellationToken,
    queued: Arc<Queued>,
    /// For responders handed to the owner.
    self_tx: mpsc::Sender<Slot>,
    tasks: TaskTracker,
    /// Requests we sent, by wire id.
    ours: HashMap<u64, Reply>,
    /// Requests they sent that are not answered yet.
    theirs: HashMap<RequestId, CancellationToken>,
    to_deliver: VecDeque<Incoming>,
    to_write: VecDeque<OutFrame>,
}

impl PeerTask {
    // long: the peer's one select! loop; every arm is a call to its handler already, and the
    // arms together are the list of what a peer waits on.
    async fn run(
        mut self,
        mut link: Link,
        mut commands: mpsc::Receiver<Slot>,
        mut lane: mpsc::Receiver<LaneItem>,
        deliver: mpsc::Sender<Incoming>,
        shutdown: CancellationToken,
    ) {
        let mut link_open = true;
        let mut lane_open = true;
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Each arm moves what is ready now, not one item: a stream of updates costs
                // one pass of this loop per burst rather than one per message.
                permit = link.outgoing.reserve(), if !self.to_write.is_empty() => match permit {
                    Ok(p) => {
                        if let Some(f) = self.to_write.pop_front() { p.send(f) }
                        send_ready(&mut self.to_write, &link.outgoing);
                    }
                    Err(_) => break,
                },
                cmd = commands.recv(), if self.to_write.len() < WRITE_QUEUE => match cmd {
                    Some(cmd) => {
                        self.on_command(cmd.into());
                        while self.to_write.len() < WRITE_QUEUE && let Ok(cmd) = commands.try_recv() {
                            self.on_command(cmd.into());
                        }
                    }
                    None => break,
                },
                cmd = lane.recv(), if lane_open && self.to_write.len() < WRITE_QUEUE => match cmd {
                    Some(cmd) => {
                        self.on_lane(cmd);
                        while self.to_write.len() < WRITE_QUEUE && let Ok(cmd) = lane.try_recv() {
                            self.on_lane(cmd);
                        }
                    }
                    None => lane_open = false,
                },
                permit = deliver.reserve(), if !self.to_deliver.is_empty() => match permit {
                    Ok(p) => {
                        if let Some(m) = self.to_deliver.pop_front() { p.send(m) }
                        send_ready(&mut self.to_deliver, &deliver);
                    }
                    // The owner is gone: nobody can answer; the dropped responders reply -32603.
                    Err(_) => self.to_deliver.clear(),
                },
                frame = link.incoming.recv(), if link_open && self.to_deliver.len() < DELIVER_QUEUE => match frame {
                    Some(f) => {
                        self.on_in_frame(f);
                        while self.to_deliver.len() < DELIVER_QUEUE && let Ok(f) = link.incoming.try_recv() {
                            self.on_in_frame(f);
                        }
                    }
                    None => link_open = false,
                },
                else => break,
            }
            if !link_open && self.to_write.is_empty() {
                break;
            }
        }
        // Closed before anyone hears of it: an asker told `Disconnected` below may ask again
        // at once, and its owner must then see this peer as gone (`is_closed`) and find a new
        // one, not hand the next call to this peer too (agent_calls::a_call_out_when_the_
        // agent_dies_is_answered_and_the_next_reaches_a_new_agent failed once that way).
        self.closed.cancel();
        for (_, token) in self.theirs.drain() {
            token.cancel();
        }
        // Forwards still queued have an asker waiting: tell it the link is gone.
        commands.close();
        while let Ok(cmd) = commands.try_recv() {
            forward::disconnected(cmd.into());
        }
        for (_, reply) in self.ours.drain() {
            match reply {
                Reply::Oneshot(tx) => {
                    let _ = tx.send(Err(PeerError::Disconnected));
                }
                Reply::Forward(f) => f.answer(Err(PeerError::Disconnected)),
                Reply::InBand { .. } => {}
            }
        }
    }

    fn write(&mut self, m: Message) {
        self.to_write.push_back(m.to_text().into());
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Request {
                id,
                method,
                params,
                reply,
            } => {
                self.ours.insert(id, reply);
                self.write(
                    Request {
                        id: RequestId::from(id),
                        method,
                        params,
                    }
                    .into(),
                );
            }
            Command::Notify { method, params } => {
                self.write(Notification { method, params }.into())
            }
            Command::Raw(text) => self.to_write.push_back(text.into()),
            Command::Reply { id, result } => {
                // Only the first answer to a request goes out.
                if self.theirs.remove(&id).is_some() {
                    self.write(Response { id, result }.into());
                }
            }
            Command::Forget { id, notify_peer } => {
                // Only a request that is out and unanswered is withdrawn at the other side (a
                // lane request dropped before it left never is: it is not sent at all).
                let out = if notify_peer {
                    self.ours.remove(&id).is_some()
                } else {
                    self.ours.contains_key(&id)
                };
                if out {
                    let params = json!({ "requestId": id });
                    self.write(
                        Notification {
                            method: "$/cancel_request".into(),
                            params: Some(params),
                        }
                        .into(),
                    );
                }
            }
        }
    }
}

/// Moves the front of `queue` into `tx` while it has room now (after the item a permit was
/// awaited for): a burst costs one pass of the owner's loop (the peer's, acp-shim's). A closed
/// `tx` drops what it was offered; the next pass sees it closed.
pub fn send_ready<T>(queue: &mut VecDeque<T>, tx: &mpsc::Sender<T>) {
    while let Some(item) = queue.pop_front() {
        if let Err(e) = tx.try_send(item) {
            if let mpsc::error::TrySendError::Full(item) = e {
                queue.push_front(item);
            }
            break;
        }
    }
}

//! A session another replica owns (a live lease there), as one client connection here sees
//! it: a forwarder that looks like a session actor (`SessionHandle`), relaying the
//! connection's commands for that session to the owner over an internal link
//! (`cluster::link::dial`, a client connection of the same principal on the owner) and what
//! the owner sends back to the client, in wire order.
//!
//! The owner does everything a session does (journal, seq numbers, write-before-send,
//! exactly-once per connection, cancel); the forwarder only translates commands back into the
//! JSON-RPC they came as. Answers come in band (`PeerHandle::request_in_band`), so a turn's
//! answer never overtakes its updates. One forwarder per connection and session: it ends when
//! the connection detaches, when its owner cannot be reached or at shutdown.
//!
//! When the link drops (the owner cut it off as too slow, a network blip) the client stays
//! attached: the forwarder dials again and re-attaches with `_acpd/session/attach` after the
//! last seq it forwarded (`Position`), so the owner replays from its journal exactly what the
//! client has not had, then goes on live: no update is lost or sent twice across the
//! hand-over. Requests that were in flight on the dropped link are answered with an error
//! (their answers went to the old link); a redial that forwards nothing before the link drops
//! again counts against `REDIALS`, after which the forwarder ends.
//!
//! The forwarder waits on its own client's queue when it relays (backpressure reaches the
//! owner, which lags this link onto its journal like any slow client); it serves nobody else.
//!
//! Checked by tests/it
//! `replicas::mid_turn::clients_loading_mid_turn_through_non_owners_get_every_chunk_once_across_a_dropped_link`.

use acpd_protocol::method;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{AttachMode, Client, SessionCommand, SessionHandle, Shared};
use crate::cluster::link::{OnBehalf, dial};
use crate::error::AcpError;
use acpd_wire::{Incoming, PeerError, PeerHandle, Responder, ResponseError};

/// Commands held while the link is being set up.
const WAITING_MAX: usize = 1024;
/// The in-band route of the forwarder's requests to the owner.
const ROUTE: &str = "forward";
/// Dials in a row after a dropped link with no update forwarded in between.
const REDIALS: u32 = 3;
/// The tag of a re-attach request: its answer goes to nobody (tags of requests start at 1).
const REATTACH_TAG: u64 = 0;

/// The replica that owns a forwarded session, as its lease said.
pub(super) struct Owner {
    pub id: String,
    pub url: String,
    pub expires_in_ms: i64,
}

/// Starts a forwarder of session `id` to its owner.
pub(super) fn spawn(
    id: &str,
    principal: &str,
    profile: Option<&str>,
    owner: Owner,
    shared: Shared,
) -> SessionHandle {
    let (tx, rx) = mpsc::channel(256);
    let handle = SessionHandle {
        id: Arc::from(id),
        principal: Arc::from(principal),
        profile: Arc::from(profile.unwrap_or_default()),
        tx,
        // The owner knows whether a turn runs and who is attached; this replica does not
        // (the web console shows a forwarded session as idle, with no one attached).
        status: tokio::sync::watch::channel(super::LiveStatus::default()).1,
    };
    let fwd = Forwarder {
        id: handle.id.clone(),
        url: owner.url.clone(),
        owner,
        profile: profile.map(str::to_owned),
        shared: shared.clone(),
        client: None,
        link: Link::Down,
        waiting: VecDeque::new(),
        inflight: HashMap::new(),
        next_tag: 1,
        position: Position::default(),
        tasks: JoinSet::new(),
        done: false,
    };
    shared.tasks.spawn(fwd.run(rx));
    handle
}

enum Link {
    Down,
    Dialling,
    Up {
        peer: PeerHandle,
        incoming: mpsc::Receiver<Incoming>,
    },
}

enum TaskDone {
    Dialled(Result<(PeerHandle, mpsc::Receiver<Incoming>), String>),
    Relayed,
}

struct Forwarder {
    id: Arc<str>,
    url: String,
    owner: Owner,
    /// The profile the client's connection is on (`None`: any).
    profile: Option<String>,
    shared: Shared,
    /// The client this forwarder serves (from its first attach).
    client: Option<Client>,
    link: Link,
    waiting: VecDeque<SessionCommand>,
    /// Requests sent to the owner, by tag, with who waits for the answer.
    inflight: HashMap<u64, Responder>,
    next_tag: u64,
    /// Where the client is in the owner's journal, for a re-attach after the link drops.
    position: Position,
    tasks: JoinSet<TaskDone>,
    done: bool,
}

impl Forwarder {
    async fn run(mut self, mut commands: mpsc::Receiver<Box<SessionCommand>>) {
        let shutdown = self.shared.shutdown.clone();
        while !self.done {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                cmd = commands.recv() => match cmd {
                    Some(cmd) => self.on_command(*cmd).await,
                    None => break,
                },
                msg = next_incoming(&mut self.link) => match msg {
                    Some(msg) => self.on_incoming(msg).await,
                    None => self.link_lost().await,
                },
                Some(Ok(done)) = self.tasks.join_next() => self.on_task(done).await,
            }
        }
        let gone = ResponseError::from(AcpError::SessionGone);
        for (_, r) in self.inflight.drain() {
            r.respond(Err(gone.clone())).await;
        }
        for cmd in self.waiting.drain(..) {
            cmd.reject(gone.clone()).await;
        }
        if let Link::Up { peer, .. } = &self.link {
            peer.close();
        }
    }

    async fn on_command(&mut self, cmd: SessionCommand) {
        if let SessionCommand::Attach { client, mode, .. } = &cmd {
            if self.client.is_none() {
                self.client = Some(client.clone());
            }
            if let AttachMode::After { after_seq, .. } = mode {
                self.position.attached_after(*after_seq);
            }
        }
        match &self.link {
            Link::Up { .. } => self.forward(cmd).await,
            _ if self.waiting.len() >= WAITING_MAX => {
                cmd.reject(AcpError::Internal("too many commands waiting".into()).into())
                    .await
            }
            Link::Dialling => self.waiting.push_back(cmd),
            Link::Down => {
                self.waiting.push_back(cmd);
                self.dial();
            }
        }
    }

    /// Opens the link and initializes it as the client did, on a task.
    fn dial(&mut self) {
        let Some(client) = self.client.clone() else {
            // Nothing has attached: there is nobody to act for.
            self.done = true;
            return;
        };
        let Some(cluster) = self.shared.cluster.clone() else {
            self.done = true;
            return;
        };
        self.link = Link::Dialling;
        let profile = self.profile.clone();
        let (url, shutdown, tasks) = (
            self.url.clone(),
            self.shared.shutdown.clone(),
            self.shared.tasks.clone(),
        );
        self.tasks.spawn(async move {
            let who = OnBehalf {
                principal: &client.principal,
                principal_name: &client.principal_name,
                profile: profile.as_deref(),
                secret: &cluster.secret,
                tls: cluster.tls.clone(),
            };
            let cancel = shutdown.child_token();
            let dialled = async {
                let (link, pump) = dial(&url, who, cancel.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                tasks.spawn(pump);
                let (peer, incoming, _waiter) = acpd_wire::spawn(link, cancel);
                let init = (*client.init).clone();
                peer.request(method::INITIALIZE, Some(init))
                    .await
                    .map_err(|e| format!("initialize on the owner: {e}"))?;
                Ok((peer, incoming))
            };
            TaskDone::Dialled(dialled.await)
        });
    }

    async fn on_task(&mut self, done: TaskDone) {
        match done {
            TaskDone::Dialled(Ok((peer, incoming))) => {
                tracing::debug!(session = %self.id, url = %self.url, "forwarding the session to its owner");
                self.link = Link::Up { peer, incoming };
                if let Some(after) = self.position.reattach() {
                    self.reattach(after).await;
                }
                while let Some(cmd) = self.waiting.pop_front() {
                    self.forward(cmd).await;
                }
            }
            TaskDone::Dialled(Err(why)) => {
                tracing::warn!(session = %self.id, url = %self.url, error = %why, "cannot forward the session to its owner");
                // Said like any session owned elsewhere: a dead owner's lease expires, and
                // the retry after it takes the session over here.
                let e = ResponseError::from(AcpError::OwnedElsewhere {
                    session: self.id.to_string(),
                    owner: self.owner.id.clone(),
                    advertise_url: Some(self.owner.url.clone()),
                    expires_in_ms: self.owner.expires_in_ms,
                });
                for cmd in self.waiting.drain(..) {
                    cmd.reject(e.clone()).await;
                }
                self.done = true;
            }
            TaskDone::Relayed => {}
        }
    }

    /// One command, as the JSON-RPC it came as.
    async fn forward(&mut self, cmd: SessionCommand) {
        let sid = json!({ "sessionId": &*self.id });
        match cmd {
            SessionCommand::Attach {
                client,
                mode,
                responder,
            } => {
                let request = match mode {
                    AttachMode::Load { params } => Some((method::SESSION_LOAD, params)),
                    AttachMode::Resume { params } => Some((method::SESSION_RESUME, params)),
                    AttachMode::After { after_seq, .. } => Some((
                        method::ACPD_SESSION_ATTACH,
                        json!({
                            "sessionId": &*self.id,
                            "afterSeq": after_seq,
                            "role": client.role.as_str(),
                        }),
                    )),
                    // The owner attaches this link implicitly with its first command.
                    AttachMode::Implicit | AttachMode::New { .. } => None,
                };
                match (request, responder) {
                    (Some((method, params)), Some(r)) => self.request(method, params, r).await,
                    (_, Some(r)) => r.respond(Ok(json!({}))).await,
                    _ => {}
                }
            }
            SessionCommand::Prompt {
                params, responder, ..
            } => {
                self.request(method::SESSION_PROMPT, params, responder)
                    .await
            }
            SessionCommand::Relay {
                method,
                params,
                responder,
                ..
            } => self.request(&method, params, responder).await,
            SessionCommand::Fork {
                params, responder, ..
            } => self.request(method::SESSION_FORK, params, responder).await,
            SessionCommand::Close { responder, .. } => {
                self.request(method::SESSION_CLOSE, sid, responder).await
            }
            SessionCommand::Delete { responder, .. } => {
                self.request(method::SESSION_DELETE, sid, responder).await
            }
            SessionCommand::Cancel { .. } => self.notify(method::SESSION_CANCEL, sid).await,
            SessionCommand::RelayNotification { method, params, .. } => {
                self.notify(&method, params).await
            }
            // This connection is done with the session, or may no longer see it.
            SessionCommand::Detach { .. } => self.done = true,
            SessionCommand::Revoke { principal } => {
                if self
                    .client
                    .as_ref()
                    .is_some_and(|c| *c.principal == *principal)
                {
                    self.done = true;
                }
            }
        }
    }

    async fn request(&mut self, method: &str, params: Value, responder: Responder) {
        let Link::Up { peer, .. } = &self.link else {
            return responder.respond(Err(AcpError::SessionGone.into())).await;
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        match peer.request_in_band(method, Some(params), ROUTE, tag).await {
            Ok(_) => {
                self.inflight.insert(tag, responder);
            }
            // The link is dropping: its end (`link_lost`) dials again.
            Err(_) => responder.respond(Err(AcpError::SessionGone.into())).await,
        }
    }

    async fn notify(&mut self, method: &str, params: Value) {
        if let Link::Up { peer, .. } = &self.link {
            // A failure means the link is dropping; its end dials again.
            let _ = peer.notify(method, Some(params)).await;
        }
    }

    /// The link to the owner dropped: what was asked on it is answered with an error, and
    /// the link is dialled again, to re-attach after what the client has.
    async fn link_lost(&mut self) {
        let gone = ResponseError::from(AcpError::SessionGone);
        for (_, r) in self.inflight.drain() {
            r.respond(Err(gone.clone())).await;
        }
        if let Link::Up { peer, .. } = &self.link {
            peer.close();
        }
        self.link = Link::Down;
        if !self.position.link_lost() {
            tracing::warn!(session = %self.id, url = %self.url, "the link to the session's owner keeps dropping; the forwarder ends");
            self.done = true;
            return;
        }
        tracing::info!(session = %self.id, url = %self.url, after = ?self.position.last_seq, "the link to the session's owner dropped; dialling again");
        self.dial();
    }

    /// Attaches the new link after `after`, the last seq the client was forwarded: the owner
    /// replays the rest from its journal, then goes on live. Its answer goes to nobody.
    async fn reattach(&mut self, after: i64) {
        let Link::Up { peer, .. } = &self.link else {
            return;
        };
        let role = self
            .client
            .as_ref()
            .map_or("controller", |c| c.role.as_str());
        let params = json!({ "sessionId": &*self.id, "afterSeq": after, "role": role });
        // A failure means the link is dropping again; its end says so.
        let _ = peer
            .request_in_band(
                method::ACPD_SESSION_ATTACH,
                Some(params),
                ROUTE,
                REATTACH_TAG,
            )
            .await;
    }

    /// What the owner sent: updates go to the client as they are, answers to whoever asked,
    /// and the owner's requests to the client (permissions, fs, terminals) on a task.
    async fn on_incoming(&mut self, msg: Incoming) {
        let Some(client) = self.client.clone() else {
            return;
        };
        match msg {
            Incoming::Notification(n) => {
                let params = n.params().unwrap_or("null");
                // The owner's connection may carry other sessions too (a fork made through
                // it): those reach the client through their own forwarder, never twice.
                let about = about(params);
                if about.session_id.is_some_and(|sid| *sid != *self.id) {
                    return;
                }
                let method = serde_json::to_string(n.method()).unwrap_or_default();
                let text = format!(r#"{{"jsonrpc":"2.0","method":{method},"params":{params}}}"#);
                if client.peer.send_raw(text).await.is_err() {
                    self.done = true;
                }
                if n.method() == method::SESSION_UPDATE
                    && let Some(seq) = about.seq
                {
                    let restated = about
                        .update
                        .and_then(|u| u.kind)
                        .is_some_and(|k| crate::session::compaction::STATE.contains(&k.as_str()));
                    self.position.forwarded(seq, restated);
                }
            }
            Incoming::Response { tag, result, .. } => match self.inflight.remove(&tag) {
                Some(r) => r.respond(*result).await,
                None => {
                    if let Err(e) = *result {
                        tracing::warn!(session = %self.id, error = %e, "the owner refused the re-attach of a forwarded client");
                    }
                }
            },
            Incoming::Request(req) => {
                self.tasks.spawn(async move {
                    let answer = client.peer.request(&req.method, req.params).await;
                    let answer = answer.map_err(|e| match e {
                        PeerError::Remote(r) => r,
                        PeerError::Disconnected => AcpError::ClientLeft("is gone").into(),
                    });
                    req.responder.respond(answer).await;
                    TaskDone::Relayed
                });
            }
        }
    }
}

/// What the forwarder reads of a notification's params: `sessionId`, `_meta.acpd.seq` and
/// `update.sessionUpdate`.
#[derive(Default, serde::Deserialize)]
struct About {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
    update: Option<UpdateKind>,
    #[serde(rename = "_meta")]
    meta: Option<Meta>,
    #[serde(skip)]
    seq: Option<i64>,
}

#[derive(serde::Deserialize)]
struct UpdateKind {
    #[serde(rename = "sessionUpdate")]
    kind: Option<String>,
}

#[derive(serde::Deserialize)]
struct Meta {
    acpd: Option<AcpdMeta>,
}

#[derive(serde::Deserialize)]
struct AcpdMeta {
    seq: Option<i64>,
}

/// `params.sessionId`, `params._meta.acpd.seq` and the update's kind, read without building the params into a
/// tree (whatever else they hold is skipped).
fn about(params: &str) -> About {
    let mut a = serde_json::from_str::<About>(params).unwrap_or_default();
    a.seq = a.meta.take().and_then(|m| m.acpd).and_then(|m| m.seq);
    a
}

/// Where a forwarded client is in the owner's journal (pure): the seq of the last update it
/// was forwarded, and how many dials in a row forwarded nothing.
#[derive(Debug, Default)]
struct Position {
    last_seq: Option<i64>,
    /// Dials since the last forwarded update.
    redials: u32,
    /// The link dropped: the next one re-attaches.
    lost: bool,
}

impl Position {
    /// The client attached after `seq` (`_acpd/session/attach`): it has everything up to it.
    fn attached_after(&mut self, seq: i64) {
        self.last_seq = Some(seq);
    }

    /// An update was forwarded to the client. The last one, not the highest: a load replays
    /// from the start, and the client is where the replay is. Except a `restated` one (a
    /// state update a load replays after the history, under the lower seq it was journaled
    /// at): it moves the position only forward.
    fn forwarded(&mut self, seq: i64, restated: bool) {
        self.last_seq = match self.last_seq {
            Some(last) if restated => Some(last.max(seq)),
            _ => Some(seq),
        };
        self.redials = 0;
    }

    /// The link dropped: whether to dial again.
    fn link_lost(&mut self) -> bool {
        self.lost = true;
        self.redials += 1;
        self.redials <= REDIALS
    }

    /// A link is up: after which seq to re-attach it, if it replaces one that dropped. A
    /// client forwarded no update yet has no position: its next command attaches it again
    /// (implicitly, or as it asks).
    fn reattach(&mut self) -> Option<i64> {
        std::mem::take(&mut self.lost)
            .then_some(self.last_seq)
            .flatten()
    }
}

/// The next message from the owner; never resolves while the link is not up.
async fn next_incoming(link: &mut Link) -> Option<Incoming> {
    match link {
        Link::Up { incoming, .. } => incoming.recv().await,
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::{Position, REDIALS, about};

    #[test]
    fn about_reads_only_the_session_id_and_seq() {
        let p = r#"{"update":{"sessionUpdate":"agent_message_chunk","content":{"text":"x"}},"sessionId":"s-1","_meta":{"acpd":{"seq":7},"other":1}}"#;
        let a = about(p);
        assert_eq!((a.session_id.as_deref(), a.seq), (Some("s-1"), Some(7)));
        let kind = a.update.and_then(|u| u.kind);
        assert_eq!(kind.as_deref(), Some("agent_message_chunk"));
        let a = about(r#"{"other":1,"_meta":{"x":2}}"#);
        assert_eq!((a.session_id, a.seq), (None, None));
        assert_eq!(about("[1,2]").session_id, None);
        assert_eq!(about("null").seq, None);
    }

    #[test]
    fn a_dropped_link_reattaches_after_the_last_forwarded_update() {
        let mut p = Position::default();
        assert_eq!(
            p.reattach(),
            None,
            "a first dial attaches as the client asked"
        );
        // A load's replay starts over below a live update already forwarded.
        p.forwarded(40, false);
        p.forwarded(1, false);
        p.forwarded(2, false);
        // The load's state, after its history, under the seq it was journaled at.
        p.forwarded(1, true);
        assert!(p.link_lost());
        assert_eq!(p.reattach(), Some(2));
        assert_eq!(p.reattach(), None, "once per dropped link");
    }

    #[test]
    fn an_attach_after_a_seq_is_a_position_and_nothing_forwarded_is_none() {
        let mut p = Position::default();
        assert!(p.link_lost());
        assert_eq!(p.reattach(), None);
        p.attached_after(12);
        assert!(p.link_lost());
        assert_eq!(p.reattach(), Some(12));
    }

    #[test]
    fn redials_that_forward_nothing_run_out_and_an_update_refills_them() {
        let mut p = Position::default();
        for _ in 0..REDIALS {
            assert!(p.link_lost());
        }
        assert!(!p.link_lost());
        let mut p = Position::default();
        for _ in 0..REDIALS {
            assert!(p.link_lost());
            p.forwarded(3, false);
        }
        assert!(p.link_lost());
    }
}

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
//! the connection detaches, when the link drops (its next command opens the session again,
//! wherever it lives then) or at shutdown.
//!
//! The forwarder waits on its own client's queue when it relays (backpressure reaches the
//! owner, which lags this link onto its journal like any slow client); it serves nobody else.

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
                    None => {
                        tracing::info!(session = %self.id, "peer link closed; the forwarder ends");
                        break;
                    }
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
        if let SessionCommand::Attach { client, .. } = &cmd
            && self.client.is_none()
        {
            self.client = Some(client.clone());
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
                peer.request("initialize", Some(init))
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
                mode, responder, ..
            } => {
                let request = match mode {
                    AttachMode::Load { params } => Some(("session/load", params)),
                    AttachMode::Resume { params } => Some(("session/resume", params)),
                    AttachMode::After { after_seq, .. } => Some((
                        "_acpd/session/attach",
                        json!({ "sessionId": &*self.id, "afterSeq": after_seq }),
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
            } => self.request("session/prompt", params, responder).await,
            SessionCommand::Relay {
                method,
                params,
                responder,
                ..
            } => self.request(&method, params, responder).await,
            SessionCommand::Fork {
                params, responder, ..
            } => self.request("session/fork", params, responder).await,
            SessionCommand::Close { responder, .. } => {
                self.request("session/close", sid, responder).await
            }
            SessionCommand::Delete { responder, .. } => {
                self.request("session/delete", sid, responder).await
            }
            SessionCommand::Cancel { .. } => self.notify("session/cancel", sid).await,
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
            Err(_) => {
                responder.respond(Err(AcpError::SessionGone.into())).await;
                self.done = true;
            }
        }
    }

    async fn notify(&mut self, method: &str, params: Value) {
        if let Link::Up { peer, .. } = &self.link
            && peer.notify(method, Some(params)).await.is_err()
        {
            self.done = true;
        }
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
                if session_of(params).is_some_and(|sid| *sid != *self.id) {
                    return;
                }
                let method = serde_json::to_string(n.method()).unwrap_or_default();
                let text = format!(r#"{{"jsonrpc":"2.0","method":{method},"params":{params}}}"#);
                if client.peer.send_raw(text).await.is_err() {
                    self.done = true;
                }
            }
            Incoming::Response { tag, result, .. } => {
                if let Some(r) = self.inflight.remove(&tag) {
                    r.respond(result).await;
                }
            }
            Incoming::Request(req) => {
                self.tasks.spawn(async move {
                    let answer = client.peer.request(&req.method, req.params).await;
                    let answer = answer.map_err(|e| match e {
                        PeerError::Remote(r) => r,
                        PeerError::Disconnected => ResponseError::internal("the client is gone"),
                    });
                    req.responder.respond(answer).await;
                    TaskDone::Relayed
                });
            }
        }
    }
}

/// `params.sessionId`, read without building the params into a tree.
fn session_of(params: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    }
    serde_json::from_str::<Params>(params).ok()?.session_id
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
    use super::session_of;

    #[test]
    fn session_of_reads_only_the_session_id() {
        let p = r#"{"update":{"sessionUpdate":"agent_message_chunk","content":{"text":"x"}},"sessionId":"s-1"}"#;
        assert_eq!(session_of(p).as_deref(), Some("s-1"));
        assert_eq!(session_of(r#"{"other":1}"#), None);
        assert_eq!(session_of("[1,2]"), None);
        assert_eq!(session_of("null"), None);
    }
}

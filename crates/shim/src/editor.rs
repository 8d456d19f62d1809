//! The little the relay knows about ACP (path mapping and the editor's MCP servers are
//! `map.rs`'s and `mcp.rs`'s): enough to survive a daemon restart without the editor
//! noticing. It reads ids, methods, session ids and `_meta.acpd.seq`; everything else is
//! relayed as the bytes it came in.
//!
//! After a restart the shim re-sends the cached `initialize`, re-attaches every open session
//! from the last seq the editor was given, and answers the editor's requests that died with
//! the old daemon. Requests the new daemon makes get ids of a new range, so a late answer to a
//! request of the dead daemon can never be taken for an answer to a new one.

use acpd_protocol::method;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use super::mcp::McpClaims;
use acpd_protocol::update_form;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// Ids of the shim's own requests; answers with such an id are not the editor's.
pub const PRIVATE_PREFIX: &str = "acp-shim:";

/// Ids of requests from a daemon after a restart are moved by this much per restart.
const EPOCH_STRIDE: u64 = 1 << 40;

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<PeekParams<'a>>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PeekParams<'a> {
    #[serde(rename = "sessionId", borrow, default)]
    session_id: Option<Cow<'a, str>>,
    #[serde(rename = "_meta", default)]
    meta: Option<Meta>,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    acpd: Option<AcpdMeta>,
}

#[derive(Deserialize)]
struct AcpdMeta {
    #[serde(default)]
    seq: Option<i64>,
}

/// Just the envelope of a message, for shapes `Peek` does not fit (e.g. array params).
#[derive(Deserialize)]
struct Bare<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
}

fn peek(text: &str) -> Option<Peek<'_>> {
    serde_json::from_str::<Peek<'_>>(text).ok().or_else(|| {
        let b = serde_json::from_str::<Bare<'_>>(text).ok()?;
        Some(Peek {
            id: b.id,
            method: b.method,
            params: None,
            result: None,
        })
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Initialize,
    Prompt,
    New,
    Other,
}

/// What to do with a message from the daemon.
#[derive(Debug, PartialEq, Eq)]
pub enum FromDaemon {
    /// Relay it; `Some` when its id had to be rewritten.
    Forward(Option<String>),
    /// The answer to one of the shim's own requests; `ok` false for an error. `again`: a
    /// re-attach to send instead (id, line), when the daemon's journal ends before the seq
    /// the editor was given.
    Private {
        id: String,
        ok: bool,
        again: Option<(String, String)>,
    },
    /// Not one JSON value: the daemon broke the protocol.
    NotJson,
}

/// What a restart asks of the shim.
#[derive(Debug, Default)]
pub struct Restart {
    /// Answers for the editor: its requests that died with the old daemon.
    pub answers: Vec<String>,
    /// The shim's own requests for the new link, in order: initialize, then attaches.
    pub resend: Vec<String>,
    /// Ids of those whose answers must arrive before the editor's messages go on.
    pub private: HashSet<String>,
    /// The editor's messages that never reached the old daemon, to send after re-attach.
    pub requeued: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// The editor's `initialize`: its id and params, raw.
    init: Option<(String, String)>,
    init_answered: bool,
    /// The editor's requests the daemon has not answered, by raw id.
    pending: HashMap<String, Kind>,
    /// Open sessions and the last `_meta.acpd.seq` the editor was given for each.
    sessions: HashMap<String, i64>,
    closed: HashSet<String>,
    /// How many times the daemon restarted under this shim.
    epoch: u64,
    /// The daemon's requests to the editor: id the editor sees -> (epoch, id the daemon used).
    daemon_reqs: HashMap<String, (u64, String)>,
    next_private: u64,
    /// The shim's re-attaches in flight: private id -> (session, afterSeq).
    attaching: HashMap<String, (String, i64)>,
    /// The tunnelled MCP servers this shim runs: each re-attach claims its session's.
    mcp_claims: McpClaims,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Notes an editor message; `None` when it must not go to the daemon.
    pub fn note_editor(&mut self, line: String) -> Option<String> {
        let Some(p) = peek(&line) else {
            return Some(line);
        };
        match (p.method.as_deref(), p.id) {
            (Some(method), Some(id)) => {
                let id = id.get().to_owned();
                let sid = p
                    .params
                    .as_ref()
                    .and_then(|p| p.session_id.as_deref())
                    .map(str::to_owned);
                let kind = match method {
                    method::INITIALIZE => {
                        self.init = init_params(&line).map(|params| (id.clone(), params));
                        self.init_answered = false;
                        Kind::Initialize
                    }
                    method::SESSION_PROMPT => Kind::Prompt,
                    method::SESSION_NEW => Kind::New,
                    method::SESSION_LOAD | method::SESSION_RESUME | method::ACPD_SESSION_ATTACH => {
                        if let Some(sid) = sid {
                            self.closed.remove(&sid);
                            self.sessions.entry(sid).or_insert(0);
                        }
                        Kind::Other
                    }
                    method::SESSION_CLOSE | method::SESSION_DELETE => {
                        if let Some(sid) = sid {
                            self.sessions.remove(&sid);
                            self.closed.insert(sid);
                        }
                        Kind::Other
                    }
                    _ => Kind::Other,
                };
                self.pending.insert(id, kind);
                Some(line)
            }
            (None, Some(id)) => match self.daemon_reqs.remove(id.get()) {
                Some((epoch, _)) if epoch != self.epoch => {
                    tracing::debug!(
                        id = id.get(),
                        "answer to a request of a restarted daemon dropped"
                    );
                    None
                }
                Some((_, orig)) if orig != id.get() => Some(set_id(&line, &orig)),
                _ => Some(line),
            },
            _ => Some(line),
        }
    }

    /// Notes a daemon message and says what to do with it.
    ///
    /// This parse is the only one a daemon message gets in the shim (its frame is split without
    /// reading it): it must also make sure the message is one JSON value.
    pub fn note_daemon(&mut self, text: &str) -> FromDaemon {
        // Nearly every message: an update in acpd's own form, read off its ends, not parsed.
        if let Some((sid, seq)) = update_form::read(text) {
            self.note_update(sid, seq);
            return FromDaemon::Forward(None);
        }
        let Some(p) = peek(text) else {
            // Not an object of the usual shape (rare): is it JSON at all?
            return match serde_json::from_str::<&RawValue>(text) {
                Ok(_) => FromDaemon::Forward(None),
                Err(_) => FromDaemon::NotJson,
            };
        };
        match (p.method.as_deref(), p.id) {
            (Some(method::SESSION_UPDATE), None) => {
                let params = p.params.as_ref();
                let sid = params.and_then(|p| p.session_id.as_deref());
                let seq = params.and_then(|p| p.meta.as_ref()?.acpd.as_ref()?.seq);
                if let (Some(sid), Some(seq)) = (sid, seq) {
                    self.note_update(sid, seq);
                }
                FromDaemon::Forward(None)
            }
            (Some("$/cancel_request"), None) if self.epoch > 0 => {
                FromDaemon::Forward(self.remap_cancel(text))
            }
            (Some(_), Some(id)) => {
                let orig = id.get().to_owned();
                if self.epoch == 0 {
                    self.daemon_reqs.insert(orig.clone(), (0, orig));
                    return FromDaemon::Forward(None);
                }
                let shown = self.shown_id(&orig);
                self.daemon_reqs.insert(shown.clone(), (self.epoch, orig));
                FromDaemon::Forward(Some(set_id(text, &shown)))
            }
            (None, Some(id)) => {
                let raw = id.get();
                if let Ok(s) = serde_json::from_str::<&str>(raw)
                    && s.starts_with(PRIVATE_PREFIX)
                {
                    let ok = p.result.is_some();
                    let sent = self.attaching.remove(raw);
                    let again = sent
                        .filter(|_| !ok)
                        .and_then(|s| self.attach_again(s, text));
                    return FromDaemon::Private {
                        id: raw.to_owned(),
                        ok,
                        again,
                    };
                }
                match self.pending.remove(raw) {
                    Some(Kind::New) => {
                        if let Some(sid) = p.result.and_then(new_session_id) {
                            self.closed.remove(&sid);
                            self.sessions.entry(sid).or_insert(0);
                        }
                    }
                    Some(Kind::Initialize) => self.init_answered = true,
                    _ => {}
                }
                FromDaemon::Forward(None)
            }
            _ => FromDaemon::Forward(None),
        }
    }

    /// The editor was given update `seq` of session `sid`.
    fn note_update(&mut self, sid: &str, seq: i64) {
        if self.closed.contains(sid) {
            return;
        }
        // Looked up first: a known session's update (nearly all) allocates no key.
        match self.sessions.get_mut(sid) {
            Some(last) => *last = (*last).max(seq),
            None => _ = self.sessions.insert(sid.to_owned(), seq.max(0)),
        }
    }

    /// The daemon restarted (or forgot the link): plan the recovery. `unsent` are the editor's
    /// messages that never left the shim.
    pub fn on_restart(&mut self, unsent: Vec<String>, mcp_claims: McpClaims) -> Restart {
        self.epoch += 1;
        self.mcp_claims = mcp_claims;
        self.attaching.clear();
        let mut r = Restart::default();
        let mut requeued_ids = HashSet::new();
        for m in unsent {
            let Some(p) = peek(&m) else {
                r.requeued.push(m);
                continue;
            };
            match (p.method.as_deref(), p.id) {
                // Answers to the dead daemon's requests, and the shim's own earlier requests,
                // mean nothing to the new daemon.
                (None, Some(_)) => continue,
                (Some(_), Some(id)) if is_private(id.get()) => continue,
                (Some(_), Some(id)) => {
                    requeued_ids.insert(id.get().to_owned());
                }
                _ => {}
            }
            r.requeued.push(m);
        }
        if let Some((id, params)) = self.init.clone() {
            if self.init_answered {
                let pid = self.private_id();
                r.resend.push(request(&pid, method::INITIALIZE, &params));
                r.private.insert(pid);
            } else if !requeued_ids.contains(&id) {
                // The editor's own initialize died unanswered: it goes again, as the editor's.
                r.resend.push(request(&id, method::INITIALIZE, &params));
                requeued_ids.insert(id);
            }
        }
        let mut sessions: Vec<(&String, &i64)> = self.sessions.iter().collect();
        sessions.sort();
        let attaches: Vec<(String, i64)> =
            sessions.into_iter().map(|(s, n)| (s.clone(), *n)).collect();
        for (sid, after) in attaches {
            let (pid, line) = self.reattach(sid, after);
            r.resend.push(line);
            r.private.insert(pid);
        }
        let mut dead: Vec<(String, Kind)> = self
            .pending
            .iter()
            .filter(|(id, _)| !requeued_ids.contains(*id))
            .map(|(id, k)| (id.clone(), *k))
            .collect();
        dead.sort();
        for (id, kind) in dead {
            self.pending.remove(&id);
            r.answers.push(match kind {
                Kind::Prompt => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"stopReason":"cancelled"}}}}"#),
                _ => format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32603,"message":"acpd restarted; please retry"}}}}"#
                ),
            });
        }
        r
    }

    /// A re-attach the daemon refused because its journal ends at `error.data.lastSeq`, before
    /// the `afterSeq` sent: attach again from that end (the editor keeps what it has; what
    /// comes next is new), once.
    fn attach_again(
        &mut self,
        (sid, after): (String, i64),
        text: &str,
    ) -> Option<(String, String)> {
        let v: Value = serde_json::from_str(text).ok()?;
        let last = v.pointer("/error/data/lastSeq")?.as_i64()?;
        if last >= after || self.closed.contains(&sid) {
            return None;
        }
        tracing::warn!(session = %sid, after, last, "acpd's journal ends before what the editor was given; attaching from its end");
        self.sessions.insert(sid.clone(), last);
        Some(self.reattach(sid, last))
    }

    /// A re-attach of `sid` after `after`, claiming its tunnelled MCP servers: (id, line).
    fn reattach(&mut self, sid: String, after: i64) -> (String, String) {
        let pid = self.private_id();
        let mut params = json!({ "sessionId": sid, "afterSeq": after });
        if let Some(servers) = self.mcp_claims.get(&sid) {
            params["mcpServers"] = servers.clone();
        }
        self.attaching.insert(pid.clone(), (sid, after));
        let line = request(&pid, method::ACPD_SESSION_ATTACH, &params.to_string());
        (pid, line)
    }

    /// How many of the editor's requests the daemon still owes an answer.
    pub fn owed(&self) -> usize {
        self.pending.len()
    }

    /// How many sessions a restart would re-attach.
    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    fn private_id(&mut self) -> String {
        self.next_private += 1;
        format!("\"{PRIVATE_PREFIX}{}\"", self.next_private)
    }

    /// The id the editor sees for a daemon request made in the current epoch.
    fn shown_id(&self, orig: &str) -> String {
        match orig.parse::<u64>() {
            Ok(n) if n < EPOCH_STRIDE => (n + self.epoch * EPOCH_STRIDE).to_string(),
            _ => {
                let inner =
                    serde_json::from_str::<String>(orig).unwrap_or_else(|_| orig.to_owned());
                Value::String(format!("{PRIVATE_PREFIX}e{}:{inner}", self.epoch)).to_string()
            }
        }
    }

    fn remap_cancel(&self, text: &str) -> Option<String> {
        let mut v: Value = serde_json::from_str(text).ok()?;
        let orig = v.pointer("/params/requestId")?.to_string();
        let shown = self.shown_id(&orig);
        if !self.daemon_reqs.contains_key(&shown) {
            return None;
        }
        v["params"]["requestId"] = serde_json::from_str(&shown).ok()?;
        Some(v.to_string())
    }
}

fn is_private(raw_id: &str) -> bool {
    serde_json::from_str::<&str>(raw_id).is_ok_and(|s| s.starts_with(PRIVATE_PREFIX))
}

fn request(id: &str, method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
}

fn init_params(line: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct P<'a> {
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    let p: P<'_> = serde_json::from_str(line).ok()?;
    Some(
        p.params
            .map_or_else(|| "{}".to_owned(), |r| r.get().to_owned()),
    )
}

fn new_session_id(result: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct R {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    }
    serde_json::from_str::<R>(result.get()).ok()?.session_id
}

/// The same message with another id (rare: only around restarts).
fn set_id(text: &str, raw_id: &str) -> String {
    match (
        serde_json::from_str::<Value>(text),
        serde_json::from_str::<Value>(raw_id),
    ) {
        (Ok(mut v), Ok(id)) => {
            v["id"] = id;
            v.to_string()
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests;

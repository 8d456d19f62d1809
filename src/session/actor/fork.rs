//! `session/fork` for agents that have it (`sessionCapabilities.fork`): the agent forks its
//! side, and acpd makes the fork a session of its own — a new acpd session id mapped to the
//! agent's new id, its journal a copy of the parent's (renumbered from 1, the session id in
//! each body rewritten), its row the parent's settings. It is listed, loaded, prompted and
//! closed like any other. Agents without it answer -32601, and acpd's capabilities say so.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use super::{AgentState, Inflight, Session};
use crate::agent::AgentHandle;
use crate::error::AcpError;
use crate::session::{AttachMode, Client, HubCommand, SessionCommand, Shared, now_ms};
use acpd_store::{NewEntry, SessionRow, Watermark};
use acpd_wire::{Responder, ResponseError};

/// Journal entries read per page while copying.
const COPY_PAGE: i64 = 512;

/// Whether the agent's `initialize` answer offers `session/fork`.
pub(crate) fn agent_forks(agent: &AgentHandle) -> bool {
    agent
        .init
        .pointer("/agentCapabilities/sessionCapabilities/fork")
        .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
}

impl Session {
    /// `session/fork` on this (bound) session.
    pub(super) async fn fork(&mut self, client: Client, mut params: Value, responder: Responder) {
        let AgentState::Bound { agent, .. } = &self.agent.state else {
            let e = AcpError::AgentExited("no agent process".into());
            return self.reply(responder, Err(e.into()));
        };
        if !agent_forks(agent) {
            let e = AcpError::MethodNotFound(method::SESSION_FORK.into()).into();
            return self.reply(responder, Err(e));
        }
        if params.get("cwd").is_none() {
            params["cwd"] = json!(self.row.cwd);
        }
        if params.get("mcpServers").is_none() {
            params["mcpServers"] = self
                .meta
                .value()
                .get_mut("mcpServers")
                .map(Value::take)
                .unwrap_or_else(|| json!([]));
        }
        // The fork's row keeps the `acpd-mcp:` form; the agent gets loopback URLs (served
        // by this session's carrier, which the fork inherits).
        let mut to_agent = params.clone();
        to_agent["mcpServers"] = self
            .shared
            .mcp
            .for_agent(&self.id, &params["mcpServers"])
            .await;
        match self.send_in_band(method::SESSION_FORK, to_agent).await {
            Ok(tag) => {
                let fork = Inflight::Fork {
                    responder,
                    client,
                    params,
                };
                self.agent.sent(tag, fork);
            }
            Err(e) => self.reply(responder, Err(e.into())),
        }
    }

    /// The agent forked its side: the new acpd session is made by a task (row, journal copy,
    /// actor), which answers the client once it is attached.
    pub(super) fn fork_answered(
        &mut self,
        responder: Responder,
        client: Client,
        params: Value,
        result: Result<Value, ResponseError>,
    ) {
        let result = match result {
            Ok(v) => v,
            Err(e) => return self.reply(responder, Err(e)),
        };
        let Some(agent_sid) = result.get("sessionId").and_then(Value::as_str) else {
            let e = AcpError::Internal("the agent's session/fork answer has no sessionId".into());
            return self.reply(responder, Err(e.into()));
        };
        let AgentState::Bound { agent, .. } = &self.agent.state else {
            let e = AcpError::AgentExited("it exited during the fork".into());
            return self.reply(responder, Err(e.into()));
        };
        let job = ForkJob {
            shared: self.shared.clone(),
            parent: self.row.clone(),
            meta: self.meta.value(),
            agent: agent.clone(),
            agent_sid: agent_sid.to_owned(),
            params,
            result,
            upto: self.position.last(),
            durable: self.position.durable_rx.clone(),
            client,
        };
        self.shared.tasks.spawn(async move {
            if let Err((e, responder)) = job.run(responder).await {
                responder.respond(Err(e.into())).await;
            }
        });
    }
}

/// Everything the task that makes a fork needs.
struct ForkJob {
    shared: Shared,
    parent: SessionRow,
    meta: Value,
    agent: AgentHandle,
    agent_sid: String,
    params: Value,
    result: Value,
    /// The parent's journal up to here is copied (the fork point).
    upto: i64,
    durable: watch::Receiver<Watermark>,
    client: Client,
}

type Failed = (AcpError, Responder);

impl ForkJob {
    async fn run(self, responder: Responder) -> Result<(), Failed> {
        let shared = &self.shared;
        let (reply, rx) = oneshot::channel();
        let admit = HubCommand::Admit {
            principal: self.parent.principal_id.clone(),
            reply,
        };
        if shared.hub.send(admit).await.is_err() || !rx.await.unwrap_or(false) {
            return Err((AcpError::TooManySessions, responder));
        }
        let id = crate::session::new_session_id();
        let mut row = self.row(&id);
        if let Err(e) = shared.store.insert_session(&row).await {
            return Err((e.into(), responder));
        }
        row.last_seq = match self.copy_journal(&id).await {
            Ok(n) => n,
            Err(e) => return Err((e, responder)),
        };
        tracing::info!(parent = %self.parent.id, fork = %id, entries = row.last_seq, "session forked");
        shared.mcp.inherit(&self.parent.id, &id);
        let epoch = match crate::session::hub::lease_new(shared, &id).await {
            Ok(epoch) => epoch,
            Err(e) => return Err((e, responder)),
        };
        let (reply, rx) = oneshot::channel();
        let spawn = HubCommand::Spawn {
            row: Box::new(row),
            agent: Some((self.agent, self.agent_sid)),
            epoch,
            reply,
        };
        let _ = shared.hub.send(spawn).await;
        let Ok(handle) = rx.await else {
            return Err((AcpError::SessionGone, responder));
        };
        let mut result = self.result;
        result["sessionId"] = json!(id);
        let attach = SessionCommand::Attach {
            client: self.client,
            mode: AttachMode::New { result },
            responder: Some(responder),
        };
        match handle.send(attach).await {
            Ok(()) => Ok(()),
            Err(cmd) => match cmd.into_responder() {
                Some(r) => Err((AcpError::SessionGone, r)),
                None => Ok(()),
            },
        }
    }

    /// The fork's row: the parent's settings, the agent's new id, what the fork answer says.
    fn row(&self, id: &str) -> SessionRow {
        let (p, r) = (&self.parent, &self.result);
        let now = now_ms();
        let pick = |key: &str| {
            r.get(key)
                .filter(|v| !v.is_null())
                .or_else(|| self.meta.get(key))
                .cloned()
                .unwrap_or(Value::Null)
        };
        let meta = json!({
            "modes": pick("modes"),
            "configOptions": pick("configOptions"),
            "mcpServers": self.params.get("mcpServers").cloned().unwrap_or_else(|| json!([])),
        });
        SessionRow {
            id: id.to_owned(),
            principal_id: p.principal_id.clone(),
            agent: p.agent.clone(),
            agent_session_id: Some(self.agent_sid.clone()),
            cwd: self
                .params
                .get("cwd")
                .and_then(Value::as_str)
                .unwrap_or(&p.cwd)
                .to_owned(),
            additional_dirs: self
                .params
                .get("additionalDirectories")
                .map(Value::to_string)
                .unwrap_or_else(|| p.additional_dirs.clone()),
            title: p.title.clone(),
            mode_id: meta
                .pointer("/modes/currentModeId")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| p.mode_id.clone()),
            config_values: p.config_values.clone(),
            meta: meta.to_string(),
            created_at_ms: now,
            updated_at_ms: now,
            closed: false,
            last_seq: 0,
            owner_instance: None,
            lease_until_ms: None,
        }
    }

    /// Copies the parent's journal up to the fork point into session `id`, renumbered from
    /// 1; returns the last seq written (durable when this returns).
    async fn copy_journal(&self, id: &str) -> Result<i64, AcpError> {
        let store = &self.shared.store;
        let mut durable = self.durable.clone();
        let _ = durable.wait_for(|d| d.settled(self.upto)).await;
        let (mark, mut mark_rx) = acpd_store::watermark(0);
        let new_id: Arc<str> = Arc::from(id);
        let (mut after, mut seq) = (0, 0);
        'pages: loop {
            let page = store
                .journal_after(&self.parent.id, after, COPY_PAGE)
                .await?;
            let full = page.len() as i64 == COPY_PAGE;
            for e in page {
                if e.seq > self.upto {
                    break 'pages;
                }
                after = e.seq;
                seq += 1;
                let entry = NewEntry {
                    session_id: new_id.clone(),
                    seq,
                    kind: e.kind,
                    body: rewrite(&e.body, id, seq).into(),
                    at_ms: e.at_ms,
                    // A brand-new session: nobody else can own it yet.
                    epoch: None,
                };
                store.append(entry, mark.clone()).await?;
            }
            if !full {
                break;
            }
        }
        let _ = mark_rx.wait_for(|d| d.settled(seq)).await;
        if let Some(bad) = mark_rx.borrow().rejected {
            return Err(AcpError::Internal(format!(
                "the store rejected entry {bad} of the fork's journal copy"
            )));
        }
        Ok(seq)
    }
}

/// A journal body with the fork's session id and seq.
fn rewrite(body: &str, id: &str, seq: i64) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(body) else {
        return body.to_owned();
    };
    if let Some(params) = v.get_mut("params").and_then(Value::as_object_mut) {
        params.insert("sessionId".into(), json!(id));
        let meta = params.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta["acpd"]["seq"] = json!(seq);
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::rewrite;
    use serde_json::{Value, json};

    #[test]
    fn rewrite_sets_the_forks_id_and_seq_and_keeps_the_rest() {
        let body = json!({
            "jsonrpc": "2.0", "method": "session/update",
            "params": { "sessionId": "s-parent", "update": { "sessionUpdate": "agent_message_chunk" },
                        "_meta": { "acpd": { "seq": 17 }, "other": 1 } },
        })
        .to_string();
        let v: Value = serde_json::from_str(&rewrite(&body, "s-fork", 3)).unwrap();
        assert_eq!(v["params"]["sessionId"], "s-fork");
        assert_eq!(v["params"]["_meta"]["acpd"]["seq"], 3);
        assert_eq!(v["params"]["_meta"]["other"], 1);
        assert_eq!(
            v["params"]["update"]["sessionUpdate"],
            "agent_message_chunk"
        );
    }
}

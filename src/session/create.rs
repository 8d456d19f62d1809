//! `session/new`: the agent's session, the session's row, its actor, its creator attached.
//!
//! On the answer's path, in order: a place under the live-session limit (the hub), the
//! agent process (the pool), the agent's own `session/new`, the row queued to the journal
//! writer ahead of everything else of the session (`store_row`: committed after the answer,
//! before any update or prompt answer of the session can be), the actor's start, the attach. The
//! actor is started here, not by the hub: the hub is told by a message queued before the
//! attach, so it has the session before the answer can leave and whoever opens the id after
//! the answer finds it live; nobody waits for the hub's loop to take that message.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    AttachMode, Client, SessionCommand, SessionHandle, Shared, actor, hub, mcp, new_session_id,
    now_ms,
};
use crate::agent::AgentKey;
use crate::error::AcpError;
use acpd_store::{JournalWatch, SessionRow};
use acpd_wire::Responder;

/// Why it failed, with the responder still to answer.
pub(super) type Failed = (AcpError, Responder);

pub(super) async fn create(
    shared: &Shared,
    principal: &str,
    profile: &str,
    client: Client,
    params: Value,
    responder: Responder,
) -> Result<SessionHandle, Failed> {
    // Held until the session is started; every early return below gives it back.
    let Some(reservation) = hub::Reservation::admit(shared, principal).await else {
        return Err((AcpError::TooManySessions, responder));
    };
    let key = AgentKey {
        principal: principal.to_owned(),
        profile: profile.to_owned(),
    };
    let agent = match shared.pool.get(key, client.init.clone()).await {
        Ok(a) => a,
        Err(e) => return Err((e.into(), responder)),
    };
    let Some(cwd) = params.get("cwd").and_then(Value::as_str).map(str::to_owned) else {
        return Err((AcpError::InvalidParams("cwd is required".into()), responder));
    };
    // Stdio MCP servers the policy does not allow never reach a hosted agent.
    let policy = &shared.settings.mcp_policy;
    let (mut to_agent, mcp_refused) = match mcp::for_agent(profile, &params, policy, "(new)") {
        Ok(p) => p,
        Err(why) => return Err((AcpError::InvalidParams(why.to_string()), responder)),
    };
    let additional_dirs = list_of(&to_agent, "additionalDirectories").to_string();
    // The id comes first: the tunnelled servers' routes are the session's. What is stored
    // is their `acpd-mcp:` form; only the agent gets loopback URLs.
    let id = new_session_id();
    let servers = list_of(&to_agent, "mcpServers");
    if client.carries_mcp() {
        shared.mcp.carry(&id, &client.peer, &servers);
    }
    to_agent["mcpServers"] = shared.mcp.for_agent(&id, &servers).await;
    let mut result = match agent.request(method::SESSION_NEW, to_agent).await {
        Ok(r) => r,
        Err(e) => {
            shared.mcp.end(&id);
            return Err((e.into(), responder));
        }
    };
    if !mcp_refused.is_empty() {
        mark_refused(&mut result, mcp_refused);
    }
    let agent_sid = match agent_session_id(&result) {
        Ok(sid) => sid,
        Err(e) => return Err((e, responder)),
    };
    let place = (cwd, additional_dirs);
    let row = new_row(
        id.clone(),
        principal,
        profile,
        agent_sid.clone(),
        place,
        &result,
        servers,
    );
    let (row_queued, epoch) = match store_row(shared, &row).await {
        Ok(stored) => stored,
        Err(e) => return Err((e, responder)),
    };
    result["sessionId"] = Value::String(id);
    let serial = shared.next_serial();
    let lease = epoch.and_then(|e| Some(shared.cluster.as_ref()?.hold(Arc::from(&*row.id), e)));
    let created = actor::Created {
        owner: &client.principal_name,
        row_queued,
    };
    let agent = Some((agent, agent_sid));
    let handle = actor::spawn(row, agent, shared.clone(), serial, lease, Some(created));
    // Queued before the attach, so before the answer exists.
    reservation.started(handle.clone(), serial).await;
    attach_creator(handle, client, result, responder).await
}

/// Stores the new row. Queued to the journal writer (`Store::queue_session`) where it can be:
/// the answer does not wait for the commit, and nothing the session journals can be durable
/// before its row (issue 45). Inserted on the answer's path with several replicas (the lease
/// lives on the row and is taken before the answer) and while the writer is stuck (the client
/// hears of the outage now instead of a session that never commits). With replicas, the new
/// session's lease epoch too.
async fn store_row(
    shared: &Shared,
    row: &SessionRow,
) -> Result<(Option<JournalWatch>, Option<i64>), AcpError> {
    if shared.cluster.is_some() || shared.store.writes_stalled() {
        shared.store.insert_session(row).await?;
        return Ok((None, hub::lease_new(shared, &row.id).await?));
    }
    Ok((Some(shared.store.queue_session(row.clone()).await?), None))
}

/// The new session's row: the agent's answer (`result`) gives what it starts with (its modes
/// and options); `servers` are its MCP servers as stored.
fn new_row(
    id: String,
    principal: &str,
    profile: &str,
    agent_sid: String,
    (cwd, additional_dirs): (String, String),
    result: &Value,
    servers: Value,
) -> SessionRow {
    let now = now_ms();
    SessionRow {
        id,
        principal_id: principal.to_owned(),
        agent: profile.to_owned(),
        agent_session_id: Some(agent_sid),
        cwd,
        additional_dirs,
        title: None,
        mode_id: result
            .pointer("/modes/currentModeId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        config_values: "{}".into(),
        meta: json!({
            "modes": result.get("modes"),
            "configOptions": result.get("configOptions"),
            "mcpServers": servers,
        })
        .to_string(),
        created_at_ms: now,
        updated_at_ms: now,
        closed: false,
        last_seq: 0,
        owner_instance: None,
        lease_until_ms: None,
    }
}

/// Tells the client which of its MCP servers the policy kept from the agent.
fn mark_refused(result: &mut Value, mcp_refused: Vec<String>) {
    if !result["_meta"].is_object() {
        result["_meta"] = json!({});
    }
    if !result["_meta"]["acpd"].is_object() {
        result["_meta"]["acpd"] = json!({});
    }
    result["_meta"]["acpd"]["mcpServersRefused"] = json!(mcp_refused);
}

/// The creator attaches (its answer, `result`, goes out from the actor).
async fn attach_creator(
    handle: SessionHandle,
    client: Client,
    result: Value,
    responder: Responder,
) -> Result<SessionHandle, Failed> {
    let cmd = SessionCommand::Attach {
        client,
        mode: AttachMode::New { result },
        responder: Some(responder),
    };
    match handle.send(cmd).await {
        Ok(()) => Ok(handle),
        Err(SessionCommand::Attach {
            responder: Some(r), ..
        }) => Err((AcpError::SessionGone, r)),
        Err(_) => unreachable!("the command given back is the one sent"),
    }
}

/// The agent's own id for the session, from its `session/new` answer.
fn agent_session_id(result: &Value) -> Result<String, AcpError> {
    let sid = result.get("sessionId").and_then(Value::as_str);
    sid.map(str::to_owned)
        .ok_or_else(|| AcpError::Internal("the agent's session/new answer has no sessionId".into()))
}

/// The list `params` has under `key`, else an empty one.
fn list_of(params: &Value, key: &str) -> Value {
    params.get(key).cloned().unwrap_or_else(|| json!([]))
}

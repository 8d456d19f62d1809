//! One tool call of a turn: presented to the client, its path checked, permission asked
//! (if the policy says so), run, and its result reported.

use serde_json::{Value, json};

use super::TurnCtx;
use super::permission::{Permission, permission};
use crate::client::ClientLink;
use crate::state::SavedSession;
use crate::tools::{self, ToolEnv, ToolError};
use crate::transcript::Block;

pub(super) enum CallEnd {
    Done(Block),
    Cancelled,
}

pub(super) fn error_result(id: &str, text: &str) -> Block {
    Block::ToolResult {
        tool_use_id: id.to_owned(),
        content: text.to_owned(),
        is_error: true,
    }
}

pub(super) async fn fail_call(client: &ClientLink, id: &str, why: &str) {
    client
        .update(json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": id,
            "status": "failed",
            "content": [{ "type": "content", "content": { "type": "text", "text": why } }],
        }))
        .await;
}

/// Asks (if the policy says so), runs, and reports one tool call.
pub(super) async fn run_call(
    ctx: &TurnCtx,
    conv: &mut SavedSession,
    id: &str,
    name: &str,
    input: &Value,
    offered: bool,
    plan: bool,
) -> CallEnd {
    let extra = tools::Extra {
        client: &conv.client_tools,
        mcp: &ctx.mcp,
    };
    let (title, kind, locations) = tools::describe(name, input, &ctx.roots);
    ctx.client
        .update(json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": id,
            "title": title,
            "kind": kind,
            "locations": locations,
            "rawInput": input,
        }))
        .await;
    let refuse = |why: String| async move {
        fail_call(&ctx.client, id, &why).await;
        CallEnd::Done(error_result(id, &why))
    };
    if input.get("_invalid_arguments").is_some() {
        return refuse("the tool arguments were not valid JSON".into()).await;
    }
    if !offered {
        let why = if plan && tools::is_mutating(name, extra) {
            format!("{name} is not available in plan mode")
        } else {
            format!("there is no tool named {name:?}")
        };
        return refuse(why).await;
    }
    let env = ToolEnv {
        client: &ctx.client,
        caps: ctx.caps,
        config: &ctx.config,
        roots: &ctx.roots,
        cancel: &ctx.cancel,
        tool_call_id: id,
    };
    // A path outside the session is refused before the user is asked to allow it.
    if let Err(e) = tools::check(&env, name, input) {
        return refuse(e.to_string()).await;
    }
    let mutating = tools::is_mutating(name, extra);
    match permission(
        ctx,
        &mut conv.remembered,
        id,
        name,
        &title,
        kind,
        input,
        mutating,
    )
    .await
    {
        Permission::Allow => {}
        Permission::Reject(why) => return refuse(why).await,
        Permission::Cancelled => {
            fail_call(&ctx.client, id, "cancelled").await;
            return CallEnd::Cancelled;
        }
    }
    execute(&env, name, input, extra).await
}

/// Runs an allowed call and reports how it ended.
async fn execute(env: &ToolEnv<'_>, name: &str, input: &Value, extra: tools::Extra<'_>) -> CallEnd {
    let id = env.tool_call_id;
    env.client
        .update(json!({ "sessionUpdate": "tool_call_update", "toolCallId": id, "status": "in_progress" }))
        .await;
    match tools::execute(env, name, input, extra).await {
        Ok(out) => {
            let mut u = json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": id,
                "status": if out.is_error { "failed" } else { "completed" },
                "rawOutput": out.raw_output,
            });
            if !out.content.is_empty() {
                u["content"] = Value::Array(out.content);
            }
            env.client.update(u).await;
            CallEnd::Done(Block::ToolResult {
                tool_use_id: id.to_owned(),
                content: out.text,
                is_error: out.is_error,
            })
        }
        Err(ToolError::Cancelled) => {
            fail_call(env.client, id, "cancelled").await;
            CallEnd::Cancelled
        }
        Err(e) => {
            let why = e.to_string();
            fail_call(env.client, id, &why).await;
            CallEnd::Done(error_result(id, &why))
        }
    }
}

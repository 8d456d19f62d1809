//! One prompt turn: model calls and tool calls until the model stops, a limit is hit, or the
//! turn is cancelled. The turn task owns the session's transcript while it runs and hands
//! it back at the end, whatever happened; every wait is one `select!` against `cancel`.

mod call;
mod permission;

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::{ClientCaps, ClientLink};
use crate::config::BuiltinConfig;
use crate::content;
use crate::options::PLAN;
use crate::provider::{self, Delta, Finish, ModelRequest, ProviderError, Thought};
use crate::state::{SavedSession, Settings};
use crate::tools::{self, Roots};
use crate::transcript::{self, Block, Message, Role};
use call::{CallEnd, error_result, fail_call, run_call};

/// How a turn failed (a stop reason is not a failure).
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// ACP -32000: the provider wants (other) credentials.
    #[error("{0}")]
    Auth(String),
    #[error("{0}")]
    Provider(String),
}

pub enum TurnKind {
    Prompt(Vec<Value>),
    Compact,
}

/// What a turn needs besides the transcript.
pub struct TurnCtx {
    pub client: ClientLink,
    pub config: Arc<BuiltinConfig>,
    pub http: reqwest::Client,
    pub caps: ClientCaps,
    pub roots: Roots,
    pub settings: watch::Receiver<Settings>,
    pub cancel: CancellationToken,
    /// Tools of the session's MCP servers.
    pub mcp: Arc<Vec<crate::tools::mcp::McpTool>>,
    /// What the turn's model calls spent so far (the prompt answer's `usage`).
    pub spent: watch::Sender<Option<provider::Usage>>,
}

pub type StopReason = &'static str;

/// Runs a turn to its end; returns the transcript with its outcome.
pub async fn run(
    ctx: TurnCtx,
    mut conv: SavedSession,
    kind: TurnKind,
) -> (SavedSession, Result<StopReason, TurnError>) {
    let result = match kind {
        TurnKind::Prompt(prompt) => prompt_turn(&ctx, &mut conv, &prompt).await,
        TurnKind::Compact => compact(&ctx, &mut conv).await,
    };
    if result.is_ok()
        && conv.title.is_none()
        && let Some(title) = transcript::title_of(&conv.messages)
    {
        ctx.client
            .update(json!({ "sessionUpdate": "session_info_update", "title": title }))
            .await;
        conv.title = Some(title);
    }
    (conv, result)
}

/// A model call's usage: to acpd, which counts it against budgets as it is spent (not
/// relayed to clients), into the turn's total, and to the client as `usage_update` when the
/// context's size is known.
async fn report_usage(ctx: &TurnCtx, u: provider::Usage, context_window: Option<u64>) {
    let report = json!({ "usage": u.to_acp() });
    ctx.client
        .notify(acpd_protocol::method::ACPD_SESSION_USAGE, report)
        .await;
    ctx.spent
        .send_modify(|t| t.get_or_insert_with(Default::default).add(&u));
    if let Some(size) = context_window {
        ctx.client
            .update(
                json!({ "sessionUpdate": "usage_update", "used": u.context_used(), "size": size }),
            )
            .await;
    }
}

async fn prompt_turn(
    ctx: &TurnCtx,
    conv: &mut SavedSession,
    prompt: &[Value],
) -> Result<StopReason, TurnError> {
    let settings = ctx.settings.borrow().clone();
    let spec = settings.model.as_deref().and_then(|m| ctx.config.model(m));
    let (mut blocks, warnings) = content::prompt_blocks(prompt, spec);
    for w in warnings {
        message_chunk(&ctx.client, &format!("⚠ {w}\n\n")).await;
    }
    if let Some(r) = reminder(&ctx.config, &settings) {
        blocks.push(Block::Text { text: r });
    }
    if conv.system_prompt.is_none() || !ctx.config.freeze_system_prompt {
        conv.system_prompt = Some(content::system_prompt(&ctx.config, &ctx.roots));
    }
    transcript::push_user(&mut conv.messages, blocks);
    let mut requests = 0;
    loop {
        if ctx.cancel.is_cancelled() {
            transcript::close_dangling_tool_uses(&mut conv.messages, "cancelled by the user");
            return Ok("cancelled");
        }
        if requests >= ctx.config.max_turn_requests {
            return Ok("max_turn_requests");
        }
        requests += 1;
        let settings = ctx.settings.borrow().clone();
        let plan = settings.mode == PLAN;
        let extra = tools::Extra {
            client: &conv.client_tools,
            mcp: &ctx.mcp,
        };
        let offered = tools::specs(&ctx.config, ctx.caps, plan, extra);
        let (message, finish) = match model_call(ctx, conv, &settings, &offered).await? {
            Some(r) => r,
            None => {
                transcript::close_dangling_tool_uses(&mut conv.messages, "cancelled by the user");
                return Ok("cancelled");
            }
        };
        let calls: Vec<(String, String, Value)> = message
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, name, input } => {
                    Some((id.clone(), name.clone(), input.clone()))
                }
                _ => None,
            })
            .collect();
        if !message.content.is_empty() {
            conv.messages.push(message);
        }
        match finish {
            Finish::Refusal => {
                transcript::close_dangling_tool_uses(
                    &mut conv.messages,
                    "not run: the model refused",
                );
                return Ok("refusal");
            }
            Finish::Length => {
                transcript::close_dangling_tool_uses(
                    &mut conv.messages,
                    "not run: output limit reached",
                );
                return Ok("max_tokens");
            }
            _ if calls.is_empty() => return Ok("end_turn"),
            _ => {}
        }
        let (results, stop) = run_calls(ctx, conv, calls, &offered, plan).await;
        transcript::push_user(&mut conv.messages, results);
        if let Some(s) = stop {
            return Ok(s);
        }
    }
}

/// Runs the model's tool calls in order; after a cancel, the rest are answered as cancelled.
/// Their results, and the stop reason if the turn ends here.
async fn run_calls(
    ctx: &TurnCtx,
    conv: &mut SavedSession,
    calls: Vec<(String, String, Value)>,
    offered: &[provider::ToolSpec],
    plan: bool,
) -> (Vec<Block>, Option<StopReason>) {
    let mut results = vec![];
    let mut stop = None;
    for (id, name, input) in calls {
        if stop.is_some() || ctx.cancel.is_cancelled() {
            fail_call(&ctx.client, &id, "cancelled").await;
            results.push(error_result(&id, "cancelled by the user"));
            stop = Some("cancelled");
            continue;
        }
        let allowed = offered.iter().any(|t| t.name == name);
        match run_call(ctx, conv, &id, &name, &input, allowed, plan).await {
            CallEnd::Done(b) => results.push(b),
            CallEnd::Cancelled => {
                results.push(error_result(&id, "cancelled by the user"));
                stop = Some("cancelled");
            }
        }
    }
    (results, stop)
}

/// Mode and extra option values, told to the model with each prompt (the system prompt
/// stays frozen).
fn reminder(config: &BuiltinConfig, s: &Settings) -> Option<String> {
    let mut lines = vec![];
    if s.mode == PLAN {
        lines.push("Plan mode is on: do not modify files or run commands; explore with the read-only tools and answer with a plan.".to_owned());
    }
    for o in &config.extra_options {
        if let Some(v) = s.extra.get(&o.id) {
            lines.push(format!("{}: {v}", o.name));
        }
    }
    (!lines.is_empty()).then(|| {
        format!(
            "<system-reminder>\n{}\n</system-reminder>",
            lines.join("\n")
        )
    })
}

/// A tool call's partial state while its arguments stream.
struct PartialTool {
    index: usize,
    id: String,
    name: String,
    args: String,
}

enum Partial {
    Text(String),
    Thinking(String, Option<String>),
    Redacted(String),
    Tool(PartialTool),
}

/// One model call, streamed to the client. `None` when cancelled (what was streamed is
/// kept in the transcript).
async fn model_call(
    ctx: &TurnCtx,
    conv: &mut SavedSession,
    settings: &Settings,
    offered: &[provider::ToolSpec],
) -> Result<Option<(Message, Finish)>, TurnError> {
    let Some(spec) = settings.model.as_deref().and_then(|m| ctx.config.model(m)) else {
        return Err(TurnError::Auth(format!(
            "no model is configured for the built-in agent: {}",
            provider::HOW_TO_CONFIGURE
        )));
    };
    let thought = if spec.reasoning {
        Thought::parse(&settings.thought_level).unwrap_or(Thought::Off)
    } else {
        Thought::Off
    };
    let system = conv.system_prompt.clone().unwrap_or_default();
    let req = ModelRequest {
        system: &system,
        messages: &conv.messages,
        tools: offered,
        thought,
    };
    let mut stream = match provider::start(&ctx.http, &ctx.config, spec, &req, &ctx.cancel).await {
        Ok(s) => s,
        Err(ProviderError::Cancelled) => return Ok(None),
        Err(ProviderError::Auth(m)) => return Err(TurnError::Auth(m)),
        Err(e) => return Err(TurnError::Provider(e.to_string())),
    };
    let mut parts: Vec<Partial> = vec![];
    let mut usage = None;
    let mut finish = Finish::Stop;
    let mut cancelled = false;
    loop {
        let delta = tokio::select! {
            _ = ctx.cancel.cancelled() => { cancelled = true; break }
            d = stream.next() => d,
        };
        let delta = match delta {
            None => break,
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                // What streamed stays; the turn ends with the provider's error.
                let (partial, _) = assemble(parts, false, &ctx.client).await;
                if !partial.content.is_empty() {
                    conv.messages.push(partial);
                }
                return Err(TurnError::Provider(e.to_string()));
            }
        };
        on_delta(
            ctx,
            &conv.messages,
            &mut parts,
            delta,
            (&mut usage, &mut finish),
        )
        .await;
    }
    if let Some(u) = usage {
        report_usage(ctx, u, spec.context_window).await;
    }
    let complete = !cancelled && finish != Finish::Length;
    let (message, _) = assemble(parts, complete, &ctx.client).await;
    if cancelled {
        if !message.content.is_empty() {
            conv.messages.push(message);
        }
        return Ok(None);
    }
    Ok(Some((message, finish)))
}

/// One piece of the model's stream: shown to the client as it comes, gathered into `parts`.
async fn on_delta(
    ctx: &TurnCtx,
    messages: &[Message],
    parts: &mut Vec<Partial>,
    delta: Delta,
    (usage, finish): (&mut Option<provider::Usage>, &mut Finish),
) {
    match delta {
        Delta::Text(t) => {
            message_chunk(&ctx.client, &t).await;
            match parts.last_mut() {
                Some(Partial::Text(s)) => s.push_str(&t),
                _ => parts.push(Partial::Text(t)),
            }
        }
        Delta::Thinking(t) => {
            ctx.client
                .update(json!({ "sessionUpdate": "agent_thought_chunk", "content": { "type": "text", "text": t } }))
                .await;
            match parts.last_mut() {
                Some(Partial::Thinking(s, None)) => s.push_str(&t),
                _ => parts.push(Partial::Thinking(t, None)),
            }
        }
        Delta::ThinkingSignature(sig) => {
            if let Some(Partial::Thinking(_, s)) = parts.last_mut() {
                s.get_or_insert_with(String::new).push_str(&sig);
            }
        }
        Delta::RedactedThinking(d) => parts.push(Partial::Redacted(d)),
        Delta::ToolStart { index, id, name } => {
            // Some compatible servers send no id, or reuse ids across turns: the
            // client would merge distinct calls, so those get a fresh one.
            let id = if id.is_empty() || id_in_use(messages, parts, &id) {
                format!("call_{}", uuid::Uuid::new_v4().simple())
            } else {
                id
            };
            ctx.client
                .update(json!({
                    "sessionUpdate": "tool_call",
                    "toolCallId": id,
                    "title": name,
                    "kind": tools::describe(&name, &Value::Null, &ctx.roots).1,
                    "status": "pending",
                }))
                .await;
            parts.push(Partial::Tool(PartialTool {
                index,
                id,
                name,
                args: String::new(),
            }));
        }
        Delta::ToolArgs { index, fragment } => {
            let tool = parts.iter_mut().rev().find_map(|p| match p {
                Partial::Tool(t) if t.index == index => Some(t),
                _ => None,
            });
            if let Some(t) = tool {
                t.args.push_str(&fragment);
            }
        }
        Delta::Usage(u) => *usage = Some(u),
        Delta::Finish(f) => *finish = f,
    }
}

fn id_in_use(messages: &[Message], parts: &[Partial], id: &str) -> bool {
    let in_parts = parts
        .iter()
        .any(|p| matches!(p, Partial::Tool(t) if t.id == id));
    in_parts
        || messages
            .iter()
            .flat_map(|m| m.content.iter())
            .any(|b| matches!(b, Block::ToolUse { id: used, .. } if used == id))
}

/// The assistant message from streamed parts. Tool calls are kept only when `complete`
/// (their arguments may be cut short otherwise); dropped ones are shown as failed.
async fn assemble(parts: Vec<Partial>, complete: bool, client: &ClientLink) -> (Message, usize) {
    let mut content = vec![];
    let mut dropped = 0;
    for p in parts {
        match p {
            Partial::Text(text) => content.push(Block::Text { text }),
            Partial::Thinking(text, signature) => content.push(Block::Thinking { text, signature }),
            Partial::Redacted(data) => content.push(Block::RedactedThinking { data }),
            Partial::Tool(t) => {
                let input = if t.args.trim().is_empty() {
                    Some(json!({}))
                } else {
                    serde_json::from_str::<Value>(&t.args).ok()
                };
                match input {
                    Some(input) if complete => content.push(Block::ToolUse {
                        id: t.id,
                        name: t.name,
                        input,
                    }),
                    // Unparseable arguments from a finished call: the model is told.
                    None if complete => content.push(Block::ToolUse {
                        id: t.id,
                        name: t.name,
                        input: json!({ "_invalid_arguments": t.args }),
                    }),
                    _ => {
                        dropped += 1;
                        fail_call(client, &t.id, "not run").await;
                    }
                }
            }
        }
    }
    (
        Message {
            role: Role::Assistant,
            content,
        },
        dropped,
    )
}

async fn message_chunk(client: &ClientLink, text: &str) {
    client
        .update(json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": text } }))
        .await;
}

/// `/compact`: the model summarizes the conversation, which then replaces it.
async fn compact(ctx: &TurnCtx, conv: &mut SavedSession) -> Result<StopReason, TurnError> {
    if conv.messages.is_empty() {
        message_chunk(&ctx.client, "Nothing to compact yet.").await;
        return Ok("end_turn");
    }
    let settings = ctx.settings.borrow().clone();
    let mut scratch = conv.clone();
    transcript::close_dangling_tool_uses(&mut scratch.messages, "not run");
    transcript::push_user(&mut scratch.messages, vec![Block::Text {
        text: "Do not call any tool now. Summarize our conversation so far for your own future reference: the goal, decisions, files touched and their state, and open tasks. Be complete but concise.".into(),
    }]);
    if scratch.system_prompt.is_none() {
        scratch.system_prompt = Some(content::system_prompt(&ctx.config, &ctx.roots));
    }
    // The same tools as a normal turn: Anthropic requires them when the transcript has tool
    // calls, and the cached prefix (tools, system, messages) stays identical.
    let extra = tools::Extra {
        client: &conv.client_tools,
        mcp: &ctx.mcp,
    };
    let offered = tools::specs(&ctx.config, ctx.caps, settings.mode == PLAN, extra);
    let Some((message, _)) = model_call(ctx, &mut scratch, &settings, &offered).await? else {
        return Ok("cancelled");
    };
    for b in &message.content {
        if let Block::ToolUse { id, .. } = b {
            fail_call(&ctx.client, id, "not run while compacting").await;
        }
    }
    let summary = message.text();
    let before = conv.messages.len();
    conv.messages = vec![Message::user(vec![Block::Text {
        text: format!(
            "<system-reminder>\nSummary of the conversation so far:\n{summary}\n</system-reminder>"
        ),
    }])];
    message_chunk(
        &ctx.client,
        &format!("\n\nCompacted {before} messages into a summary."),
    )
    .await;
    Ok("end_turn")
}

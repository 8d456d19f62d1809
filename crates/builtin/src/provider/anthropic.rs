//! Anthropic Messages API: request body and the SSE event stream
//! (`message_start`, `content_block_*`, `message_delta`, `message_stop`, `error`).

use std::collections::VecDeque;

use serde_json::{Value, json};

use super::sse::Event;
use super::{Delta, Finish, ModelRequest, ProviderError, Thought, Usage};
use crate::config::{Endpoint, ModelSpec};
use crate::transcript::{Block, Role};

pub(super) fn headers(rb: reqwest::RequestBuilder, ep: &Endpoint) -> reqwest::RequestBuilder {
    let rb = rb.header("anthropic-version", "2023-06-01");
    match &ep.api_key {
        Some(k) => rb.header("x-api-key", k),
        None => rb,
    }
}

fn thinking_budget(t: Thought) -> Option<u32> {
    match t {
        Thought::Off => None,
        Thought::Low => Some(2048),
        Thought::Medium => Some(8192),
        Thought::High => Some(24576),
    }
}

pub(super) fn request(ep: &Endpoint, spec: &ModelSpec, req: &ModelRequest<'_>) -> (String, String) {
    let mut messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            let content: Vec<Value> = m.content.iter().filter_map(block).collect();
            json!({ "role": role, "content": content })
        })
        .filter(|m| m["content"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    // The conversation so far is cached: the breakpoint moves to the newest message.
    if let Some(last) = messages
        .last_mut()
        .and_then(|m| m["content"].as_array_mut())
        .and_then(|c| c.last_mut())
    {
        last["cache_control"] = json!({ "type": "ephemeral" });
    }
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema }))
        .collect();
    let mut body = json!({
        "model": spec.model,
        "max_tokens": spec.max_tokens,
        "stream": true,
        "system": [{ "type": "text", "text": req.system, "cache_control": { "type": "ephemeral" } }],
        "messages": messages,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if spec.reasoning
        && let Some(budget) = thinking_budget(req.thought)
    {
        body["thinking"] = json!({ "type": "enabled", "budget_tokens": budget });
        body["max_tokens"] = json!(spec.max_tokens.max(budget + 4096));
    }
    (format!("{}/v1/messages", ep.base_url), body.to_string())
}

fn block(b: &Block) -> Option<Value> {
    Some(match b {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({ "type": "text", "text": text }),
        Block::Image { media_type, data } => json!({
            "type": "image",
            "source": { "type": "base64", "media_type": media_type, "data": data },
        }),
        // Unsigned thinking (from another provider, or cut short) cannot be sent back.
        Block::Thinking {
            signature: None, ..
        } => return None,
        Block::Thinking {
            text,
            signature: Some(sig),
        } => json!({ "type": "thinking", "thinking": text, "signature": sig }),
        Block::RedactedThinking { data } => json!({ "type": "redacted_thinking", "data": data }),
        Block::ToolUse { id, name, input } => {
            let input = if input.is_object() {
                input.clone()
            } else {
                json!({})
            };
            json!({ "type": "tool_use", "id": id, "name": name, "input": input })
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": if content.is_empty() { "(no output)" } else { content.as_str() },
            "is_error": is_error,
        }),
    })
}

#[derive(Default)]
pub(super) struct StreamState {
    usage: Usage,
    finish: Option<Finish>,
    /// Content block index -> tool call index, for `input_json_delta`s.
    tools: Vec<(usize, usize)>,
    tool_count: usize,
}

impl StreamState {
    /// Handles one event; `Ok(true)` when the message is complete.
    pub(super) fn on_event(
        &mut self,
        ev: &Event,
        out: &mut VecDeque<Delta>,
    ) -> Result<bool, ProviderError> {
        let kind = ev.event.as_deref().unwrap_or("");
        if kind == "ping" || ev.data.is_empty() {
            return Ok(false);
        }
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|e| ProviderError::Stream(format!("bad event data: {e}")))?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(kind);
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.read_usage(u);
                }
            }
            "content_block_start" => self.on_block_start(&v, out),
            "content_block_delta" => self.on_block_delta(&v, out),
            "message_delta" => {
                if let Some(u) = v.get("usage") {
                    self.read_usage(u);
                }
                if let Some(r) = v.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.finish = Some(match r {
                        "tool_use" => Finish::ToolUse,
                        "max_tokens" | "model_context_window_exceeded" => Finish::Length,
                        "refusal" => Finish::Refusal,
                        _ => Finish::Stop,
                    });
                }
            }
            "message_stop" => {
                out.extend(self.finish());
                return Ok(true);
            }
            "error" => {
                let msg = v
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown error");
                return Err(ProviderError::Stream(msg.to_owned()));
            }
            _ => {}
        }
        Ok(false)
    }

    /// A content block starts: a tool call is announced, a redacted block or text given.
    fn on_block_start(&mut self, v: &Value, out: &mut VecDeque<Delta>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let cb = &v["content_block"];
        match cb.get("type").and_then(Value::as_str) {
            Some("tool_use") => {
                let tool = self.tool_count;
                self.tool_count += 1;
                self.tools.push((index, tool));
                out.push_back(Delta::ToolStart {
                    index: tool,
                    id: str_of(cb, "id"),
                    name: str_of(cb, "name"),
                });
            }
            Some("redacted_thinking") => out.push_back(Delta::RedactedThinking(str_of(cb, "data"))),
            Some("text") => {
                let t = str_of(cb, "text");
                if !t.is_empty() {
                    out.push_back(Delta::Text(t));
                }
            }
            _ => {}
        }
    }

    /// More of a content block: text, thinking, its signature, a tool call's arguments.
    fn on_block_delta(&mut self, v: &Value, out: &mut VecDeque<Delta>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let d = &v["delta"];
        match d.get("type").and_then(Value::as_str) {
            Some("text_delta") => out.push_back(Delta::Text(str_of(d, "text"))),
            Some("thinking_delta") => out.push_back(Delta::Thinking(str_of(d, "thinking"))),
            Some("signature_delta") => {
                out.push_back(Delta::ThinkingSignature(str_of(d, "signature")))
            }
            Some("input_json_delta") => {
                if let Some((_, tool)) = self.tools.iter().find(|(i, _)| *i == index) {
                    out.push_back(Delta::ToolArgs {
                        index: *tool,
                        fragment: str_of(d, "partial_json"),
                    });
                }
            }
            _ => {}
        }
    }

    fn read_usage(&mut self, u: &Value) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(x) = n("input_tokens") {
            self.usage.input = x;
        }
        if let Some(x) = n("output_tokens") {
            self.usage.output = x;
        }
        if let Some(x) = n("cache_read_input_tokens") {
            self.usage.cache_read = x;
        }
        if let Some(x) = n("cache_creation_input_tokens") {
            self.usage.cache_write = x;
        }
    }

    /// The closing deltas: usage, then how it finished.
    pub(super) fn finish(&mut self) -> Vec<Delta> {
        let finish = self.finish.take().unwrap_or(if self.tool_count > 0 {
            Finish::ToolUse
        } else {
            Finish::Stop
        });
        vec![
            Delta::Usage(std::mem::take(&mut self.usage)),
            Delta::Finish(finish),
        ]
    }
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

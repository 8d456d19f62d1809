//! OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp, gateways): request
//! body and the `data: {chunk}` / `data: [DONE]` stream. Reasoning arrives as
//! `reasoning_content` (DeepSeek, llama.cpp, vLLM) or `reasoning` (Ollama, OpenRouter).

use std::collections::VecDeque;

use serde_json::{Value, json};

use super::sse::Event;
use super::{Delta, Finish, ModelRequest, ProviderError, Thought, Usage};
use crate::config::{Endpoint, ModelSpec};
use crate::transcript::{Block, Role};

pub(super) fn headers(rb: reqwest::RequestBuilder, ep: &Endpoint) -> reqwest::RequestBuilder {
    match &ep.api_key {
        Some(k) => rb.bearer_auth(k),
        None => rb,
    }
}

pub(super) fn request(ep: &Endpoint, spec: &ModelSpec, req: &ModelRequest<'_>) -> (String, String) {
    let messages = chat_messages(req);
    let mut body = json!({
        "model": spec.model,
        "messages": messages,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    // OpenAI's own reasoning models refuse `max_tokens`; other servers only know it.
    let key = if ep.official {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    body[key] = json!(spec.max_tokens);
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(
            req.tools
                .iter()
                .map(|t| {
                    json!({ "type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.input_schema,
                    }})
                })
                .collect(),
        );
    }
    if spec.reasoning {
        let effort = match req.thought {
            Thought::Off => None,
            Thought::Low => Some("low"),
            Thought::Medium => Some("medium"),
            Thought::High => Some("high"),
        };
        if let Some(e) = effort {
            body["reasoning_effort"] = json!(e);
        }
    }
    (
        format!("{}/chat/completions", ep.base_url),
        body.to_string(),
    )
}

/// The transcript as chat messages: the system prompt, then each message (a user message's
/// tool results as messages of their own).
fn chat_messages(req: &ModelRequest<'_>) -> Vec<Value> {
    let mut messages = vec![json!({ "role": "system", "content": req.system })];
    for m in req.messages {
        match m.role {
            Role::Assistant => {
                let text = m.text();
                let calls: Vec<Value> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        Block::ToolUse { id, name, input } => Some(json!({
                            "id": id,
                            "type": "function",
                            "function": { "name": name, "arguments": input.to_string() },
                        })),
                        _ => None,
                    })
                    .collect();
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut msg = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) } });
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                messages.push(msg);
            }
            Role::User => {
                // Tool results are messages of their own, and come first: they answer the
                // assistant message just before.
                let mut parts = vec![];
                for b in &m.content {
                    match b {
                        Block::ToolResult {
                            tool_use_id,
                            content,
                            is_error,
                        } => {
                            let content = if *is_error {
                                format!("Error: {content}")
                            } else {
                                content.clone()
                            };
                            messages.push(json!({ "role": "tool", "tool_call_id": tool_use_id, "content": content }));
                        }
                        Block::Text { text } if !text.is_empty() => {
                            parts.push(json!({ "type": "text", "text": text }))
                        }
                        Block::Image { media_type, data } => parts.push(json!({
                            "type": "image_url",
                            "image_url": { "url": format!("data:{media_type};base64,{data}") },
                        })),
                        _ => {}
                    }
                }
                if parts.is_empty() {
                    continue;
                }
                // Plain text as a string: the form every compatible server accepts.
                let content = if parts.iter().all(|p| p["type"] == "text") {
                    json!(
                        parts
                            .iter()
                            .filter_map(|p| p["text"].as_str())
                            .collect::<Vec<_>>()
                            .join("\n\n")
                    )
                } else {
                    Value::Array(parts)
                };
                messages.push(json!({ "role": "user", "content": content }));
            }
        }
    }
    messages
}

#[derive(Default)]
pub(super) struct StreamState {
    usage: Option<Usage>,
    finish: Option<Finish>,
    /// Tool call indexes seen so far (the stream's own `index`).
    tools: Vec<usize>,
    finished: bool,
}

impl StreamState {
    pub(super) fn on_event(
        &mut self,
        ev: &Event,
        out: &mut VecDeque<Delta>,
    ) -> Result<bool, ProviderError> {
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        if data == "[DONE]" {
            out.extend(self.finish());
            return Ok(true);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::Stream(format!("bad chunk: {e}")))?;
        if let Some(e) = v.get("error") {
            let msg = e
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| e.to_string());
            return Err(ProviderError::Stream(msg));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            let cached = n("/prompt_tokens_details/cached_tokens");
            self.usage = Some(Usage {
                input: n("/prompt_tokens").saturating_sub(cached),
                output: n("/completion_tokens"),
                cache_read: cached,
                cache_write: 0,
            });
        }
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(false);
        };
        let d = &choice["delta"];
        for key in ["reasoning_content", "reasoning"] {
            if let Some(t) = d.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()) {
                out.push_back(Delta::Thinking(t.to_owned()));
            }
        }
        if let Some(t) = d
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            out.push_back(Delta::Text(t.to_owned()));
        }
        if let Some(t) = d
            .get("refusal")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            out.push_back(Delta::Text(t.to_owned()));
            self.finish = Some(Finish::Refusal);
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            self.on_tool_calls(calls, out);
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            let f = match r {
                "tool_calls" | "function_call" => Finish::ToolUse,
                "length" => Finish::Length,
                "content_filter" | "refusal" | "error" => Finish::Refusal,
                _ => Finish::Stop,
            };
            if self.finish != Some(Finish::Refusal) {
                self.finish = Some(f);
            }
        }
        Ok(false)
    }

    /// Tool call pieces: a call's first piece announces it; its arguments come in fragments.
    fn on_tool_calls(&mut self, calls: &[Value], out: &mut VecDeque<Delta>) {
        for (pos, c) in calls.iter().enumerate() {
            let index = c
                .get("index")
                .and_then(Value::as_u64)
                .map(|i| i as usize)
                .unwrap_or(pos);
            let f = &c["function"];
            if !self.tools.contains(&index) {
                self.tools.push(index);
                out.push_back(Delta::ToolStart {
                    index,
                    id: c
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    name: f
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
            if let Some(a) = f
                .get("arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                out.push_back(Delta::ToolArgs {
                    index,
                    fragment: a.to_owned(),
                });
            }
        }
    }

    pub(super) fn finish(&mut self) -> Vec<Delta> {
        if self.finished {
            return vec![];
        }
        self.finished = true;
        let mut out = vec![];
        if let Some(u) = self.usage.take() {
            out.push(Delta::Usage(u));
        }
        // Some servers say "stop" after tool calls; the calls are what counts.
        let finish = match self.finish.take() {
            Some(Finish::Stop) | None if !self.tools.is_empty() => Finish::ToolUse,
            Some(f) => f,
            None => Finish::Stop,
        };
        out.push(Delta::Finish(finish));
        out
    }
}

//! LLM providers: one streaming request per model call, normalized into `Delta`s.
//!
//! `start` sends the request, retrying 429/5xx (and connection failures) with exponential
//! backoff before anything was streamed; once the body streams, a failure ends the call
//! (retrying then would repeat text the user has already seen).

mod anthropic;
mod openai;
mod sse;

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::config::{BuiltinConfig, ModelSpec, ProviderKind};
use super::transcript::Message;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// 401/403, or no key where one is required: ACP "authentication required".
    #[error("{0}")]
    Auth(String),
    #[error("the model provider answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("cannot reach the model provider: {0}")]
    Network(String),
    #[error("the model stream failed: {0}")]
    Stream(String),
    #[error("cancelled")]
    Cancelled,
}

/// How a model call ended, in provider-neutral terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    ToolUse,
    Length,
    /// Refusal, content filter, or an error finish from the provider.
    Refusal,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Usage {
    /// Tokens the context holds after this call.
    pub fn context_used(&self) -> u64 {
        self.input + self.output + self.cache_read + self.cache_write
    }
}

/// One normalized piece of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Text(String),
    Thinking(String),
    ThinkingSignature(String),
    RedactedThinking(String),
    /// A tool call begins; `index` identifies it for the argument fragments.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        fragment: String,
    },
    Usage(Usage),
    Finish(Finish),
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// How hard the model should think.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thought {
    Off,
    Low,
    Medium,
    High,
}

impl Thought {
    pub fn parse(s: &str) -> Option<Thought> {
        Some(match s {
            "off" => Thought::Off,
            "low" => Thought::Low,
            "medium" => Thought::Medium,
            "high" => Thought::High,
            _ => return None,
        })
    }
}

pub struct ModelRequest<'a> {
    pub system: &'a str,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    pub thought: Thought,
}

/// Which format a stream speaks.
enum Format {
    Anthropic(anthropic::StreamState),
    Openai(openai::StreamState),
}

/// An answer being streamed.
pub struct DeltaStream {
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    sse: sse::Parser,
    format: Format,
    queue: VecDeque<Delta>,
    done: bool,
}

impl DeltaStream {
    /// The next delta; `None` when the answer is complete.
    pub async fn next(&mut self) -> Option<Result<Delta, ProviderError>> {
        loop {
            if let Some(d) = self.queue.pop_front() {
                return Some(Ok(d));
            }
            if self.done {
                return None;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => {
                    for ev in self.sse.feed(&bytes) {
                        let r = match &mut self.format {
                            Format::Anthropic(s) => s.on_event(&ev, &mut self.queue),
                            Format::Openai(s) => s.on_event(&ev, &mut self.queue),
                        };
                        match r {
                            Ok(true) => self.done = true,
                            Ok(false) => {}
                            Err(e) => {
                                self.done = true;
                                return Some(Err(e));
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(ProviderError::Stream(e.to_string())));
                }
                None => {
                    self.done = true;
                    // Some servers close without a final marker; what was said stands.
                    let tail = match &mut self.format {
                        Format::Anthropic(s) => s.finish(),
                        Format::Openai(s) => s.finish(),
                    };
                    self.queue.extend(tail);
                }
            }
        }
    }
}

/// Starts a streamed model call, retrying what is worth retrying.
pub async fn start(
    http: &reqwest::Client,
    config: &BuiltinConfig,
    spec: &ModelSpec,
    req: &ModelRequest<'_>,
    cancel: &CancellationToken,
) -> Result<DeltaStream, ProviderError> {
    let endpoint = spec.endpoint();
    if endpoint.api_key.is_none() && (endpoint.official || spec.provider == ProviderKind::Anthropic)
    {
        return Err(ProviderError::Auth(format!(
            "no API key for model {:?}: set {} or api_key in [builtin.models.{}]",
            spec.id,
            spec.provider.key_env(),
            spec.id
        )));
    }
    let (url, body) = match spec.provider {
        ProviderKind::Anthropic => anthropic::request(&endpoint, spec, req),
        ProviderKind::Openai => openai::request(&endpoint, spec, req),
    };
    let mut attempt = 0u32;
    loop {
        let mut rb = http
            .post(&url)
            .timeout(config.request_timeout)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream");
        rb = match spec.provider {
            ProviderKind::Anthropic => anthropic::headers(rb, &endpoint),
            ProviderKind::Openai => openai::headers(rb, &endpoint),
        };
        let sent = tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
            r = rb.body(body.clone()).send() => r,
        };
        let retry_after;
        match sent {
            Ok(resp) if resp.status().is_success() => {
                let format = match spec.provider {
                    ProviderKind::Anthropic => Format::Anthropic(Default::default()),
                    ProviderKind::Openai => Format::Openai(Default::default()),
                };
                return Ok(DeltaStream {
                    body: Box::pin(resp.bytes_stream()),
                    sse: sse::Parser::default(),
                    format,
                    queue: VecDeque::new(),
                    done: false,
                });
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let text = tokio::select! {
                    _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                    t = resp.text() => t.unwrap_or_default(),
                };
                let message = error_message(&text);
                if status == 401 || status == 403 {
                    return Err(ProviderError::Auth(format!(
                        "the model provider refused the credentials for {:?} ({status}): {message}",
                        spec.id
                    )));
                }
                let retryable = status == 408 || status == 409 || status == 429 || status >= 500;
                if !retryable || attempt >= config.retries {
                    return Err(ProviderError::Api { status, message });
                }
                tracing::info!(status, attempt, model = %spec.id, "model provider busy; retrying");
            }
            Err(e) => {
                retry_after = None;
                if attempt >= config.retries
                    || !(e.is_connect() || e.is_timeout() || e.is_request())
                {
                    return Err(ProviderError::Network(e.to_string()));
                }
                tracing::info!(error = %e, attempt, model = %spec.id, "model provider unreachable; retrying");
            }
        }
        attempt += 1;
        let backoff = retry_after
            .unwrap_or_else(|| config.retry_base * 2u32.saturating_pow(attempt - 1))
            .min(Duration::from_secs(60));
        tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
            _ = tokio::time::sleep(backoff) => {}
        }
    }
}

/// The human part of a provider's error body (both formats nest it under `error.message`).
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message").or_else(|| v.get("message")))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| body.chars().take(500).collect())
}

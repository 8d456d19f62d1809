//! LLM providers: one streaming request per model call, normalized into `Delta`s.
//!
//! `start` sends the request, retrying 408/409/429/5xx (and connection failures) with
//! exponential backoff (`backon`; a `retry-after` wins) before anything was streamed; once
//! the body streams, a failure ends the call (retrying then would repeat text the user has
//! already seen). The HTTP client has a connect and a read (idle) timeout, no deadline for
//! the whole request: a long answer streams as long as it keeps coming, a stalled one ends
//! within the read timeout.

mod anthropic;
pub mod demo;
mod openai;
mod sse;

use std::collections::VecDeque;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures_util::StreamExt;
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

    pub fn add(&mut self, o: &Usage) {
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
    }

    /// In ACP's words (a prompt answer's `usage`).
    pub fn to_acp(&self) -> serde_json::Value {
        serde_json::json!({
            "inputTokens": self.input,
            "outputTokens": self.output,
            "cachedReadTokens": self.cache_read,
            "cachedWriteTokens": self.cache_write,
            "totalTokens": self.context_used(),
        })
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
    /// The demo model: its whole answer is queued at the start; no event is read.
    Demo,
}

/// An answer being streamed.
pub struct DeltaStream {
    events: sse::Events,
    format: Format,
    queue: VecDeque<Delta>,
    done: bool,
    /// For the message when the stream stalls.
    read_timeout: Duration,
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
            match self.events.next().await {
                Some(Ok(ev)) => {
                    let r = match &mut self.format {
                        Format::Anthropic(s) => s.on_event(&ev, &mut self.queue),
                        Format::Openai(s) => s.on_event(&ev, &mut self.queue),
                        Format::Demo => Ok(true),
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
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(stream_error(e, self.read_timeout)));
                }
                None => {
                    self.done = true;
                    // Some servers close without a final marker; what was said stands.
                    let tail = match &mut self.format {
                        Format::Anthropic(s) => s.finish(),
                        Format::Openai(s) => s.finish(),
                        Format::Demo => vec![],
                    };
                    self.queue.extend(tail);
                }
            }
        }
    }
}

/// What a failed stream tells the user.
fn stream_error(e: sse::SseError, read_timeout: Duration) -> ProviderError {
    let stalled = match &e {
        sse::SseError::Body(b) => b
            .downcast_ref::<reqwest::Error>()
            .is_some_and(reqwest::Error::is_timeout),
        _ => false,
    };
    if stalled {
        return ProviderError::Stream(format!(
            "the model stopped sending: nothing arrived for {} s (read_timeout_secs in [builtin])",
            read_timeout.as_secs_f64()
        ));
    }
    match e {
        sse::SseError::TooLarge(n) => ProviderError::Stream(format!(
            "the model provider sent an event over {} MiB; the stream was cut off",
            n >> 20
        )),
        other => ProviderError::Stream(other.to_string()),
    }
}

/// Why one attempt failed, and whether another is worth it.
struct Failed {
    error: ProviderError,
    retry: bool,
    retry_after: Option<Duration>,
}

impl Failed {
    fn last(error: ProviderError) -> Failed {
        Failed {
            error,
            retry: false,
            retry_after: None,
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
    if let Some(why) = missing_key(spec) {
        return Err(ProviderError::Auth(why));
    }
    let (url, body) = match spec.provider {
        ProviderKind::Anthropic => anthropic::request(&endpoint, spec, req),
        ProviderKind::Openai => openai::request(&endpoint, spec, req),
        ProviderKind::Demo => {
            return Ok(DeltaStream {
                events: sse::Events::new(
                    futures_util::stream::empty::<Result<bytes::Bytes, std::io::Error>>(),
                    sse::MAX_EVENT,
                ),
                format: Format::Demo,
                queue: demo::answer(req).into(),
                done: true,
                read_timeout: config.read_timeout,
            });
        }
    };
    let attempt = || attempt(http, config, spec, &endpoint, (&url, &body));
    let backoff = ExponentialBuilder::default()
        .with_min_delay(config.retry_base)
        .with_max_delay(MAX_BACKOFF)
        .with_max_times(config.retries as usize)
        .with_jitter();
    let sent = attempt
        .retry(backoff)
        .when(|f: &Failed| f.retry)
        // The server's own `retry-after` wins over the computed delay (within the cap).
        .adjust(|f: &Failed, d| d.map(|d| f.retry_after.unwrap_or(d).min(MAX_BACKOFF)))
        .notify(|f: &Failed, d| {
            tracing::info!(error = %f.error, model = %spec.id, delay_ms = d.as_millis() as u64, "model provider call failed; retrying");
        });
    let resp = tokio::select! {
        _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
        r = sent => r.map_err(|f| f.error)?,
    };
    let format = match spec.provider {
        ProviderKind::Anthropic => Format::Anthropic(Default::default()),
        ProviderKind::Openai => Format::Openai(Default::default()),
        ProviderKind::Demo => Format::Demo,
    };
    Ok(DeltaStream {
        events: sse::Events::new(resp.bytes_stream(), sse::MAX_EVENT),
        format,
        queue: VecDeque::new(),
        done: false,
        read_timeout: config.read_timeout,
    })
}

/// One try of a model call: the response, or why it failed and whether to try again.
async fn attempt(
    http: &reqwest::Client,
    config: &BuiltinConfig,
    spec: &ModelSpec,
    endpoint: &crate::config::Endpoint,
    (url, body): (&str, &str),
) -> Result<reqwest::Response, Failed> {
    let rb = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    let rb = match spec.provider {
        ProviderKind::Anthropic => anthropic::headers(rb, endpoint),
        ProviderKind::Openai | ProviderKind::Demo => openai::headers(rb, endpoint),
    };
    let resp = rb.body(body.to_owned()).send().await.map_err(|e| Failed {
        retry: e.is_connect() || e.is_timeout() || e.is_request(),
        error: send_error(&e, config),
        retry_after: None,
    })?;
    if resp.status().is_success() {
        return Ok(resp);
    }
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let message = error_message(&error_body(resp).await);
    if status == 401 || status == 403 {
        return Err(Failed::last(ProviderError::Auth(format!(
            "the model provider refused the credentials for {:?} ({status}): {message}",
            spec.id
        ))));
    }
    Err(Failed {
        retry: status == 408 || status == 409 || status == 429 || status >= 500,
        error: ProviderError::Api { status, message },
        retry_after,
    })
}

/// Why `spec` cannot be called for want of a key (the provider's own service needs one, and
/// Anthropic's API format always does), read now so a key exported later counts.
fn missing_key(spec: &ModelSpec) -> Option<String> {
    let endpoint = spec.endpoint();
    let needs = match spec.provider {
        ProviderKind::Demo => false,
        ProviderKind::Anthropic => true,
        ProviderKind::Openai => endpoint.official,
    };
    (needs && endpoint.api_key.is_none()).then(|| {
        format!(
            "no API key for model {:?}: set {} or api_key in [builtin.models.{}]",
            spec.id,
            spec.provider.key_env(),
            spec.id
        )
    })
}

/// How to give the built-in agent a model, said at start and at a prompt without one: a
/// newcomer without a key can still try a whole turn with the demo model.
pub const HOW_TO_CONFIGURE: &str = "set ANTHROPIC_API_KEY or OPENAI_API_KEY (and ACPD_MODEL), \
    or [builtin.models] in the config file; ACPD_MODEL=demo tries a scripted demo model \
    without a key; or serve another agent with --agent NAME=COMMAND";

/// What stops the built-in agent from answering a prompt with its default model, if
/// anything: told at daemon start, so nobody finds out at the first prompt.
pub fn model_problem(config: &BuiltinConfig) -> Option<String> {
    let Some(spec) = config
        .default_model
        .as_deref()
        .and_then(|m| config.model(m))
    else {
        return Some(format!(
            "the built-in agent has no model and will refuse every prompt: {HOW_TO_CONFIGURE}"
        ));
    };
    missing_key(spec).map(|why| {
        format!("the built-in agent will refuse every prompt: {why}; or {HOW_TO_CONFIGURE}")
    })
}

/// What a request that got no answer tells the user.
fn send_error(e: &reqwest::Error, config: &BuiltinConfig) -> ProviderError {
    let why = match (e.is_connect(), e.is_timeout()) {
        (true, true) => format!(
            "no connection within {} s (connect_timeout_secs in [builtin])",
            config.connect_timeout.as_secs()
        ),
        (false, true) => format!(
            "no answer within {} s (read_timeout_secs in [builtin])",
            config.read_timeout.as_secs()
        ),
        _ => e.to_string(),
    };
    ProviderError::Network(why)
}

/// The start of an error response's body (a provider's error page can be of any size).
async fn error_body(resp: reqwest::Response) -> String {
    const MAX: usize = 64 * 1024;
    let mut body = Vec::new();
    let mut chunks = resp.bytes_stream();
    while body.len() < MAX
        && let Some(Ok(chunk)) = chunks.next().await
    {
        let room = MAX - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// No wait between attempts is longer than this, whatever `retry-after` says.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

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

//! `BuiltinConfig`: the `[builtin]` table of the config file, with the conventional provider
//! environment variables as fallbacks. Parsed once when the agent starts; credentials are
//! looked up lazily, when a model is first used, so a missing key is a prompt-time
//! "authentication required" rather than a startup failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A bad `[builtin]` table.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinConfigError {
    #[error("invalid [builtin] table: {0}")]
    Parse(String),
    #[error("[builtin] {0}")]
    Invalid(String),
}

/// Which wire format a model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Anthropic,
    Openai,
    /// `provider::demo`: scripted, no network, no key.
    Demo,
}

impl ProviderKind {
    pub fn key_env(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
            ProviderKind::Openai => "OPENAI_API_KEY",
            ProviderKind::Demo => "",
        }
    }
    fn base_env(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "ANTHROPIC_BASE_URL",
            ProviderKind::Openai => "OPENAI_BASE_URL",
            ProviderKind::Demo => "",
        }
    }
    pub fn default_base(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::Openai => "https://api.openai.com/v1",
            ProviderKind::Demo => "demo:",
        }
    }
}

/// One entry of the model registry.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The id clients select (`model` config option, `/model ID`).
    pub id: String,
    pub name: String,
    pub provider: ProviderKind,
    /// The provider's model name.
    pub model: String,
    base_url: Option<String>,
    api_key: Option<String>,
    api_key_env: Option<String>,
    /// Tokens of context, when known: `usage_update` is only sent with a real size.
    pub context_window: Option<u64>,
    pub max_tokens: u32,
    /// The model reasons (thinking / reasoning effort): a thought-level option is offered.
    pub reasoning: bool,
    pub images: bool,
}

/// Credentials resolved at first use.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub base_url: String,
    pub api_key: Option<String>,
    /// The provider's own service (not a local or proxy server): a key is mandatory.
    pub official: bool,
}

impl ModelSpec {
    /// Reads the key and base URL: explicit values, then the named variable, then the
    /// conventional one. Done per use so a key exported later is picked up.
    pub fn endpoint(&self) -> Endpoint {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let base_url = self
            .base_url
            .clone()
            .or_else(|| env(self.provider.base_env()))
            .unwrap_or_else(|| self.provider.default_base().to_owned());
        let api_key = self
            .api_key
            .clone()
            .or_else(|| self.api_key_env.as_deref().and_then(env))
            .or_else(|| env(self.provider.key_env()));
        let official = base_url.trim_end_matches('/') == self.provider.default_base();
        Endpoint {
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            official,
        }
    }
}

/// What the permission policy says about one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolPolicy {
    Allow,
    Ask,
    Deny,
}

/// An extra select option from the config; its value is told to the model every turn.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraOption {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub category: Option<String>,
    pub values: Vec<ExtraValue>,
    #[serde(default)]
    pub default: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraValue {
    pub value: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// Where session transcripts live: `<data_dir>/builtin`.
    pub(crate) state_dir: PathBuf,
    /// acpd's data directory: off limits to every tool (`tools::paths`).
    pub(crate) data_dir: PathBuf,
    pub(crate) models: Vec<ModelSpec>,
    pub(crate) default_model: Option<String>,
    /// Model requests per prompt before the turn stops with `max_turn_requests`.
    pub(crate) max_turn_requests: u32,
    pub(crate) retries: u32,
    pub(crate) retry_base: Duration,
    /// How long connecting to a model provider may take.
    pub(crate) connect_timeout: Duration,
    /// How long a model request may go without a byte arriving (waiting for the answer to
    /// start, or mid-stream); there is no limit on the whole answer.
    pub(crate) read_timeout: Duration,
    /// Route file tools through `fs/*` when the client offers it.
    pub(crate) client_fs: bool,
    /// Route shell through `terminal/*` when the client offers it.
    pub(crate) client_terminal: bool,
    /// Run file tools on the daemon host when the client route is not used.
    pub(crate) host_fs: bool,
    /// Run shell commands on the daemon host when the client route is not used.
    pub(crate) host_shell: bool,
    pub(crate) shell_timeout: Duration,
    /// The host shell runs confined with Landlock to the session's roots (plus these).
    pub(crate) shell_sandbox: bool,
    pub(crate) shell_sandbox_read: Vec<std::path::PathBuf>,
    pub(crate) shell_sandbox_write: Vec<std::path::PathBuf>,
    /// Variables a host shell command gets besides the inherited allowlist (`child_env`).
    pub(crate) shell_env: BTreeMap<String, String>,
    pub(crate) output_limit: usize,
    pub(crate) permissions_off: bool,
    pub(crate) tool_policy: BTreeMap<String, ToolPolicy>,
    /// Replaces the generated system prompt.
    pub(crate) system_prompt: Option<String>,
    pub(crate) system_prompt_append: Option<String>,
    /// The system prompt is fixed at a session's first prompt (provider caches keep hitting).
    pub(crate) freeze_system_prompt: bool,
    pub(crate) extra_options: Vec<ExtraOption>,
    /// A session with no turn leaves memory after this long (its transcript stays on disk).
    pub(crate) idle_unload: Duration,
    /// How long an MCP server may take to start and list its tools.
    pub(crate) mcp_connect_timeout: Duration,
    /// Which stdio MCP servers start (the daemon's top-level `mcp_stdio`, `mcp_stdio_allow`).
    pub(crate) mcp_policy: crate::McpPolicy,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBuiltin {
    default_model: Option<String>,
    #[serde(default)]
    models: BTreeMap<String, FileModel>,
    max_turn_requests: Option<u32>,
    retries: Option<u32>,
    retry_base_ms: Option<u64>,
    /// Replaced by `read_timeout_secs`; still accepted so old config files load.
    request_timeout_secs: Option<u64>,
    connect_timeout_secs: Option<u64>,
    read_timeout_secs: Option<u64>,
    client_fs: Option<bool>,
    client_terminal: Option<bool>,
    host_fs: Option<bool>,
    host_shell: Option<bool>,
    shell_timeout_secs: Option<u64>,
    shell_sandbox: Option<bool>,
    #[serde(default)]
    shell_sandbox_read: Vec<std::path::PathBuf>,
    #[serde(default)]
    shell_sandbox_write: Vec<std::path::PathBuf>,
    #[serde(default)]
    shell_env: BTreeMap<String, String>,
    output_limit_bytes: Option<usize>,
    #[serde(default)]
    permissions: FilePermissions,
    system_prompt: Option<String>,
    system_prompt_append: Option<String>,
    freeze_system_prompt: Option<bool>,
    #[serde(default)]
    config_options: Vec<ExtraOption>,
    idle_unload_secs: Option<u64>,
    mcp_connect_timeout_secs: Option<u64>,
    /// Written here by the daemon from its top-level keys of the same names.
    mcp_stdio: Option<String>,
    mcp_stdio_allow: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePermissions {
    /// "default" (ask before mutating tools) or "off" (never ask).
    mode: Option<String>,
    #[serde(default)]
    tools: BTreeMap<String, ToolPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModel {
    provider: ProviderKind,
    model: String,
    name: Option<String>,
    base_url: Option<String>,
    api_key: Option<String>,
    api_key_env: Option<String>,
    context_window: Option<u64>,
    max_tokens: Option<u32>,
    #[serde(default)]
    reasoning: bool,
    images: Option<bool>,
}

/// The tools that mutate, asked about by default.
pub const MUTATING_DEFAULT: [&str; 3] = ["shell", "write_file", "edit"];
const GENERATED_OPTIONS: [&str; 3] = ["mode", "model", "thought_level"];

/// The `[builtin.models]` (else the models the environment names) and the default one.
fn models(
    file_models: BTreeMap<String, FileModel>,
    file_default: Option<String>,
) -> Result<(Vec<ModelSpec>, Option<String>), BuiltinConfigError> {
    let mut models: Vec<ModelSpec> = file_models
        .into_iter()
        .map(|(id, m)| ModelSpec {
            name: m.name.unwrap_or_else(|| id.clone()),
            id,
            provider: m.provider,
            model: m.model,
            base_url: m.base_url,
            api_key: m.api_key,
            api_key_env: m.api_key_env,
            context_window: m.context_window,
            max_tokens: m.max_tokens.unwrap_or(8192),
            reasoning: m.reasoning,
            images: m.images.unwrap_or(true),
        })
        .collect();
    if models.is_empty() {
        models = env_models();
    }
    let default_model = file_default
        .or_else(|| {
            std::env::var("ACPD_MODEL").ok().and_then(|m| {
                models
                    .iter()
                    .find(|s| s.id == m || format!("{}/{}", kind_name(s.provider), s.model) == m)
                    .map(|s| s.id.clone())
            })
        })
        .or_else(|| models.first().map(|m| m.id.clone()));
    if let Some(d) = &default_model
        && !models.iter().any(|m| &m.id == d)
    {
        return Err(BuiltinConfigError::Invalid(format!(
            "default_model {d:?} is not in [builtin.models]"
        )));
    }
    Ok((models, default_model))
}

/// The extra config options: one per id (the generated ones' ids are taken), each with values.
fn extra_options(options: Vec<ExtraOption>) -> Result<Vec<ExtraOption>, BuiltinConfigError> {
    let mut extra_options = Vec::new();
    for o in options {
        if GENERATED_OPTIONS.contains(&o.id.as_str())
            || extra_options.iter().any(|e: &ExtraOption| e.id == o.id)
        {
            tracing::warn!(id = %o.id, "[builtin] config option id collides with another; dropped");
            continue;
        }
        if o.values.is_empty() {
            return Err(BuiltinConfigError::Invalid(format!(
                "config option {:?} has no values",
                o.id
            )));
        }
        extra_options.push(o);
    }
    Ok(extra_options)
}

/// The sandbox's extra paths: absolute, and clear of acpd's data directory.
fn check_sandbox_paths(
    read: &[std::path::PathBuf],
    write: &[std::path::PathBuf],
    data_dir: &Path,
) -> Result<(), BuiltinConfigError> {
    if let Some(p) = read.iter().chain(write).find(|p| !p.is_absolute()) {
        return Err(BuiltinConfigError::Invalid(format!(
            "shell_sandbox paths must be absolute: {}",
            p.display()
        )));
    }
    // The sandbox's extras cannot open acpd's data directory to the shell.
    if let Some(p) = read
        .iter()
        .chain(write)
        .find(|p| p.starts_with(data_dir) || data_dir.starts_with(p))
    {
        return Err(BuiltinConfigError::Invalid(format!(
            "shell_sandbox path {} would reach acpd's data directory",
            p.display()
        )));
    }
    Ok(())
}

impl BuiltinConfig {
    /// Reads `table` (the `[builtin]` section), falling back to the environment for models.
    pub fn parse(
        table: &toml::Table,
        data_dir: &Path,
    ) -> Result<BuiltinConfig, BuiltinConfigError> {
        let file: FileBuiltin = table
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| BuiltinConfigError::Parse(e.message().to_owned()))?;
        let (models, default_model) = models(file.models, file.default_model)?;
        let permissions_off = match file.permissions.mode.as_deref() {
            None | Some("default") => false,
            Some("off") => true,
            Some(other) => {
                return Err(BuiltinConfigError::Invalid(format!(
                    "permissions.mode {other:?}: expected \"default\" or \"off\""
                )));
            }
        };
        let mut tool_policy: BTreeMap<String, ToolPolicy> = MUTATING_DEFAULT
            .iter()
            .map(|t| ((*t).to_owned(), ToolPolicy::Ask))
            .collect();
        tool_policy.extend(file.permissions.tools);
        let extra_options = extra_options(file.config_options)?;
        let secs = |v: Option<u64>, d: u64| Duration::from_secs(v.unwrap_or(d));
        if file.request_timeout_secs.is_some() {
            tracing::warn!(
                "[builtin] request_timeout_secs is no longer used (it cut off long answers): \
                 a model request now ends when nothing arrives for read_timeout_secs"
            );
        }
        check_sandbox_paths(
            &file.shell_sandbox_read,
            &file.shell_sandbox_write,
            data_dir,
        )?;
        let host_shell = file.host_shell.unwrap_or(true);
        let shell_denied = tool_policy.get("shell") == Some(&ToolPolicy::Deny);
        let mcp_policy = crate::McpPolicy::new(
            file.mcp_stdio.as_deref().unwrap_or("ask"),
            file.mcp_stdio_allow.unwrap_or_default(),
        )
        .map_err(|e| BuiltinConfigError::Invalid(e.to_string()))?
        .under_shell(host_shell && !shell_denied);
        Ok(BuiltinConfig {
            state_dir: data_dir.join("builtin"),
            data_dir: data_dir.to_owned(),
            models,
            default_model,
            max_turn_requests: file.max_turn_requests.unwrap_or(50).max(1),
            retries: file.retries.unwrap_or(4),
            retry_base: Duration::from_millis(file.retry_base_ms.unwrap_or(500)),
            connect_timeout: secs(file.connect_timeout_secs, 30).max(Duration::from_secs(1)),
            read_timeout: secs(file.read_timeout_secs, 300).max(Duration::from_secs(1)),
            client_fs: file.client_fs.unwrap_or(true),
            client_terminal: file.client_terminal.unwrap_or(true),
            host_fs: file.host_fs.unwrap_or(true),
            host_shell,
            shell_timeout: secs(file.shell_timeout_secs, 300),
            shell_sandbox: file.shell_sandbox.unwrap_or(true),
            shell_sandbox_read: file.shell_sandbox_read,
            shell_sandbox_write: file.shell_sandbox_write,
            shell_env: file.shell_env,
            output_limit: file.output_limit_bytes.unwrap_or(64 * 1024).max(1024),
            permissions_off,
            tool_policy,
            system_prompt: file.system_prompt,
            system_prompt_append: file.system_prompt_append,
            freeze_system_prompt: file.freeze_system_prompt.unwrap_or(true),
            extra_options,
            idle_unload: secs(file.idle_unload_secs, 1800),
            mcp_connect_timeout: secs(file.mcp_connect_timeout_secs, 30),
            mcp_policy,
        })
    }

    pub(crate) fn model(&self, id: &str) -> Option<&ModelSpec> {
        self.models.iter().find(|m| m.id == id)
    }

    /// The policy for `tool`, before anything the user said "always" to.
    pub(crate) fn policy(&self, tool: &str, mutating: bool) -> ToolPolicy {
        if self.permissions_off {
            return ToolPolicy::Allow;
        }
        match self.tool_policy.get(tool) {
            Some(p) => *p,
            None if mutating => ToolPolicy::Ask,
            None => ToolPolicy::Allow,
        }
    }
}

fn kind_name(k: ProviderKind) -> &'static str {
    match k {
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Openai => "openai",
        ProviderKind::Demo => "demo",
    }
}

/// With no `[builtin.models]`: `ACPD_MODEL=anthropic/NAME|openai/NAME`, else one model per
/// provider whose key is set.
fn env_models() -> Vec<ModelSpec> {
    let spec = |provider: ProviderKind, model: &str| ModelSpec {
        id: format!("{}/{model}", kind_name(provider)),
        name: model.to_owned(),
        provider,
        model: model.to_owned(),
        base_url: None,
        api_key: None,
        api_key_env: None,
        context_window: known_context_window(provider, model),
        max_tokens: 8192,
        reasoning: false,
        images: true,
    };
    if let Ok(m) = std::env::var("ACPD_MODEL") {
        if m == "demo" {
            return vec![ModelSpec {
                id: "demo".into(),
                name: "Demo (scripted, not AI)".into(),
                context_window: None,
                ..spec(ProviderKind::Demo, "demo")
            }];
        }
        let parsed = match m.split_once('/') {
            Some(("anthropic", name)) if !name.is_empty() => {
                Some(spec(ProviderKind::Anthropic, name))
            }
            Some(("openai", name)) if !name.is_empty() => Some(spec(ProviderKind::Openai, name)),
            _ => {
                tracing::warn!(value = %m, "ACPD_MODEL must be anthropic/NAME, openai/NAME or demo; ignored");
                None
            }
        };
        if let Some(s) = parsed {
            return vec![s];
        }
    }
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let mut out = vec![];
    if set("ANTHROPIC_API_KEY") || set("ANTHROPIC_BASE_URL") {
        out.push(spec(ProviderKind::Anthropic, "claude-sonnet-4-5"));
    }
    if set("OPENAI_API_KEY") || set("OPENAI_BASE_URL") {
        out.push(spec(ProviderKind::Openai, "gpt-4.1"));
    }
    out
}

/// Context windows of well-known model families; anything else stays unknown.
fn known_context_window(provider: ProviderKind, model: &str) -> Option<u64> {
    match provider {
        ProviderKind::Anthropic if model.starts_with("claude-") => Some(200_000),
        ProviderKind::Openai if model.starts_with("gpt-4.1") => Some(1_047_576),
        ProviderKind::Openai if model.starts_with("gpt-4o") => Some(128_000),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BuiltinConfig, BuiltinConfigError> {
        BuiltinConfig::parse(&text.parse().unwrap(), Path::new("/var/lib/acpd"))
    }

    #[test]
    fn the_sandbox_extras_cannot_reach_the_data_directory() {
        for bad in ["/var/lib", "/var/lib/acpd/builtin"] {
            let r = parse(&format!("shell_sandbox_read = [{bad:?}]"));
            assert!(matches!(r, Err(BuiltinConfigError::Invalid(_))), "{bad}");
        }
        assert!(parse("shell_sandbox_write = [\"/srv/cache\"]").is_ok());
    }

    #[test]
    fn without_a_host_shell_mcp_ask_is_deny() {
        use crate::mcp_policy::McpStdio;
        let mode = |t: &str| parse(t).unwrap().mcp_policy.mode;
        assert_eq!(mode(""), McpStdio::Ask);
        assert_eq!(mode("host_shell = false"), McpStdio::Deny);
        assert_eq!(mode("permissions.tools.shell = \"deny\""), McpStdio::Deny);
        assert_eq!(mode("permissions.tools.shell = \"allow\""), McpStdio::Ask);
        assert_eq!(
            mode("host_shell = false\nmcp_stdio = \"allow\""),
            McpStdio::Allow
        );
    }
}

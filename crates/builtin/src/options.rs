//! Modes, config options and slash commands: what the client is offered, and how a choice
//! changes a session's `Settings`.

use serde_json::{Value, json};

use super::config::BuiltinConfig;
use super::state::Settings;

pub const BUILD: &str = "build";
pub const PLAN: &str = "plan";
const THOUGHT_LEVELS: [(&str, &str); 4] = [
    ("off", "Off"),
    ("low", "Low"),
    ("medium", "Medium"),
    ("high", "High"),
];

pub fn default_settings(config: &BuiltinConfig) -> Settings {
    Settings {
        mode: BUILD.into(),
        model: config.default_model.clone(),
        thought_level: "medium".into(),
        extra: config
            .extra_options
            .iter()
            .map(|o| {
                let v = o
                    .default
                    .clone()
                    .filter(|d| o.values.iter().any(|v| &v.value == d))
                    .unwrap_or_else(|| o.values[0].value.clone());
                (o.id.clone(), v)
            })
            .collect(),
    }
}

/// Settings restored from disk may name a model or option that the config no longer has.
pub fn reconcile(config: &BuiltinConfig, s: &mut Settings) {
    if s.model.as_deref().is_none_or(|m| config.model(m).is_none()) {
        s.model = config.default_model.clone();
    }
    if s.mode != BUILD && s.mode != PLAN {
        s.mode = BUILD.into();
    }
    let defaults = default_settings(config);
    s.extra.retain(|k, v| {
        config
            .extra_options
            .iter()
            .any(|o| &o.id == k && o.values.iter().any(|x| &x.value == v))
    });
    for (k, v) in defaults.extra {
        s.extra.entry(k).or_insert(v);
    }
}

pub fn modes(s: &Settings) -> Value {
    json!({
        "currentModeId": s.mode,
        "availableModes": [
            { "id": BUILD, "name": "Build", "description": "Read, edit and run commands" },
            { "id": PLAN, "name": "Plan", "description": "Read-only: explore and plan, no edits or commands" },
        ],
    })
}

pub fn config_options(config: &BuiltinConfig, s: &Settings) -> Value {
    let mut out = vec![json!({
        "id": "mode",
        "name": "Mode",
        "category": "mode",
        "type": "select",
        "currentValue": s.mode,
        "options": [
            { "value": BUILD, "name": "Build" },
            { "value": PLAN, "name": "Plan" },
        ],
    })];
    if let Some(current) = &s.model {
        out.push(json!({
            "id": "model",
            "name": "Model",
            "category": "model",
            "type": "select",
            "currentValue": current,
            "options": config.models.iter().map(|m| json!({ "value": m.id, "name": m.name })).collect::<Vec<_>>(),
        }));
        if config.model(current).is_some_and(|m| m.reasoning) {
            out.push(json!({
                "id": "thought_level",
                "name": "Thinking",
                "category": "thought_level",
                "type": "select",
                "currentValue": s.thought_level,
                "options": THOUGHT_LEVELS.iter().map(|(v, n)| json!({ "value": v, "name": n })).collect::<Vec<_>>(),
            }));
        }
    }
    for o in &config.extra_options {
        let mut opt = json!({
            "id": o.id,
            "name": o.name,
            "type": "select",
            "currentValue": s.extra.get(&o.id).cloned().unwrap_or_default(),
            "options": o.values.iter().map(|v| {
                let mut x = json!({ "value": v.value, "name": v.name });
                if let Some(d) = &v.description { x["description"] = json!(d); }
                x
            }).collect::<Vec<_>>(),
        });
        if let Some(d) = &o.description {
            opt["description"] = json!(d);
        }
        if let Some(c) = &o.category {
            opt["category"] = json!(c);
        }
        out.push(opt);
    }
    Value::Array(out)
}

/// Why an option was not set (the -32602 message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("unknown mode {0:?}")]
    Mode(String),
    #[error("unknown model {0:?}")]
    Model(String),
    #[error("unknown thought level {0:?}")]
    ThoughtLevel(String),
    #[error("unknown config option {0:?}")]
    Option(String),
    #[error("unknown value {value:?} for {option:?}")]
    Value { option: String, value: String },
}

/// Applies `value` to option `id`; what is unknown, if anything.
pub fn set_option(
    config: &BuiltinConfig,
    s: &mut Settings,
    id: &str,
    value: &str,
) -> Result<(), OptionError> {
    match id {
        "mode" => {
            if value != BUILD && value != PLAN {
                return Err(OptionError::Mode(value.to_owned()));
            }
            s.mode = value.to_owned();
        }
        "model" => {
            if config.model(value).is_none() {
                return Err(OptionError::Model(value.to_owned()));
            }
            s.model = Some(value.to_owned());
        }
        "thought_level" => {
            if !THOUGHT_LEVELS.iter().any(|(v, _)| *v == value) {
                return Err(OptionError::ThoughtLevel(value.to_owned()));
            }
            s.thought_level = value.to_owned();
        }
        other => {
            let Some(o) = config.extra_options.iter().find(|o| o.id == other) else {
                return Err(OptionError::Option(other.to_owned()));
            };
            if !o.values.iter().any(|v| v.value == value) {
                return Err(OptionError::Value {
                    option: other.to_owned(),
                    value: value.to_owned(),
                });
            }
            s.extra.insert(other.to_owned(), value.to_owned());
        }
    }
    Ok(())
}

pub fn available_commands(config: &BuiltinConfig) -> Value {
    let models: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
    json!([
        { "name": "compact", "description": "Summarize the conversation so far to free context" },
        { "name": "mode", "description": "Switch mode: build or plan", "input": { "hint": "build | plan" } },
        { "name": "model", "description": "Switch model", "input": { "hint": models.join(" | ") } },
    ])
}

/// A prompt that is a slash command: `/name rest`.
pub fn slash_command(prompt: &[Value]) -> Option<(String, String)> {
    if prompt.len() != 1 {
        return None;
    }
    let text = prompt[0].get("text").and_then(Value::as_str)?.trim();
    let rest = text.strip_prefix('/')?;
    let (name, arg) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    matches!(name, "compact" | "mode" | "model").then(|| (name.to_owned(), arg.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BuiltinConfig {
        let table: toml::Table = toml::from_str(
            r#"
            [models.a]
            provider = "anthropic"
            model = "m-a"
            reasoning = true
            [models.b]
            provider = "openai"
            model = "m-b"
            [[config_options]]
            id = "model"
            name = "collides"
            values = [{ value = "x", name = "X" }]
            [[config_options]]
            id = "tone"
            name = "Tone"
            category = "style"
            values = [{ value = "terse", name = "Terse" }, { value = "chatty", name = "Chatty" }]
            default = "chatty"
            "#,
        )
        .unwrap();
        BuiltinConfig::parse(&table, std::path::Path::new("/tmp")).unwrap()
    }

    #[test]
    fn generated_and_extra_options() {
        let c = config();
        let mut s = default_settings(&c);
        assert_eq!(s.extra.get("tone").map(String::as_str), Some("chatty"));
        let ids = |s: &Settings| -> Vec<String> {
            config_options(&c, s)
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["id"].as_str().unwrap().to_owned())
                .collect()
        };
        // The colliding extra option is dropped; "a" reasons, so a thought level is offered.
        assert_eq!(ids(&s), ["mode", "model", "thought_level", "tone"]);
        set_option(&c, &mut s, "model", "b").unwrap();
        assert_eq!(ids(&s), ["mode", "model", "tone"]);
        set_option(&c, &mut s, "tone", "terse").unwrap();
        assert!(set_option(&c, &mut s, "tone", "loud").is_err());
        assert!(set_option(&c, &mut s, "nope", "x").is_err());
        s.model = Some("gone".into());
        s.extra.insert("tone".into(), "gone".into());
        reconcile(&c, &mut s);
        assert_eq!(s.model.as_deref(), Some("a"));
        assert_eq!(s.extra.get("tone").map(String::as_str), Some("chatty"));
    }

    #[test]
    fn slash_commands() {
        let p = |t: &str| vec![serde_json::json!({ "type": "text", "text": t })];
        assert_eq!(
            slash_command(&p("/mode plan")),
            Some(("mode".into(), "plan".into()))
        );
        assert_eq!(
            slash_command(&p("/compact")),
            Some(("compact".into(), String::new()))
        );
        assert_eq!(slash_command(&p("/unknown x")), None);
        assert_eq!(slash_command(&p("not a command")), None);
    }
}

//! Prompt content (ACP `ContentBlock`s) into transcript blocks, the system prompt, and the
//! replay of a transcript as `session/update`s for `session/load`.

use serde_json::{Value, json};

use super::config::{BuiltinConfig, ModelSpec};
use super::tools::{self, Roots};
use super::transcript::{Block, Message, Role};

/// Converts a prompt; returns the blocks and warnings for what could not be sent as is.
pub fn prompt_blocks(prompt: &[Value], model: Option<&ModelSpec>) -> (Vec<Block>, Vec<String>) {
    let images = model.is_none_or(|m| m.images);
    let mut out = vec![];
    let mut warnings = vec![];
    for b in prompt {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        let s = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match kind {
            "text" => out.push(Block::Text { text: s("text") }),
            "resource_link" => {
                let name = s("name");
                out.push(Block::Text {
                    text: format!(
                        "[@{}]({})",
                        if name.is_empty() { s("uri") } else { name },
                        s("uri")
                    ),
                });
            }
            "resource" => {
                let r = &b["resource"];
                let uri = r.get("uri").and_then(Value::as_str).unwrap_or("");
                match r.get("text").and_then(Value::as_str) {
                    Some(text) => out.push(Block::Text {
                        text: format!("<context ref=\"{uri}\">\n{text}\n</context>"),
                    }),
                    None => {
                        warnings.push(format!(
                            "the binary resource {uri} was sent as a reference only"
                        ));
                        out.push(Block::Text {
                            text: format!("[binary resource {uri} omitted]"),
                        });
                    }
                }
            }
            "image" if images => out.push(Block::Image {
                media_type: s("mimeType"),
                data: s("data"),
            }),
            "image" | "audio" => {
                warnings.push(format!(
                    "this model cannot take {kind} input; it was left out"
                ));
                out.push(Block::Text {
                    text: format!("[{kind} attachment omitted: the model does not support it]"),
                });
            }
            other => {
                warnings.push(format!("unsupported content block {other:?} left out"));
            }
        }
    }
    (out, warnings)
}

/// The system prompt for a session; fixed at its first prompt unless configured otherwise.
pub fn system_prompt(config: &BuiltinConfig, roots: &Roots) -> String {
    if let Some(p) = &config.system_prompt {
        return p.clone();
    }
    let mut s = String::from(
        "You are a coding agent working in the user's project through tools. \
         Read files before changing them; prefer `edit` for small changes to existing files; \
         keep answers short and concrete. Use relative paths from the working directory.\n",
    );
    s.push_str(&format!("\nWorking directory: {}\n", roots.cwd().display()));
    if roots.lexical.len() > 1 {
        s.push_str("Additional directories you may use:\n");
        for d in &roots.lexical[1..] {
            s.push_str(&format!("- {}\n", d.display()));
        }
    }
    s.push_str(&format!(
        "Platform: {}\nToday: {}\n",
        std::env::consts::OS,
        chrono::Utc::now().format("%Y-%m-%d")
    ));
    if let Some(a) = &config.system_prompt_append {
        s.push('\n');
        s.push_str(a);
    }
    s
}

/// The conversation as `session/update`s, for `session/load`: thinking as thought chunks,
/// tool calls in their final state.
pub fn replay(messages: &[Message], roots: &Roots) -> Vec<Value> {
    let mut out = vec![];
    let results: std::collections::HashMap<&str, (&str, bool)> = messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Some((tool_use_id.as_str(), (content.as_str(), *is_error))),
            _ => None,
        })
        .collect();
    for m in messages {
        for b in &m.content {
            match (m.role, b) {
                (Role::User, Block::Text { text }) if !text.starts_with("<system-reminder>") => {
                    out.push(json!({ "sessionUpdate": "user_message_chunk", "content": { "type": "text", "text": text } }))
                }
                (Role::User, Block::Image { media_type, data }) => out.push(json!({
                    "sessionUpdate": "user_message_chunk",
                    "content": { "type": "image", "mimeType": media_type, "data": data },
                })),
                (Role::Assistant, Block::Text { text }) => out.push(
                    json!({ "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": text } }),
                ),
                (Role::Assistant, Block::Thinking { text, .. }) => out.push(
                    json!({ "sessionUpdate": "agent_thought_chunk", "content": { "type": "text", "text": text } }),
                ),
                (Role::Assistant, Block::ToolUse { id, name, input }) => {
                    let (title, kind, locations) = tools::describe(name, input, roots);
                    let (status, text) = match results.get(id.as_str()) {
                        Some((text, false)) => ("completed", *text),
                        Some((text, true)) => ("failed", *text),
                        None => ("failed", ""),
                    };
                    let mut u = json!({
                        "sessionUpdate": "tool_call",
                        "toolCallId": id,
                        "title": title,
                        "kind": kind,
                        "status": status,
                        "locations": locations,
                        "rawInput": input,
                        "content": [],
                    });
                    if !text.is_empty() {
                        u["content"] = json!([{ "type": "content", "content": { "type": "text", "text": text } }]);
                    }
                    out.push(u);
                }
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_shows_thinking_and_final_tool_state() {
        let roots = Roots::new(
            std::path::Path::new("/w"),
            &[],
            std::path::Path::new("/acpd-data"),
        );
        let messages = vec![
            Message::user(vec![Block::Text { text: "hi".into() }]),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::Thinking {
                        text: "hmm".into(),
                        signature: None,
                    },
                    Block::ToolUse {
                        id: "t1".into(),
                        name: "read_file".into(),
                        input: json!({ "path": "a" }),
                    },
                ],
            },
            Message::user(vec![Block::ToolResult {
                tool_use_id: "t1".into(),
                content: "nope".into(),
                is_error: true,
            }]),
        ];
        let u = replay(&messages, &roots);
        let kinds: Vec<&str> = u
            .iter()
            .filter_map(|x| x["sessionUpdate"].as_str())
            .collect();
        assert_eq!(
            kinds,
            ["user_message_chunk", "agent_thought_chunk", "tool_call"]
        );
        assert_eq!(u[2]["status"], "failed");
        assert_eq!(u[2]["locations"][0]["path"], "/w/a");
    }

    #[test]
    fn unsupported_blocks_become_text_with_a_warning() {
        let (blocks, warnings) = prompt_blocks(
            &[
                json!({ "type": "audio", "data": "AA", "mimeType": "audio/wav" }),
                json!({ "type": "resource", "resource": { "uri": "file:///a.rs", "text": "fn main() {}" } }),
            ],
            None,
        );
        assert_eq!(warnings.len(), 1);
        assert!(matches!(&blocks[1], Block::Text { text } if text.contains("fn main")));
    }
}

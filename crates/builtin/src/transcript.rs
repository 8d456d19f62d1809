//! The model transcript in a provider-neutral form: what is persisted per session and what
//! each provider serializes into its own wire format. Thinking keeps its signature so a
//! tool loop with extended thinking can be sent back to Anthropic unchanged.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    Image {
        media_type: String,
        data: String,
    },
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: String,
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

impl Message {
    pub fn user(content: Vec<Block>) -> Message {
        Message {
            role: Role::User,
            content,
        }
    }

    /// The message's text blocks joined (tool calls and results left out).
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Appends a user message, merging with a trailing user message so roles keep alternating
/// (a failed model call leaves the prompt without an answer).
pub fn push_user(messages: &mut Vec<Message>, content: Vec<Block>) {
    if content.is_empty() {
        return;
    }
    match messages.last_mut() {
        Some(m) if m.role == Role::User => m.content.extend(content),
        _ => messages.push(Message::user(content)),
    }
}

/// Tool uses of the last assistant message that have no result yet: after a cancel they get
/// an error result, since providers reject a tool use without one.
pub fn close_dangling_tool_uses(messages: &mut Vec<Message>, why: &str) {
    let Some(last_assistant) = messages.iter().rposition(|m| m.role == Role::Assistant) else {
        return;
    };
    let answered: Vec<String> = messages[last_assistant + 1..]
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
            _ => None,
        })
        .collect();
    let missing: Vec<Block> = messages[last_assistant]
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, .. } if !answered.contains(id) => Some(Block::ToolResult {
                tool_use_id: id.clone(),
                content: why.to_owned(),
                is_error: true,
            }),
            _ => None,
        })
        .collect();
    if !missing.is_empty() {
        push_user(messages, missing);
    }
}

/// The first line of the first user text, shortened: the session's title.
pub fn title_of(messages: &[Message]) -> Option<String> {
    let text = messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.content.iter())
        .find_map(|b| match b {
            Block::Text { text } if !text.trim().is_empty() && !text.starts_with('<') => {
                Some(text.trim())
            }
            _ => None,
        })?;
    let line = text.lines().next().unwrap_or(text).trim();
    let mut title: String = line.chars().take(60).collect();
    if line.chars().count() > 60 {
        title.push('…');
    }
    Some(title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangling_tool_uses_get_error_results() {
        let mut m = vec![
            Message::user(vec![Block::Text { text: "hi".into() }]),
            Message {
                role: Role::Assistant,
                content: vec![
                    Block::ToolUse {
                        id: "a".into(),
                        name: "shell".into(),
                        input: Value::Null,
                    },
                    Block::ToolUse {
                        id: "b".into(),
                        name: "shell".into(),
                        input: Value::Null,
                    },
                ],
            },
            Message::user(vec![Block::ToolResult {
                tool_use_id: "a".into(),
                content: "ok".into(),
                is_error: false,
            }]),
        ];
        close_dangling_tool_uses(&mut m, "cancelled");
        assert_eq!(m.len(), 3);
        assert_eq!(m[2].content.len(), 2);
        assert!(
            matches!(&m[2].content[1], Block::ToolResult { tool_use_id, is_error: true, .. } if tool_use_id == "b")
        );
    }

    #[test]
    fn title_is_first_line() {
        let m = vec![Message::user(vec![Block::Text {
            text: "Fix the bug\nin main.rs".into(),
        }])];
        assert_eq!(title_of(&m).as_deref(), Some("Fix the bug"));
    }
}

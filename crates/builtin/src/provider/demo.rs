//! The demo model (`ACPD_MODEL=demo`, or `provider = "demo"` in `[builtin.models]`): a few
//! scripted lines, no network and no key, so a newcomer can see a whole turn stream before
//! configuring a real model. Every answer says it is the demo; it calls no tools.

use super::{Delta, Finish, ModelRequest, Usage};
use crate::transcript::Role;

/// What every demo answer starts with, so nobody mistakes it for a model.
pub const LABEL: &str = "[acpd demo model]";

/// The answer to `req`, as the deltas a streamed answer would bring, in a few pieces.
pub(super) fn answer(req: &ModelRequest<'_>) -> Vec<Delta> {
    let said = req
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .map(|m| m.text())
        .unwrap_or_default();
    let said = said.trim();
    let echo: String = said.chars().take(200).collect();
    let more = if echo.len() < said.len() { "…" } else { "" };
    let pieces = [
        format!("{LABEL} "),
        "This is a scripted demo, not an AI model. ".to_owned(),
        format!("You said: \"{echo}{more}\". "),
        "acpd streamed this answer to you, journaled it and ended the turn as a real model's. "
            .to_owned(),
        "For real answers, set ANTHROPIC_API_KEY or OPENAI_API_KEY (or [builtin.models] in the \
         config file), or serve another agent with --agent NAME=COMMAND."
            .to_owned(),
    ];
    let output = pieces
        .iter()
        .map(|p| p.split_whitespace().count() as u64)
        .sum();
    let mut deltas: Vec<Delta> = pieces.into_iter().map(Delta::Text).collect();
    deltas.push(Delta::Usage(Usage {
        input: said.split_whitespace().count() as u64,
        output,
        ..Usage::default()
    }));
    deltas.push(Delta::Finish(Finish::Stop));
    deltas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{Block, Message};

    fn text_of(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_demo_says_it_is_the_demo_and_echoes_the_last_prompt() {
        let messages = [
            Message::user(vec![Block::Text {
                text: "first".into(),
            }]),
            Message::user(vec![Block::Text {
                text: "hello there".into(),
            }]),
        ];
        let req = ModelRequest {
            system: "",
            messages: &messages,
            tools: &[],
            thought: super::super::Thought::Off,
        };
        let deltas = answer(&req);
        let text = text_of(&deltas);
        assert!(text.starts_with(LABEL), "{text}");
        assert!(text.contains("\"hello there\""), "{text}");
        assert!(text.contains("ANTHROPIC_API_KEY"), "{text}");
        assert_eq!(deltas.last(), Some(&Delta::Finish(Finish::Stop)));
        assert!(deltas.len() > 3, "streamed in pieces");
    }
}

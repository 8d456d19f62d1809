//! `ask_user`: the model asks the user one question through a form-mode `elicitation/create`
//! (offered only to a client that declared `elicitation.form`); acpd relays it to the
//! session's controllers that can show a form, and the first answer comes back.

use acpd_protocol::method;

use serde_json::{Value, json};

use super::{Outcome, ToolEnv, ToolError};

pub const NAME: &str = "ask_user";

pub fn description() -> &'static str {
    "Ask the user one short question and wait for their typed answer. Use it when you need a \
     value only the user knows (a name, a choice, a preference); never for passwords, keys or \
     other secrets."
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": { "question": { "type": "string" } },
        "required": ["question"],
    })
}

/// The form: one string field, `answer`.
pub async fn ask_user(env: &ToolEnv<'_>, input: &Value) -> Result<Outcome, ToolError> {
    let question = input
        .get("question")
        .and_then(Value::as_str)
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| ToolError::BadInput("question is required".into()))?;
    let params = json!({
        "mode": "form",
        "message": question,
        "toolCallId": env.tool_call_id,
        "requestedSchema": {
            "type": "object",
            "properties": { "answer": { "type": "string", "title": "Answer" } },
            "required": ["answer"],
        },
    });
    let r = env
        .client
        .request(method::ELICITATION_CREATE, params, env.cancel)
        .await?;
    let text = match r.get("action").and_then(Value::as_str) {
        Some("accept") => match r.pointer("/content/answer") {
            Some(Value::String(s)) => format!("The user answered: {s}"),
            Some(other) => format!("The user answered: {other}"),
            None => "The user accepted without an answer.".to_owned(),
        },
        Some("decline") => "The user declined to answer.".to_owned(),
        Some("cancel") => "The user dismissed the question without answering.".to_owned(),
        _ => {
            return Err(ToolError::Client(format!(
                "an answer without an action: {r}"
            )));
        }
    };
    Ok(Outcome::text(env.truncate(text)).with_content(vec![json!({
        "type": "content",
        "content": { "type": "text", "text": r.pointer("/content/answer").and_then(Value::as_str).unwrap_or("") },
    })]))
}

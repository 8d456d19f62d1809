//! The elicitation script commands: `elicitation/create` in form or URL mode, with the
//! answer said back in an `agent_message_chunk`, and the `elicitation/complete` notification.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::io::CallOutcome;
use crate::state::Agent;

#[derive(Debug, Clone, PartialEq)]
pub enum Elicit {
    /// `elicit_form MESSAGE`: a form asking for `name` (a string). Says
    /// `elicit: ACTION CONTENT` (`elicit: accept {"name":"Ada"}`, `elicit: decline`).
    Form(String),
    /// `elicit_url ID URL`: a URL-mode elicitation with `elicitationId` ID. Says
    /// `elicit: ACTION`.
    Url { id: String, url: String },
    /// `elicit_complete ID`: sends `elicitation/complete`, then says `completed ID`.
    Complete(String),
}

/// The command of a script line whose first word is `word`, if it is one of these.
pub fn parse(word: &str, rest: &str) -> Option<Result<Elicit, String>> {
    let args: Vec<&str> = rest.split_whitespace().collect();
    let bad = |why: &str| Err(format!("invalid script line `{word} {rest}`: {why}"));
    Some(match (word, args.as_slice()) {
        ("elicit_form", _) => Ok(Elicit::Form(rest.to_owned())),
        ("elicit_url", [id, url]) => Ok(Elicit::Url {
            id: id.to_string(),
            url: url.to_string(),
        }),
        ("elicit_url", _) => bad("needs an id and a URL"),
        ("elicit_complete", [id]) => Ok(Elicit::Complete(id.to_string())),
        ("elicit_complete", _) => bad("needs an id"),
        _ => return None,
    })
}

/// Runs one; `Err(())` when the turn was cancelled while it waited.
pub async fn run(
    agent: &Arc<Agent>,
    sid: &str,
    e: Elicit,
    cancel: &CancellationToken,
) -> Result<(), ()> {
    let params = match e {
        Elicit::Form(message) => json!({
            "sessionId": sid,
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": { "name": { "type": "string", "title": "Name" } },
                "required": ["name"],
            },
        }),
        Elicit::Url { id, url } => json!({
            "sessionId": sid,
            "mode": "url",
            "elicitationId": id,
            "url": url,
            "message": "Open this page to go on",
        }),
        Elicit::Complete(id) => {
            let params = json!({ "elicitationId": id });
            agent.out.notify(method::ELICITATION_COMPLETE, params);
            agent.say(sid, format!("completed {id}"));
            return Ok(());
        }
    };
    let said = match agent
        .peer
        .call(&agent.out, method::ELICITATION_CREATE, params, cancel)
        .await
    {
        CallOutcome::Ok(r) => {
            let action = r.get("action").and_then(Value::as_str).unwrap_or("?");
            match r.get("content").filter(|c| !c.is_null()) {
                Some(content) => format!("elicit: {action} {content}"),
                None => format!("elicit: {action}"),
            }
        }
        CallOutcome::Err(e) => format!("elicit: error {} {}", e.code, e.message),
        CallOutcome::Cancelled => return Err(()),
    };
    agent.say(sid, said);
    Ok(())
}

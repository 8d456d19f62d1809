//! Permission decisions: each answer to an agent's `session/request_permission` is recorded
//! (`permission_decisions`: the tool call, the option, who answered or that acpd did), and a
//! profile's `approve = "reads"` preset answers read-only tool calls `allow_once` itself,
//! never `allow_always`.

use serde_json::{Value, json};

use super::Session;
use acpd_protocol::method;
use acpd_store::DecisionRow;
use acpd_wire::IncomingRequest;

/// Tool kinds that change nothing: what the `reads` preset approves.
const READ_ONLY: [&str; 3] = ["read", "search", "think"];

/// The `allow_once` option of a permission request about a read-only tool call.
fn read_only_allow_once(params: &Value) -> Option<&str> {
    let kind = params.pointer("/toolCall/kind").and_then(Value::as_str)?;
    if !READ_ONLY.contains(&kind) {
        return None;
    }
    params
        .get("options")?
        .as_array()?
        .iter()
        .find(|o| o["kind"] == "allow_once")?
        .get("optionId")?
        .as_str()
}

impl Session {
    /// Answers the request itself when the profile's preset covers it; else hands it back.
    pub(super) fn auto_approve(&mut self, req: IncomingRequest) -> Option<IncomingRequest> {
        if req.method != method::SESSION_REQUEST_PERMISSION
            || !self.shared.settings.approve_reads.contains(&self.row.agent)
        {
            return Some(req);
        }
        let params = req.params.clone().unwrap_or(Value::Null);
        let Some(option) = read_only_allow_once(&params) else {
            return Some(req);
        };
        let outcome = json!({ "outcome": "selected", "optionId": option });
        tracing::info!(target: "acpd::audit", session = %self.id, profile = %self.row.agent, option, "permission approved automatically (approve = \"reads\")");
        self.record_decision(&params, &outcome, None);
        req.responder.respond_now(Ok(json!({ "outcome": outcome })));
        None
    }

    /// Records an answer to a permission request; `by` is who answered (`None`: acpd).
    pub(super) fn record_decision(&mut self, params: &Value, outcome: &Value, by: Option<Value>) {
        let option_id = outcome.get("optionId").and_then(Value::as_str);
        let option_kind = params
            .get("options")
            .and_then(Value::as_array)
            .and_then(|os| os.iter().find(|o| o["optionId"].as_str() == option_id))
            .and_then(|o| o["kind"].as_str());
        let text = |p: &str| params.pointer(p).and_then(Value::as_str).map(str::to_owned);
        let row = DecisionRow {
            session_id: self.id.to_string(),
            at_ms: crate::session::now_ms(),
            tool_call_id: text("/toolCall/toolCallId"),
            title: text("/toolCall/title"),
            tool_kind: text("/toolCall/kind"),
            option_id: option_id.map(str::to_owned),
            option_kind: option_kind.map(str::to_owned),
            outcome: outcome
                .get("outcome")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
            automatic: by.is_none(),
            decided_by: by.map(|b| b.to_string()),
        };
        // On the daemon's tracker, not the actor's set: a shutdown waits for it even when
        // the session ends first (an actor's end lets its own tasks go).
        let store = self.shared.store.clone();
        self.shared.tasks.spawn(async move {
            if let Err(e) = store.record_decision(&row).await {
                tracing::warn!(session = %row.session_id, error = %e, "cannot record a permission decision");
            }
        });
    }
}

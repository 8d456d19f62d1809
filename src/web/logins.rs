//! The console's agent logins: which hosted agents the signed-in principal may log in, and
//! why not when it may not (`GET /web/api/logins`), with exactly the refusal `/acp/login`
//! would answer (`login::refusal`): a browser's WebSocket never sees a refused upgrade's
//! body, so the login page asks here first, and again when its socket is refused.
//!
//! The login itself runs over `/acp/login` (the console's cookie is accepted there) and is
//! shown by `assets/agent-login.js`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::WebState;
use super::api::signed_in;

/// `GET /web/api/logins`: every hosted agent profile, in name order, with `command` (its
/// `login = [...]`, or `null`: the agent's own terminal login) and `refusal` (`null`, or
/// `{status, message}`: what `/acp/login` answers this principal now).
pub async fn list(State(st): State<WebState>, headers: HeaderMap) -> Response {
    let who = match signed_in(&st, &headers).await {
        Ok(who) => who,
        Err(resp) => return resp,
    };
    let logins: Vec<Value> = st
        .config
        .agents
        .values()
        .map(|p| {
            let refusal = crate::login::refusal(Some(p), &who.name, &st.logins)
                .map(|(status, message)| json!({ "status": status.as_u16(), "message": message }));
            let command = (!p.login.is_empty()).then(|| shell_words::join(&p.login));
            json!({ "agent": p.name, "command": command, "refusal": refusal })
        })
        .collect();
    Json(json!({ "principal": who.name, "logins": logins })).into_response()
}

//! `_acpd/session/share`: a session's owner grants another principal a role on it, or
//! revokes that (the decisions and the store are `session::share`).

use serde_json::Value;

use crate::error::AcpError;
use crate::session::{SessionHub, ShareRequest};
use acpd_wire::Responder;

/// Answers one `_acpd/session/share` of `principal`.
pub(super) async fn answer(
    hub: &SessionHub,
    principal: &str,
    params: &Value,
    responder: Responder,
) {
    let (sid, with, role) = match super::params::share_request(params) {
        Ok(r) => r,
        Err(why) => return responder.respond(Err(AcpError::from(why).into())).await,
    };
    let req = ShareRequest {
        session_id: &sid,
        with: &with,
        role,
    };
    let result = hub.share(principal, req).await.map_err(Into::into);
    responder.respond(result).await;
}

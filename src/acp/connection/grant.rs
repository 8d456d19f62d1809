//! A grant is not ownership: a connection whose principal opened a session through a grant
//! (`Connection::caps` holds it) may not delete, fork or re-share it, and its `session/close`
//! detaches only itself. Decided here, where the grant is known (the actor knows attached
//! clients only, and a `session/delete` attaches nothing first); `roles::grantee_step` is
//! the decision.

use acpd_protocol::method;
use serde_json::json;

use super::{Connection, Slot, reject};
use crate::error::AcpError;
use crate::session::roles::{GranteeStep, grantee_step};
use crate::session::{SessionCommand, SessionHandle};

/// What became of a grantee's command that was not sent on.
pub(super) enum Kept {
    /// Refused: only the owner may.
    Refused,
    /// A close: this connection detached from the session (and the close was answered).
    Detached,
}

/// The ACP method a command came as, for the commands a grant may change.
fn method_of(cmd: &SessionCommand) -> Option<&'static str> {
    Some(match cmd {
        SessionCommand::Fork { .. } => method::SESSION_FORK,
        SessionCommand::Close { .. } => method::SESSION_CLOSE,
        SessionCommand::Delete { .. } => method::SESSION_DELETE,
        _ => return None,
    })
}

impl Connection {
    /// Whether this connection's principal holds `sid` through a grant, not as its owner.
    pub(super) fn is_grantee(&self, sid: &str) -> bool {
        self.caps.contains_key(sid)
    }

    /// A command for `sid` while this connection is attached to it: the command to send on,
    /// or `None` when a grant kept it (answered here).
    pub(super) async fn grantee_attached(
        &mut self,
        sid: &str,
        cmd: SessionCommand,
    ) -> Option<SessionCommand> {
        let handle = match self.sessions.get(sid) {
            Some(Slot::Attached(h)) if self.is_grantee(sid) => h.clone(),
            _ => return Some(cmd),
        };
        self.as_grantee(sid, &handle, cmd).await.ok()
    }

    /// A command for `sid` (opened as `handle`) from a grantee: the command to send on, or
    /// what was done with it instead (answered here).
    pub(super) async fn as_grantee(
        &mut self,
        sid: &str,
        handle: &SessionHandle,
        cmd: SessionCommand,
    ) -> Result<SessionCommand, Kept> {
        let Some(method) = method_of(&cmd) else {
            return Ok(cmd);
        };
        match grantee_step(method) {
            GranteeStep::Send => Ok(cmd),
            GranteeStep::OwnerOnly => {
                tracing::info!(target: "acpd::audit", session = %sid, principal = %self.ctx.principal_name, %method, "refused: a grantee is not the owner");
                reject(cmd, AcpError::NotOwner(method.to_owned())).await;
                Err(Kept::Refused)
            }
            GranteeStep::DetachOnly => {
                let detach = SessionCommand::Detach {
                    conn: self.ctx.conn_id.clone(),
                };
                let _ = handle.send(detach).await;
                // Its next command for the session opens and attaches it again.
                self.sessions.remove(sid);
                self.roles.remove(sid);
                if let Some(r) = cmd.into_responder() {
                    r.respond(Ok(json!({}))).await;
                }
                Err(Kept::Detached)
            }
        }
    }
}

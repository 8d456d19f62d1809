//! Sharing a session with other principals: grants in the store (`_acpd/session/share`, the
//! `acpd share` command line), opening a session as a grantee (the role capped by the grant),
//! and a revocation reaching the live session, which cuts the grantee's clients off.

use acpd_protocol::method;
use serde_json::{Value, json};

use super::roles::Role;
use super::{HubCommand, SessionHandle, SessionHub};
use crate::error::AcpError;
use acpd_store::Store;

/// What `_acpd/session/share` (or `acpd share`) asks.
pub struct ShareRequest<'a> {
    pub session_id: &'a str,
    /// The grantee's principal name.
    pub with: &'a str,
    /// `None`: revoke.
    pub role: Option<Role>,
}

impl SessionHub {
    /// Opens a session `principal` does not own but was granted; the role is the grant's.
    /// No grant is reported exactly like a missing session.
    pub async fn open_shared(
        &self,
        id: &str,
        principal: &str,
    ) -> Result<(SessionHandle, Role), AcpError> {
        let store = &self.shared.store;
        let not_found = || AcpError::SessionNotFound(id.to_owned());
        let grant = store
            .live_grant(id, principal)
            .await?
            .ok_or_else(not_found)?;
        let role = Role::parse(&grant.role).ok_or_else(not_found)?;
        let row = store.session(id).await?.ok_or_else(not_found)?;
        // Any profile: the owner's agent runs the session whatever the grantee connected to.
        let handle = self.open(id, &row.principal_id, None).await?;
        Ok((handle, role))
    }

    /// Grants or revokes on a session `owner` owns; audited. A revocation cuts the grantee's
    /// clients off the live session at once (other daemons on the store notice it within
    /// their registry's grant poll).
    pub async fn share(&self, owner: &str, req: ShareRequest<'_>) -> Result<Value, AcpError> {
        let (answer, revoked) = share_in_store(&self.shared.store, Some(owner), req).await?;
        if let Some((session, grantee)) = revoked {
            self.grant_revoked(&session, &grantee).await;
        }
        Ok(answer)
    }

    /// `principal`'s grant on `session` was revoked: its clients there are cut off.
    pub async fn grant_revoked(&self, session: &str, principal: &str) {
        let cmd = HubCommand::GrantRevoked {
            session: session.to_owned(),
            principal: principal.to_owned(),
        };
        let _ = self.shared.hub.send(cmd).await;
    }
}

/// Grants or revokes in the store, audited: on a session `owner` owns (`None`: any session,
/// the administrator's `acpd share`; a grantee of it is refused -32010). Returns the answer and, for a revocation, the session
/// and grantee to cut off.
pub async fn share_in_store(
    store: &Store,
    owner: Option<&str>,
    req: ShareRequest<'_>,
) -> Result<(Value, Option<(String, String)>), AcpError> {
    let not_found = || AcpError::SessionNotFound(req.session_id.to_owned());
    let row = store.session(req.session_id).await?.ok_or_else(not_found)?;
    if let Some(o) = owner
        && row.principal_id != o
    {
        // A grantee knows the session exists, but a grant is not ownership; to anyone else
        // it stays exactly like a missing one.
        return Err(match store.live_grant(&row.id, o).await? {
            Some(_) => AcpError::NotOwner(method::ACPD_SESSION_SHARE.into()),
            None => not_found(),
        });
    }
    let owner = row.principal_id.as_str();
    let Some(grantee) = store.principal_by_name(req.with).await? else {
        return Err(AcpError::InvalidParams(format!(
            "no principal named {:?} (acpd token create --name NAME makes one)",
            req.with
        )));
    };
    if grantee.id == owner {
        return Err(AcpError::InvalidParams(
            "a session's owner needs no grant on it".into(),
        ));
    }
    match req.role {
        Some(role) => {
            store
                .grant(&row.id, &grantee.id, role.as_str(), owner)
                .await?;
            tracing::info!(target: "acpd::audit", session = %row.id, owner = %owner, grantee = %grantee.name, role = role.as_str(), "session shared");
            let answer =
                json!({ "sessionId": row.id, "with": grantee.name, "role": role.as_str() });
            Ok((answer, None))
        }
        None => {
            let revoked = store.revoke_grant(&row.id, &grantee.id).await?;
            tracing::info!(target: "acpd::audit", session = %row.id, owner = %owner, grantee = %grantee.name, revoked, "session share revoked");
            let answer = json!({ "sessionId": row.id, "with": grantee.name, "revoked": revoked });
            Ok((answer, Some((row.id, grantee.id))))
        }
    }
}

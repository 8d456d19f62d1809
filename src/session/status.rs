//! What a live session says of itself, read-only: a turn running, who is attached. The actor
//! publishes it on a `watch` (`SessionHandle::status`); the web console's sessions page reads
//! it for a page of sessions at once through the hub.

use std::collections::HashMap;

use serde_json::Value;
use tokio::sync::oneshot;

use super::{HubCommand, SessionHub};

/// A live session's status (presence's descriptions of the attached clients).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveStatus {
    pub running: bool,
    pub clients: Vec<Value>,
}

impl SessionHub {
    /// The status of those of `ids` that are live (sessions not live are absent).
    pub async fn status_of(&self, ids: &[String]) -> HashMap<String, LiveStatus> {
        let (reply, rx) = oneshot::channel();
        let cmd = HubCommand::Status {
            ids: ids.to_vec(),
            reply,
        };
        if self.shared.hub.send(cmd).await.is_err() {
            return HashMap::new();
        }
        rx.await.unwrap_or_default()
    }
}

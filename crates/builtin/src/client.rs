//! The client as one session of the built-in agent sees it: `session/update` notifications
//! out, and requests (permission, fs, terminal, client tools) that a cancel can withdraw.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use acpd_wire::{PeerError, PeerHandle, ResponseError};

/// What the client declared in `initialize`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientCaps {
    pub read_text_file: bool,
    pub write_text_file: bool,
    pub terminal: bool,
    /// `elicitation.form` (an object; `{}` counts, `null` does not): `ask_user` is offered.
    pub elicitation_form: bool,
}

impl ClientCaps {
    pub fn from_initialize(params: &Value) -> ClientCaps {
        let flag = |p: &str| {
            params
                .pointer(&format!("/clientCapabilities{p}"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        ClientCaps {
            read_text_file: flag("/fs/readTextFile"),
            write_text_file: flag("/fs/writeTextFile"),
            terminal: flag("/terminal"),
            elicitation_form: params
                .pointer("/clientCapabilities/elicitation/form")
                .is_some_and(Value::is_object),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cancelled")]
    Cancelled,
    #[error("{}", .0.message)]
    Remote(ResponseError),
    #[error("the client connection closed")]
    Disconnected,
}

/// One session's line to the client. Cheap to clone.
#[derive(Clone)]
pub struct ClientLink {
    peer: PeerHandle,
    session_id: Arc<str>,
}

impl ClientLink {
    pub fn new(peer: PeerHandle, session_id: Arc<str>) -> ClientLink {
        ClientLink { peer, session_id }
    }

    /// Sends one `session/update`. A closed link means acpd is stopping the agent; the turn
    /// notices through its cancellation, so the error is not worth a branch here.
    pub async fn update(&self, update: Value) {
        let params = json!({ "sessionId": &*self.session_id, "update": update });
        let _ = self.peer.notify(method::SESSION_UPDATE, Some(params)).await;
    }

    pub async fn notify(&self, method: &str, mut params: Value) {
        params["sessionId"] = json!(&*self.session_id);
        let _ = self.peer.notify(method, Some(params)).await;
    }

    /// A request about this session. When `cancel` fires first, the request is withdrawn
    /// (`$/cancel_request`) and `Cancelled` returned.
    pub async fn request(
        &self,
        method: &str,
        mut params: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, ClientError> {
        params["sessionId"] = json!(&*self.session_id);
        let pending = self
            .peer
            .start_request(method, Some(params))
            .await
            .map_err(|_| ClientError::Disconnected)?;
        tokio::select! {
            _ = cancel.cancelled() => Err(ClientError::Cancelled),
            r = pending.wait() => r.map_err(|e| match e {
                PeerError::Remote(r) => ClientError::Remote(r),
                PeerError::Disconnected => ClientError::Disconnected,
            }),
        }
    }
}

//! `GET /_acpd/peer`: the internal link a peer replica opens to forward a session this
//! replica owns (`cluster::link::dial` is the other end). Authenticated by the cluster
//! secret, not a token: the peer has checked its client's token already and names the
//! principal it acts for. What runs on it is an ordinary client connection of that principal,
//! so ordering, seq numbers and exactly-once delivery are this replica's own.

use axum::extract::State;
use axum::extract::ws::WebSocketUpgrade;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::{AppState, auth, connection_ctx};
use crate::acp::connection;
use crate::cluster::link::{
    PRINCIPAL_HEADER, PRINCIPAL_NAME_HEADER, PROFILE_HEADER, SECRET_HEADER,
};
use crate::transport;

/// Compares the digests, so the time taken says nothing about where the secrets differ.
fn same_secret(given: &str, ours: &str) -> bool {
    Sha256::digest(given.as_bytes()) == Sha256::digest(ours.as_bytes())
}

pub(super) async fn upgrade(
    State(st): State<AppState>,
    headers: HeaderMap,
    pass: Option<axum::Extension<crate::transport::listen::Pass>>,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(cluster) = &st.config.cluster else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if !header(SECRET_HEADER).is_some_and(|s| same_secret(s, &cluster.secret)) {
        tracing::warn!(target: "acpd::audit", "peer link refused: wrong cluster secret");
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let (Some(principal), Some(name)) = (header(PRINCIPAL_HEADER), header(PRINCIPAL_NAME_HEADER))
    else {
        return (StatusCode::BAD_REQUEST, "no principal named\n").into_response();
    };
    let identity = auth::Identity {
        principal: principal.to_owned(),
        name: name.to_owned(),
        token_id: None,
    };
    let Some(profile) = st.config.profile(header(PROFILE_HEADER)).map(str::to_owned) else {
        return (StatusCode::NOT_FOUND, "unknown agent profile\n").into_response();
    };
    let conn_id = format!("peer-{}", uuid::Uuid::new_v4());
    tracing::info!(%principal, conn = %conn_id, "peer link: a replica forwards a session here");
    let ctx = connection_ctx(&conn_id, identity, profile, &st.config, &st.hub);
    let kick = st.shutdown.child_token();
    let (tasks, shutdown) = (st.tasks.clone(), st.shutdown.clone());
    let (max, keepalive) = (st.config.limits.max_message_bytes, st.config.keepalive);
    ws.max_message_size(max.saturating_mul(4))
        .on_upgrade(move |socket| {
            tasks.track_future(async move {
                // The socket stays counted by the accept gate while the link is open.
                let _pass = pass;
                let (link, pump) =
                    transport::ws::pump(socket, max, keepalive, shutdown.child_token());
                let pump = tokio::spawn(pump);
                connection::run(link, ctx, kick).await;
                let _ = pump.await;
            })
        })
}

//! What the peer task does with each frame the link hands it: notifications by their
//! envelope alone, responses matched to our pending requests, requests registered so each gets
//! exactly one answer.

use tokio_util::sync::CancellationToken;

use super::{
    InFrame, Incoming, IncomingRequest, Malformed, Message, PeerError, PeerTask, RawNotification,
    Reply, RequestId, Responder, Response, ResponseError,
};

impl PeerTask {
    pub(super) fn on_in_frame(&mut self, frame: InFrame) {
        match frame {
            InFrame::Text(t) => self.on_frame(t),
            InFrame::NotUtf8 => self.write(Malformed::Parse("invalid UTF-8".into()).reply().into()),
            InFrame::TooLarge(n) => {
                let e = ResponseError::invalid_request(format!(
                    "message of {n} bytes is over the size limit"
                ));
                self.write(
                    Response {
                        id: RequestId::Null,
                        result: Err(e),
                    }
                    .into(),
                );
            }
        }
    }

    // long: one flat dispatch over what a frame can be (request, notification, response,
    // batch, garbage), each arm a few lines; split, the order of the checks would be lost.
    fn on_frame(&mut self, text: String) {
        tracing::trace!(frame = %text, "in");
        // The common case, a stream of notifications, is read by its envelope alone.
        let text = match RawNotification::read(text) {
            Ok(n) => {
                self.to_deliver.push_back(Incoming::Notification(n));
                return;
            }
            Err(text) => text,
        };
        let msg = match Message::parse(&text) {
            Ok(m) => m,
            Err(bad) => {
                if let Malformed::Parse(e) = &bad {
                    tracing::debug!(error = %e, "malformed frame");
                }
                self.write(bad.reply().into());
                return;
            }
        };
        match msg {
            Message::Response(r) => {
                let key = match &r.id {
                    RequestId::Number(n) => n.as_u64(),
                    RequestId::String(s) => s.parse().ok(),
                    RequestId::Null => None,
                };
                match key.and_then(|k| self.ours.remove(&k)) {
                    Some(Reply::Oneshot(tx)) => {
                        let _ = tx.send(r.result.map_err(PeerError::Remote));
                    }
                    Some(Reply::InBand { route, tag }) => {
                        self.to_deliver.push_back(Incoming::Response {
                            route,
                            tag,
                            result: Box::new(r.result),
                        });
                    }
                    Some(Reply::Forward(f)) => f.answer(r.result.map_err(PeerError::Remote)),
                    None => tracing::debug!(id = %r.id, "response to no pending request"),
                }
            }
            Message::Notification(n) if n.method == "$/cancel_request" => {
                let id = n
                    .params
                    .as_ref()
                    .and_then(|p| p.get("requestId"))
                    .and_then(RequestId::from_value);
                if let Some(token) = id.and_then(|id| self.theirs.get(&id)) {
                    token.cancel();
                }
            }
            Message::Notification(n) => self.to_deliver.push_back(Incoming::Notification(n.into())),
            Message::Request(r) => {
                if r.id == RequestId::Null || self.theirs.contains_key(&r.id) {
                    let why = if r.id == RequestId::Null {
                        "id must not be null"
                    } else {
                        "id is already in use"
                    };
                    self.write(
                        Response {
                            id: r.id,
                            result: Err(ResponseError::invalid_request(why)),
                        }
                        .into(),
                    );
                    return;
                }
                let cancelled = CancellationToken::new();
                self.theirs.insert(r.id.clone(), cancelled.clone());
                let responder = Responder {
                    id: Some(r.id),
                    tx: self.self_tx.clone(),
                    tasks: self.tasks.clone(),
                };
                self.to_deliver
                    .push_back(Incoming::Request(Box::new(IncomingRequest {
                        method: r.method,
                        params: r.params,
                        responder,
                        cancelled,
                    })));
            }
        }
    }
}

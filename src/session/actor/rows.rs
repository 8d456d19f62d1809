//! The session row: updates are merged and written one at a time by a task, in order, so the
//! actor never waits on the store for them; `session/close` and `session/delete` are written
//! after every update queued before them, and answered once written.

use serde_json::json;

use super::{Session, TaskDone};
use crate::error::AcpError;
use crate::session::now_ms;
use crate::session::outbox::Out;
use acpd_store::{SessionPatch, StoreError};
use acpd_wire::{Responder, ResponseError};

/// Row writes owed to the store.
#[derive(Default)]
pub(super) struct RowWrites {
    /// Updates not yet handed to a task, merged (later fields win).
    pending: Option<SessionPatch>,
    /// A write is running.
    busy: bool,
    /// The session ends: close (or delete, when `true`) once the updates are written.
    pub close: Option<(Responder, bool)>,
    /// The session's delete is written or being written: it is gone, not reopened.
    pub deleted: bool,
    /// Outbox items that go once the row updates queued before them are written (a prompt's
    /// answer: a client that sees it and lists the sessions sees the turn's title).
    /// Each with the last seq journaled when it was parked (a turn's answer vouches for the
    /// updates up to it).
    parked: Vec<(i64, Out)>,
}

impl RowWrites {
    /// Whether the session is closing (or deleting): commands are refused from then on.
    pub fn closing(&self) -> bool {
        self.close.is_some()
    }

    /// Whether nothing is owed to the store.
    pub fn is_idle(&self) -> bool {
        !self.busy && self.pending.is_none() && self.close.is_none() && self.parked.is_empty()
    }

    /// Whether an answer waits for row writes (the next queued turn waits behind it, so a
    /// client sees a turn's answer before the next turn's updates).
    pub fn answers_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Whether every row update queued so far is written.
    fn written(&self) -> bool {
        !self.busy && self.pending.is_none()
    }
}

/// What a row write task did.
pub(super) enum RowDone {
    Saved(Result<(), StoreError>),
    Closed {
        responder: Responder,
        result: Result<(), StoreError>,
    },
}

impl Session {
    pub(super) fn patch(&self) -> SessionPatch {
        SessionPatch {
            updated_at_ms: now_ms(),
            ..Default::default()
        }
    }

    /// Queues a row update; written after the ones before it.
    pub(super) fn save(&mut self, patch: SessionPatch) {
        match &mut self.rows.pending {
            Some(p) => merge(p, patch),
            None => self.rows.pending = Some(patch),
        }
        self.write_rows();
    }

    /// Queues `out` in the outbox once the row updates queued so far are written.
    pub(super) fn after_rows(&mut self, out: Out) {
        if self.rows.written() {
            self.outbox.push(out);
        } else {
            self.rows.parked.push((self.position.last(), out));
        }
    }

    fn release_parked(&mut self) {
        for (_, out) in std::mem::take(&mut self.rows.parked) {
            self.outbox.push(out);
        }
    }

    /// The journal stopped before `rejected`: a parked answer that vouches for it (a turn's
    /// end, parked behind the turn's row writes) answers `err` instead, like one queued behind
    /// a dropped update (`Outbox::discard_updates_after`).
    pub(super) fn fail_parked_after(&mut self, rejected: i64, err: &ResponseError) {
        for (upto, out) in &mut self.rows.parked {
            if let Out::Reply { result, .. } = out
                && *upto >= rejected
            {
                *result = Err(err.clone());
            }
        }
    }

    /// Starts the next row write, unless one is running.
    pub(super) fn write_rows(&mut self) {
        if self.rows.busy {
            return;
        }
        let (store, id) = (self.shared.store.clone(), self.id.clone());
        if let Some(patch) = self.rows.pending.take() {
            self.rows.busy = true;
            self.tasks.spawn(async move {
                TaskDone::Row(RowDone::Saved(store.update_session(&id, &patch).await))
            });
        } else if let Some((responder, delete)) = self.rows.close.take() {
            self.rows.busy = true;
            self.rows.deleted |= delete;
            let patch = SessionPatch {
                closed: Some(true),
                ..self.patch()
            };
            self.tasks.spawn(async move {
                let result = if delete {
                    store.delete_session(&id).await.map(|_| ())
                } else {
                    store.update_session(&id, &patch).await
                };
                TaskDone::Row(RowDone::Closed { responder, result })
            });
        }
    }

    pub(super) fn on_row_done(&mut self, done: RowDone) {
        self.rows.busy = false;
        match done {
            RowDone::Saved(Ok(())) => {}
            RowDone::Saved(Err(e)) => {
                tracing::error!(session = %self.id, error = %e, "cannot update the session row")
            }
            RowDone::Closed { responder, result } => {
                self.release_parked();
                let result = result
                    .map(|_| json!({}))
                    .map_err(|e| AcpError::from(e).into());
                self.outbox.push(Out::Reply { responder, result });
                self.ending = true;
                return;
            }
        }
        if self.rows.written() {
            self.release_parked();
        }
        self.write_rows();
    }

    /// At the actor's end (shutdown, idle): what is still owed, written inline.
    pub(super) async fn finish_rows(&mut self) {
        if let Some(patch) = self.rows.pending.take()
            && let Err(e) = self.shared.store.update_session(&self.id, &patch).await
        {
            tracing::error!(session = %self.id, error = %e, "cannot update the session row");
        }
        self.release_parked();
    }
}

/// `later` over `into`: every field `later` sets wins.
fn merge(into: &mut SessionPatch, later: SessionPatch) {
    macro_rules! take {
        ($($f:ident),*) => { $( if later.$f.is_some() { into.$f = later.$f; } )* };
    }
    take!(
        agent_session_id,
        cwd,
        additional_dirs,
        title,
        mode_id,
        config_values,
        meta,
        closed,
        owner_instance,
        lease_until_ms
    );
    into.updated_at_ms = into.updated_at_ms.max(later.updated_at_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_fields_win_and_unset_ones_keep_the_earlier_value() {
        let mut p = SessionPatch {
            title: Some(Some("a".into())),
            closed: Some(false),
            updated_at_ms: 5,
            ..Default::default()
        };
        merge(
            &mut p,
            SessionPatch {
                title: Some(None),
                cwd: Some("/w".into()),
                updated_at_ms: 3,
                ..Default::default()
            },
        );
        assert_eq!(p.title, Some(None));
        assert_eq!(p.closed, Some(false));
        assert_eq!(p.cwd.as_deref(), Some("/w"));
        assert_eq!(p.updated_at_ms, 5);
    }
}

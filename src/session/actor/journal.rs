//! The journal side of a session: appending `session/update`s (write-before-send), keeping
//! the session row in step with the updates that change it, and starting retention passes.

use acpd_protocol::method;
use std::sync::Arc;

use serde_json::{Value, json};

use super::splice::splice;
use super::{Inflight, Session, TaskDone};
use crate::error::AcpError;
use crate::session::outbox::{CATCH_UP_PAGE, CatchUp, Out};
use crate::session::{ConnId, now_ms};
use acpd_store::{AppendError, AppendRoom, JournalEntry, NewEntry, SessionPatch, StoreError};
use acpd_wire::{Notification, RawNotification, ResponseError};

impl Session {
    /// Journals one `session/update` acpd itself makes (the user's prompt blocks).
    pub(super) async fn journal(&mut self, params: Value, exclude: Option<ConnId>) {
        let n = RawNotification::from(Notification {
            method: method::SESSION_UPDATE.into(),
            params: Some(params),
        });
        self.journal_raw(&n, exclude).await;
    }

    /// Journals one `session/update` as the agent sent it and queues it for the attached
    /// clients. The update body is never parsed into a tree: the params' members, which the
    /// peer found as it read the frame, are spliced (`splice`) with `sessionId` and
    /// `_meta.acpd.seq` written in, and the same bytes go to the journal and to every client.
    pub(super) async fn journal_raw(&mut self, n: &RawNotification, exclude: Option<ConnId>) {
        if self.position.stopped() {
            // The journal stopped at a rejected entry (`journal_stopped`): nothing after it is
            // journaled or sent, and the session is ending.
            return;
        }
        let Some(spliced) = splice(n, &self.id, self.position.next_seq) else {
            tracing::warn!(session = %self.id, "agent sent a session/update whose params are not an object; dropped");
            return;
        };
        let seq = self.position.assign();
        let update = spliced.update_value();
        if let Some(update) = &update {
            self.observe(&spliced.kind, update);
        }
        let usage_update = (&*spliced.kind == "usage_update")
            .then_some(update)
            .flatten();
        let text: Arc<str> = spliced.text.into();
        let need = crate::session::capabilities::Need::of_update(&spliced.kind);
        // The whole text bounds what is stored of it (the journal form stores less).
        self.upkeep.journal.appended(text.len() as u64);
        let entry = NewEntry {
            session_id: self.id.clone(),
            seq,
            kind: spliced.kind,
            body: text.clone(),
            at_ms: self.position.burst_ms.unwrap_or_else(now_ms),
            epoch: self.position.epoch(),
        };
        // Never awaited: a store that takes no writes must not hold up cancel, the session's
        // other commands or the connection's other sessions. A full queue of a store that is
        // working (only slower than the agent) holds the entry here, in order, and the actor
        // takes no agent events until the store has room (`on_append_room`): the router then
        // slows the agent. A full queue of a stalled store (`writes_stalled`), or too much
        // held, stops the journal here (`stop_journal`): this update is neither journaled
        // nor sent.
        if self.position.holding() {
            if let Err(seq) = self.position.hold(entry) {
                tracing::error!(session = %self.id, seq, "the store takes no appends; stopping the session's journal");
                return self.stop_journal(seq);
            }
        } else {
            match self
                .shared
                .store
                .try_append(entry.clone(), self.position.durable.clone())
            {
                Ok(()) => {}
                Err(AppendError::Full) if !self.shared.store.writes_stalled() => {
                    // Nothing is held: the first always fits.
                    let _ = self.position.hold(entry);
                }
                Err(e) => {
                    tracing::error!(session = %self.id, seq, error = %e, "journal append refused (the store is stalled); stopping the session's journal");
                    return self.stop_journal(seq);
                }
            }
        }
        self.outbox.push(Out::Update {
            seq,
            text,
            exclude,
            need,
        });
        if let Some(update) = usage_update {
            // Boxed: a cold await in the update path (see `on_agent_event`).
            Box::pin(self.on_usage_update(&update)).await;
        }
    }

    /// The store has room again (`None`: it closed): the held entries go, in order.
    pub(super) fn on_append_room(&mut self, room: Option<AppendRoom>) {
        let Some(room) = room else {
            if let Some(seq) = self.position.first_held() {
                self.stop_journal(seq);
            }
            return;
        };
        let Some(first) = self.position.take_first() else {
            return;
        };
        let durable = self.position.durable.clone();
        room.append(first, durable.clone());
        let store = &self.shared.store;
        self.position
            .release_while(|e| store.try_append(e.clone(), durable.clone()).is_ok());
    }

    /// Entries are held for a full queue and the store's commits stalled meanwhile: the
    /// journal stops before them (a store outage, not a slow store).
    pub(super) fn check_store_stall(&mut self) {
        if let Some(seq) = self.position.stall_stop(self.shared.store.writes_stalled()) {
            tracing::error!(session = %self.id, seq, "the store stalled with appends held; stopping the session's journal");
            self.stop_journal(seq);
        }
    }

    /// The store is not taking the session's writes: the journal stops before `at` as if the
    /// store had rejected it (`flush` then drops what is not durable unsent, the running turn
    /// is cancelled at the agent and answered, and the session ends; it reopens from its
    /// journal). The writer drops the queued appends after `at` unwritten.
    pub(super) fn stop_journal(&mut self, at: i64) {
        self.position.stop(at);
    }

    /// `session/cancel` while the store is away: the turn's updates that are not durable would
    /// hold its answer until the store is back, so the journal stops at what is durable and
    /// the turn ends `cancelled` now.
    pub(super) fn cancel_in_outage(&mut self) {
        if let Some(at) = self
            .position
            .cancel_stop(self.shared.store.writes_stalled())
        {
            let durable = at - 1;
            tracing::warn!(session = %self.id, durable, "session/cancel while the store is away; stopping the session's journal at what is durable");
            self.stop_journal(at);
        }
    }

    /// Keeps the session row in step with updates that change it.
    pub(super) fn observe(&mut self, kind: &str, update: &Value) {
        let field = |k: &str| update.get(k);
        match kind {
            "session_info_update" => {
                if let Some(t) = field("title") {
                    let title = t.as_str().map(str::to_owned);
                    self.row.title = title.clone();
                    self.save(SessionPatch {
                        title: Some(title),
                        ..self.patch()
                    });
                }
            }
            "current_mode_update" => {
                if let Some(m) = field("currentModeId").and_then(Value::as_str) {
                    let meta = self.meta.update(|meta| {
                        if let Some(modes) = meta.get_mut("modes").filter(|m| m.is_object()) {
                            modes["currentModeId"] = json!(m);
                        }
                    });
                    let patch = SessionPatch {
                        mode_id: Some(Some(m.to_owned())),
                        meta: Some(meta),
                        ..self.patch()
                    };
                    self.save(patch);
                }
            }
            "config_option_update" => {
                if let Some(opts) = field("configOptions") {
                    let meta = self
                        .meta
                        .update(|meta| meta["configOptions"] = opts.clone());
                    self.save(SessionPatch {
                        meta: Some(meta),
                        ..self.patch()
                    });
                }
            }
            _ => {}
        }
    }

    pub(super) async fn flush(&mut self) {
        let mark = *self.position.durable_rx.borrow_and_update();
        if let Some(rejected) = mark.rejected {
            let err = if mark.fenced {
                moved_err(&self.id)
            } else if self.position.store_outage {
                AcpError::StoreOutage.into()
            } else if rejected == 0 {
                AcpError::SessionRowRefused.into()
            } else {
                AcpError::UpdateRejected(rejected).into()
            };
            // The updates after it will never be durable: they must never be sent.
            self.outbox.discard_updates_after(mark.durable, &err);
            self.fail_parked_after(rejected, &err);
            // Once: the session is ending from then on (a close may have got there first).
            // Boxed: cold, and `flush` is awaited inline on every pass of the actor's loop.
            if !self.ending {
                Box::pin(self.journal_stopped(mark.durable, rejected, err)).await;
            }
        }
        let durable = mark.durable;
        loop {
            let requests = self.outbox.flush(durable).await;
            if requests.is_empty() {
                break;
            }
            for id in requests {
                self.dispatch(id);
            }
        }
        self.read_lagging();
    }

    /// Starts a journal page read for each lagging client with room for one.
    fn read_lagging(&mut self) {
        for CatchUp { conn, after } in self.outbox.lagging(self.shared.settings.slow_client_cutoff)
        {
            let store = self.shared.store.clone();
            let id = self.id.clone();
            self.tasks.spawn(async move {
                let page = store.journal_after(&id, after, CATCH_UP_PAGE).await;
                TaskDone::CatchUp { conn, after, page }
            });
        }
    }

    /// The store rejected update `rejected`: the journal stops at `durable` for good. What the
    /// clients were sent is exactly the journal (`flush` drops the updates after it unsent, and
    /// turns that ended behind them answer `err`); the running turn is cancelled at the agent
    /// and answered with `err`, and the session ends, so the next request opens it again from
    /// its journal (with a fresh watermark).
    async fn journal_stopped(&mut self, durable: i64, rejected: i64, err: ResponseError) {
        if self.position.durable_rx.borrow().fenced {
            tracing::warn!(session = %self.id, seq = rejected, durable, "journal append fenced: another replica owns the session; letting it go");
        } else {
            tracing::error!(
                session = %self.id,
                seq = rejected,
                durable,
                "the store rejected a journal entry; ending the session"
            );
        }
        self.end_turns(err).await;
    }

    /// The lease was found lost (another replica took the session over): the running turn is
    /// cancelled at this replica's agent, what waits is answered, and the session ends here.
    /// Its appends from now on would be fenced anyway; this is the early notice.
    pub(super) async fn let_go(&mut self) {
        tracing::warn!(session = %self.id, "session lease lost; letting the session go");
        self.end_turns(moved_err(&self.id)).await;
    }

    /// Cancels the running turn at the agent, answers every in-band request with `err`, and
    /// ends the session.
    async fn end_turns(&mut self, err: ResponseError) {
        // A client that cancelled during a store outage gets what it asked for.
        let asked = self.position.store_outage && self.turn.cancel_requested;
        let turn = self
            .agent
            .inflight
            .values()
            .any(|f| matches!(f, Inflight::Prompt { .. }));
        if turn {
            self.cancel().await;
        }
        for (_, f) in self.agent.inflight.drain() {
            let result = match &f {
                Inflight::Prompt { .. } if asked => Ok(json!({ "stopReason": "cancelled" })),
                _ => Err(err.clone()),
            };
            if let Inflight::Prompt { responder } | Inflight::Relay { responder } = f {
                self.outbox.push(Out::Reply { responder, result });
            }
        }
        self.ending = true;
    }

    /// Starts a retention pass after a turn, unless one is running or no cap is set.
    pub(super) fn retention(&mut self) {
        let (entries, bytes) = (
            self.shared.settings.journal_max_entries,
            self.shared.settings.journal_max_bytes,
        );
        if entries == 0 && bytes == 0 {
            return;
        }
        // One pass at a time; a turn that ends during a pass gets another pass after it.
        self.upkeep.retention_wanted = true;
        if self.upkeep.journal.pass_running() {
            return;
        }
        self.upkeep.retention_wanted = false;
        if !self.upkeep.journal.needs_pass(entries, bytes) {
            return;
        }
        self.upkeep.journal.pass_started();
        metrics::counter!(crate::metrics::RETENTION_PASSES_TOTAL).increment(1);
        let (store, id) = (self.shared.store.clone(), self.id.clone());
        // Compact what the turns wrote once it is all committed.
        let (mut durable, upto) = (self.position.durable_rx.clone(), self.position.last());
        self.tasks.spawn(async move {
            let _ = durable.wait_for(|d| d.settled(upto)).await;
            TaskDone::Retention(crate::session::retention::enforce(store, id, entries, bytes).await)
        });
    }

    /// A retention pass ended: the estimate learns what it measured, a pass wanted meanwhile
    /// starts.
    pub(super) fn retention_done(
        &mut self,
        r: Result<crate::session::retention::Pass, StoreError>,
    ) {
        let measured = r.as_ref().ok().map(|(_, size)| *size);
        self.upkeep.journal.pass_ended(measured);
        if self.upkeep.retention_wanted {
            self.retention();
        }
        match r.map(|(outcome, _)| outcome) {
            Ok(Some(o)) => tracing::info!(
                session = %self.id,
                before = o.before,
                after = o.after,
                dropped_oldest = o.dropped_oldest,
                "journal compacted"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(session = %self.id, error = %e, "journal retention failed")
            }
        }
    }
}

/// What a turn or request of a session that moved to another replica is answered.
fn moved_err(id: &str) -> ResponseError {
    AcpError::Moved(id.to_owned()).into()
}

impl Session {
    /// A journal page for a lagging client arrived (see `outbox.rs`).
    pub(super) fn on_catch_up(
        &mut self,
        conn: ConnId,
        after: i64,
        page: Result<Vec<JournalEntry>, StoreError>,
    ) {
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                // Tried again at the next lag check.
                tracing::warn!(session = %self.id, error = %e, "cannot read the journal for a lagging client");
                self.outbox.caught_up(&conn, after, Vec::new(), false);
                return;
            }
        };
        let complete = (page.len() as i64) < CATCH_UP_PAGE;
        // The client's own prompt of the running turn was never echoed to it live; nor is it
        // now. Once the turn is over that filter is off: a load replays the whole history,
        // the user's prompts included.
        let running = self
            .agent
            .inflight
            .values()
            .any(|f| matches!(f, Inflight::Prompt { .. }));
        let own = running && self.turn.conn.as_ref() == Some(&conn);
        let from = self.turn.own_from;
        let page = page
            .into_iter()
            .filter(|e| !(own && e.seq >= from && &*e.kind == "user_message_chunk"))
            .collect();
        self.outbox.caught_up(&conn, after, page, complete);
        // The next page at once while this one is being written (the queue has room for it),
        // not at the next lag check: a load of many pages would otherwise wait a check
        // interval per page with nothing else to do.
        self.read_lagging();
    }
}

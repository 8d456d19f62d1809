//! Cancel acpd can guarantee. After `session/cancel` the turn's answer to the client is
//! `stopReason: "cancelled"` whatever the agent answers; if the agent has not answered within
//! `cancel_grace`, acpd answers it itself. The agent's late output of such a turn is kept out
//! of the next one: its updates are dropped, its requests (a permission) are answered
//! `cancelled` without asking a client, its late answer is dropped, and the session's
//! next prompt waits (at most `cancel_abandon`) for that late answer before it goes to the
//! agent. What acpd did is journaled as a `session_info_update` carrying only
//! `_meta.acpd.cancel` (a valid update that says nothing to a client that does not look).
//!
//! `CancelGuard` is the decision logic, pure (time is passed in); `impl Session` below wires
//! it to the actor.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Inflight, Session};
use crate::session::ConnId;
use acpd_wire::{Responder, ResponseError};

/// The cancel state of one session's turns, by the in-band tag of their `session/prompt`.
#[derive(Debug)]
pub(super) struct CancelGuard {
    grace: Duration,
    abandon: Duration,
    /// Turns cancelled at the agent and not answered yet, with the end of their grace.
    cancelling: Vec<(u64, Instant)>,
    /// Turns acpd answered itself, with the end of their abandon period: the agent's answer
    /// is dropped when it comes, and until then the session's updates are their late output.
    abandoned: Vec<(u64, Instant)>,
    /// Late updates dropped since the last abandoned turn began.
    dropped: u64,
}

/// What to do with the agent's answer to a `session/prompt`.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Not a cancelled turn: the answer goes to the client as it is.
    Pass,
    /// A cancelled turn the agent ended within the grace: the client is told `cancelled`.
    /// `agent_said` is the agent's own stop reason (`"error"` for an error) when it was not
    /// `cancelled`.
    Cancelled { agent_said: Option<String> },
    /// The late answer of a turn acpd answered already: dropped. `dropped_updates` is set
    /// when this was the last such turn (the count of late updates dropped for them).
    Late { dropped_updates: Option<u64> },
}

/// What a deadline brought.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Expired {
    /// Turns whose grace ran out: acpd answers them `cancelled` now.
    pub answer: Vec<u64>,
    /// Abandoned turns the agent never answered: their late output is no longer dropped.
    pub given_up: Vec<u64>,
    /// Set when no abandoned turn is left: late updates dropped for them.
    pub dropped_updates: Option<u64>,
}

impl CancelGuard {
    pub fn new(grace: Duration, abandon: Duration) -> CancelGuard {
        CancelGuard {
            grace,
            abandon,
            cancelling: Vec::new(),
            abandoned: Vec::new(),
            dropped: 0,
        }
    }

    /// `session/cancel` with these prompt turns running: each gets its grace (once).
    pub fn cancel(&mut self, running: impl IntoIterator<Item = u64>, now: Instant) {
        for tag in running {
            if !self.cancelling.iter().any(|(t, _)| *t == tag) {
                self.cancelling.push((tag, now + self.grace));
            }
        }
    }

    /// The agent answered prompt `tag`; `stop` is its stop reason (`None`: an error).
    pub fn answer(&mut self, tag: u64, stop: Option<&str>) -> Verdict {
        if let Some(i) = self.abandoned.iter().position(|(t, _)| *t == tag) {
            self.abandoned.remove(i);
            return Verdict::Late {
                dropped_updates: self.take_dropped(),
            };
        }
        if let Some(i) = self.cancelling.iter().position(|(t, _)| *t == tag) {
            self.cancelling.remove(i);
            let agent_said = match stop {
                Some("cancelled") => None,
                Some(other) => Some(other.to_owned()),
                None => Some("error".to_owned()),
            };
            return Verdict::Cancelled { agent_said };
        }
        Verdict::Pass
    }

    /// An update (or a request) from the agent: `true` when it is the late output of an
    /// abandoned turn (an update is dropped, a request answered `cancelled`).
    pub fn late_update(&mut self) -> bool {
        if self.abandoned.is_empty() {
            return false;
        }
        self.dropped += 1;
        true
    }

    /// Whether a new prompt must wait before it goes to the agent.
    pub fn holds_prompts(&self) -> bool {
        !self.abandoned.is_empty()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.cancelling
            .iter()
            .chain(&self.abandoned)
            .map(|(_, d)| *d)
            .min()
    }

    pub fn expire(&mut self, now: Instant) -> Expired {
        let mut out = Expired::default();
        let abandoned_before = !self.abandoned.is_empty();
        self.abandoned.retain(|(tag, until)| {
            let keep = *until > now;
            if !keep {
                out.given_up.push(*tag);
            }
            keep
        });
        if abandoned_before && self.abandoned.is_empty() {
            out.dropped_updates = self.take_dropped();
        }
        let abandon = self.abandon;
        self.cancelling.retain(|(tag, until)| {
            let keep = *until > now;
            if !keep {
                out.answer.push(*tag);
            }
            keep
        });
        for tag in &out.answer {
            self.abandoned.push((*tag, now + abandon));
        }
        out
    }

    /// The agent is gone (or the session closes): nothing more will come for these turns.
    pub fn reset(&mut self) {
        self.cancelling.clear();
        self.abandoned.clear();
        self.dropped = 0;
    }

    fn take_dropped(&mut self) -> Option<u64> {
        if !self.abandoned.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.dropped))
    }
}

/// A prompt held back while an abandoned turn may still stream.
pub(super) struct HeldPrompt {
    pub conn: ConnId,
    pub params: Value,
    pub responder: Responder,
}

fn cancelled() -> Result<Value, ResponseError> {
    Ok(json!({ "stopReason": "cancelled" }))
}

impl Session {
    /// The prompt turns running at the agent, by tag.
    pub(super) fn running_prompts(&self) -> Vec<u64> {
        self.agent.running_prompts()
    }

    /// `session/cancel`: every running turn gets its grace; held prompts never start.
    pub(super) fn guard_cancel(&mut self) {
        let running = self.running_prompts();
        self.turn.guard.cancel(running, Instant::now());
        for held in std::mem::take(&mut self.turn.held) {
            self.reply(held.responder, cancelled());
        }
    }

    /// The agent's answer to prompt `tag`, as the client must see it; `None`: dropped.
    pub(super) async fn judge_answer(
        &mut self,
        tag: u64,
        result: Result<Value, ResponseError>,
    ) -> Option<Result<Value, ResponseError>> {
        let stop = match &result {
            Ok(v) => Some(v.get("stopReason").and_then(Value::as_str).unwrap_or("")),
            Err(_) => None,
        };
        match self.turn.guard.answer(tag, stop) {
            Verdict::Pass => Some(result),
            Verdict::Cancelled { agent_said: None } => Some(cancelled()),
            Verdict::Cancelled {
                agent_said: Some(said),
            } => {
                tracing::info!(session = %self.id, agent_said = %said, "cancelled turn answered cancelled, not as the agent did");
                self.journal_cancel(json!({ "outcome": "rewritten", "agentStopReason": said }))
                    .await;
                Some(cancelled())
            }
            Verdict::Late { dropped_updates } => {
                tracing::info!(session = %self.id, ?dropped_updates, "late answer of a turn acpd ended dropped");
                let mut note = json!({ "outcome": "lateAnswerDropped", "agentStopReason": stop.unwrap_or("error") });
                if let Some(n) = dropped_updates {
                    note["droppedUpdates"] = json!(n);
                    self.release_held().await;
                }
                self.journal_cancel(note).await;
                None
            }
        }
    }

    /// A deadline of the guard passed: turns out of grace are answered `cancelled` by acpd;
    /// abandoned turns out of time release the prompts held behind them.
    pub(super) async fn cancel_deadline(&mut self) {
        let expired = self.turn.guard.expire(Instant::now());
        for tag in expired.answer {
            if let Some(Inflight::Prompt { responder }) = self.agent.answered(tag) {
                tracing::info!(session = %self.id, "the agent did not end a cancelled turn in time; answered cancelled");
                self.journal_cancel(json!({ "outcome": "graceExpired" }))
                    .await;
                self.end_turn(responder, cancelled());
            }
        }
        if let Some(n) = expired.dropped_updates {
            if !expired.given_up.is_empty() {
                tracing::warn!(session = %self.id, dropped = n, "the agent never answered a turn acpd ended; its output is no longer dropped");
                self.journal_cancel(json!({ "outcome": "abandoned", "droppedUpdates": n }))
                    .await;
            }
            self.release_held().await;
        }
    }

    /// Sends the prompts held behind an abandoned turn to the agent.
    async fn release_held(&mut self) {
        for held in std::mem::take(&mut self.turn.held) {
            self.turn.conn = Some(held.conn);
            self.send_prompt(held.params, held.responder).await;
        }
    }

    /// The agent will answer nothing more: held prompts are answered `answer`, the guard
    /// forgets.
    pub(super) fn guard_reset(&mut self, answer: Result<Value, ResponseError>) {
        self.turn.guard.reset();
        for held in std::mem::take(&mut self.turn.held) {
            self.reply(held.responder, answer.clone());
        }
        self.answer_queued(answer);
    }

    async fn journal_cancel(&mut self, what: Value) {
        let update = json!({
            "sessionId": &*self.id,
            "update": { "sessionUpdate": "session_info_update", "_meta": { "acpd": { "cancel": what } } },
        });
        self.journal(update, None).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Duration = Duration::from_secs(3);
    const A: Duration = Duration::from_secs(60);

    fn guard() -> (CancelGuard, Instant) {
        (CancelGuard::new(G, A), Instant::now())
    }

    #[test]
    fn an_answer_without_cancel_passes() {
        let (mut g, _) = guard();
        assert_eq!(g.answer(1, Some("end_turn")), Verdict::Pass);
        assert!(!g.late_update());
        assert_eq!(g.next_deadline(), None);
    }

    #[test]
    fn end_turn_after_cancel_is_cancelled_and_noted() {
        let (mut g, now) = guard();
        g.cancel([1], now);
        assert_eq!(g.next_deadline(), Some(now + G));
        assert_eq!(
            g.answer(1, Some("end_turn")),
            Verdict::Cancelled {
                agent_said: Some("end_turn".into())
            }
        );
        assert_eq!(g.next_deadline(), None);
        assert!(!g.holds_prompts());
    }

    #[test]
    fn cancelled_and_errors_after_cancel() {
        let (mut g, now) = guard();
        g.cancel([1, 2], now);
        assert_eq!(
            g.answer(1, Some("cancelled")),
            Verdict::Cancelled { agent_said: None }
        );
        assert_eq!(
            g.answer(2, None),
            Verdict::Cancelled {
                agent_said: Some("error".into())
            }
        );
    }

    #[test]
    fn a_second_cancel_does_not_extend_the_grace() {
        let (mut g, now) = guard();
        g.cancel([1], now);
        g.cancel([1], now + Duration::from_secs(2));
        assert_eq!(g.next_deadline(), Some(now + G));
    }

    #[test]
    fn grace_expiry_answers_then_drops_late_output_and_answer() {
        let (mut g, now) = guard();
        g.cancel([1], now);
        assert_eq!(g.expire(now + Duration::from_secs(1)), Expired::default());
        let e = g.expire(now + G);
        assert_eq!(e.answer, vec![1]);
        assert!(g.holds_prompts());
        assert_eq!(g.next_deadline(), Some(now + G + A));
        assert!(g.late_update());
        assert!(g.late_update());
        assert_eq!(
            g.answer(1, Some("end_turn")),
            Verdict::Late {
                dropped_updates: Some(2)
            }
        );
        assert!(!g.holds_prompts());
        assert!(!g.late_update(), "the next turn's output is kept");
        assert_eq!(g.answer(1, Some("end_turn")), Verdict::Pass);
    }

    #[test]
    fn an_agent_that_never_answers_is_given_up_after_the_abandon_period() {
        let (mut g, now) = guard();
        g.cancel([1], now);
        g.expire(now + G);
        assert!(g.late_update());
        let e = g.expire(now + G + A);
        assert_eq!(e.given_up, vec![1]);
        assert_eq!(e.dropped_updates, Some(1));
        assert!(!g.holds_prompts());
        assert!(!g.late_update());
        assert_eq!(g.next_deadline(), None);
    }

    #[test]
    fn late_count_is_reported_once_the_last_abandoned_turn_answers() {
        let (mut g, now) = guard();
        g.cancel([1, 2], now);
        g.expire(now + G);
        assert!(g.late_update());
        assert_eq!(
            g.answer(1, Some("end_turn")),
            Verdict::Late {
                dropped_updates: None
            }
        );
        assert!(g.holds_prompts());
        assert_eq!(
            g.answer(2, Some("cancelled")),
            Verdict::Late {
                dropped_updates: Some(1)
            }
        );
    }

    #[test]
    fn reset_forgets_everything() {
        let (mut g, now) = guard();
        g.cancel([1, 2], now);
        g.expire(now + G);
        g.reset();
        assert!(!g.holds_prompts());
        assert_eq!(g.next_deadline(), None);
        assert_eq!(g.answer(1, Some("end_turn")), Verdict::Pass);
    }
}

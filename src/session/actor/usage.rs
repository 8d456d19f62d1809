//! What the session's turns spend, and its budgets: the actor feeds `budget` and acts.
//!
//! Sources, per turn: the built-in agent's `_acpd/session/usage` after each model call (tokens,
//! live), `usage_update`'s `cost` (the session's running total, live), and the prompt answer's
//! `usage` (the turn's tokens, which replace the live count). When the turn ends its row goes
//! to the store (`turn_usage`): a turn with none of these is a turn of unknown usage. Each
//! live report adds to the `budget::Ledger` and is checked against the session's meters: a
//! threshold reached is announced once, a `stop` budget used up cancels the running turn, and
//! a prompt is refused while one is.
//!
//! A session whose budgets are a principal's or a profile's day or month watches the ledger
//! (a helper task awaiting `Ledger::watch`): when another session of its principal spends,
//! its meters are read again, so a `stop` budget crossed there cancels the turn running here
//! at once. Each time the readings change, the clients that declared `session.quota` get a
//! `quota_update` (the quotas RFD): live state, never journaled, so never replayed.

use chrono::Utc;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Session, TaskDone};
use crate::budget::{self, Meter, Spent, Status};
use crate::error::AcpError;
use crate::session::capabilities::Need;
use crate::session::outbox::Out;
use acpd_protocol::method;
use acpd_store::{StoreError, TurnUsageRow, UsageQuery};

/// Tokens a report names (a field it lacks is 0).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Tokens {
    input: u64,
    output: u64,
    cached: u64,
    thought: u64,
}

impl Tokens {
    /// ACP's `usage` (`inputTokens`, `outputTokens`, `cachedReadTokens`, `thoughtTokens`);
    /// `None` when it names none.
    fn read(v: &Value) -> Option<Tokens> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        let named = [
            "inputTokens",
            "outputTokens",
            "cachedReadTokens",
            "thoughtTokens",
        ]
        .iter()
        .any(|k| n(k).is_some());
        named.then(|| Tokens {
            input: n("inputTokens").unwrap_or(0),
            output: n("outputTokens").unwrap_or(0),
            cached: n("cachedReadTokens").unwrap_or(0) + n("cachedWriteTokens").unwrap_or(0),
            thought: n("thoughtTokens").unwrap_or(0),
        })
    }

    fn add(&mut self, o: Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cached += o.cached;
        self.thought += o.thought;
    }

    /// What budgets count: input, output and thought (cached reads are not spent again).
    fn counted(&self) -> u64 {
        self.input + self.output + self.thought
    }
}

/// The running turn's spending so far.
#[derive(Debug, Default)]
struct TurnTally {
    /// Live reports (`_acpd/session/usage`), summed.
    live: Option<Tokens>,
    /// The prompt answer's `usage`.
    answer: Option<Tokens>,
    /// Cost reported during the turn, in millionths, and its currency.
    cost: Option<(u64, String)>,
    /// What was added to the ledger (and the session's total) for this turn so far.
    counted: Spent,
}

impl TurnTally {
    fn tokens(&self) -> Option<Tokens> {
        self.answer.or(self.live)
    }
}

/// The session's accounting state.
#[derive(Default)]
pub(super) struct Accounting {
    /// The owner's name and the session's past spending have been read.
    loaded: bool,
    /// The owner's principal name (budgets and metrics name principals).
    owner: String,
    meters: Vec<Meter>,
    /// Everything the session spent, the running turn's live part included.
    session: Spent,
    turn: Option<TurnTally>,
    /// The last running total of cost the agent reported (ACP's `usage_update.cost`).
    last_cost: Option<f64>,
    /// The budget that cancelled the running turn (once per turn).
    stopped: bool,
    /// The pools of the last `quota_update` sent (an identical one is not sent again).
    quota_sent: Option<Value>,
    /// Ends the ledger watch (cancelled when the session's actor ends).
    watching: Option<CancellationToken>,
}

impl Drop for Accounting {
    fn drop(&mut self) {
        if let Some(end) = &self.watching {
            end.cancel();
        }
    }
}

/// What a helper task of the accounting brings back (`TaskDone::Usage`).
pub(super) enum Loaded {
    /// The owner's name and what the session spent before.
    Past {
        owner: Option<String>,
        spent: Result<Spent, StoreError>,
    },
    /// Spending was added to the ledger (by any session): the meters are read again.
    Moved(watch::Receiver<u64>),
    /// The watch ended with the session.
    Ended,
}

impl Accounting {
    pub fn ready(&self) -> bool {
        self.loaded
    }
}

/// Reads the owner's name and what the session spent before (a restart, an eviction).
pub(super) async fn load(
    store: acpd_store::Store,
    session: String,
    principal: String,
    currency: String,
) -> TaskDone {
    let owner = store
        .principal(&principal)
        .await
        .ok()
        .flatten()
        .map(|p| p.name);
    let q = UsageQuery {
        session_id: Some(session),
        ..UsageQuery::default()
    };
    let spent = store.usage_rollup(&q).await.map(|rows| {
        let mut s = Spent::default();
        for r in rows {
            s.add(budget::spent_of(&r, &currency));
        }
        s
    });
    TaskDone::Usage(Box::new(Loaded::Past { owner, spent }))
}

/// A snapshot's `updatedAt`: UTC, milliseconds (the RFD's advice).
fn updated_at(now: chrono::DateTime<Utc>) -> String {
    now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Waits for the ledger to move (or the session to end).
async fn ledger_moved(mut rx: watch::Receiver<u64>, end: CancellationToken) -> TaskDone {
    tokio::select! {
        r = rx.changed() => match r {
            Ok(()) => TaskDone::Usage(Box::new(Loaded::Moved(rx))),
            // The ledger lives as long as the daemon's sessions.
            Err(_) => TaskDone::Usage(Box::new(Loaded::Ended)),
        },
        () = end.cancelled() => TaskDone::Usage(Box::new(Loaded::Ended)),
    }
}

/// Fills the ledger with this month's spending from the store (at start: budgets survive a
/// restart).
pub(in crate::session) async fn load_ledger(shared: &crate::session::Shared) {
    let q = UsageQuery {
        since_day: Some(budget::month_start(Utc::now())),
        ..UsageQuery::default()
    };
    let currency = &shared.settings.budgets.currency;
    match shared.store.usage_rollup(&q).await {
        Ok(rows) => {
            for r in &rows {
                let spent = budget::spent_of(r, currency);
                shared
                    .ledger
                    .add(&r.principal_id, &r.profile, &r.day, spent);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this month's spending; budgets count from now")
        }
    }
}

impl Session {
    pub(super) fn usage_loaded(&mut self, loaded: Loaded) {
        let (owner, spent) = match loaded {
            Loaded::Past { owner, spent } => (owner, spent),
            Loaded::Moved(rx) => return self.ledger_moved(rx),
            Loaded::Ended => return,
        };
        let a = &mut self.usage;
        a.owner = owner.unwrap_or_else(|| self.row.principal_id.clone());
        match spent {
            Ok(s) => a.session.add(s),
            Err(e) => {
                tracing::warn!(session = %self.id, error = %e, "cannot read what the session spent before; counting from now")
            }
        }
        a.meters = self
            .shared
            .settings
            .budgets
            .meters(&a.owner, &self.row.agent);
        a.loaded = true;
        if budget::counts_others(&a.meters) {
            let end = CancellationToken::new();
            let rx = self.shared.ledger.watch();
            self.tasks.spawn(ledger_moved(rx, end.clone()));
            self.usage.watching = Some(end);
        }
    }

    /// Another session (or this one) spent: the meters are read again, the change announced,
    /// and a `stop` budget used up cancels the running turn, as this session's own spending
    /// would.
    fn ledger_moved(&mut self, rx: watch::Receiver<u64>) {
        if let Some(end) = self.usage.watching.clone() {
            self.tasks.spawn(ledger_moved(rx, end));
        }
        let now = Utc::now();
        let statuses = self.announce_thresholds(now);
        if let Some(s) = self.stop_due(&statuses, now) {
            tracing::warn!(target: "acpd::audit", session = %self.id, principal = %self.usage.owner, budget = %s, "budget used up by another session: cancelling the running turn");
            for question in self.cancel_turn() {
                // Answering never waits (`Pending::answer_cancelled`).
                self.shared.tasks.spawn(question.answer_cancelled());
            }
        }
    }

    /// A prompt is about to start: the error to refuse it with while a `stop` budget is used
    /// up; else the turn's count starts.
    pub(super) fn budget_refusal(&mut self) -> Option<AcpError> {
        let now = Utc::now();
        let statuses = self.budget_statuses(now);
        if let Some(s) = budget::gate(&statuses) {
            let e = self.exceeded(s, now);
            tracing::info!(target: "acpd::audit", session = %self.id, principal = %self.usage.owner, budget = %s.meter.name, "prompt refused: budget used up");
            return Some(e);
        }
        self.usage.turn = Some(TurnTally::default());
        self.usage.stopped = false;
        None
    }

    fn budget_statuses(&self, now: chrono::DateTime<Utc>) -> Vec<Status> {
        let a = &self.usage;
        let spend =
            self.shared
                .ledger
                .spend(&self.row.principal_id, &self.row.agent, a.session, now);
        budget::statuses(&a.meters, &spend)
    }

    /// `quota/read`: the session's budgets as the quotas RFD's snapshot (one pool, a meter
    /// per limit; no pool without budgets), live state.
    pub(super) fn quota_snapshot(&self) -> Value {
        let now = Utc::now();
        let currency = &self.shared.settings.budgets.currency;
        let statuses = self.budget_statuses(now);
        json!({
            "pools": budget::quota_pools(&statuses, currency, now),
            "updatedAt": updated_at(now),
        })
    }

    fn exceeded(&self, s: &Status, now: chrono::DateTime<Utc>) -> AcpError {
        let currency = &self.shared.settings.budgets.currency;
        let resets = budget::resets_at(s.meter.limit.window, now);
        let when = match resets {
            Some(t) => format!("it resets at {}", t.to_rfc3339()),
            None => "it lasts the session's life: start a new session".to_owned(),
        };
        AcpError::QuotaExceeded {
            budget: s.meter.name.clone(),
            message: format!(
                "budget {} ({}) is used up; {when}",
                s.meter.name,
                budget::describe_limit(&s.meter.limit, currency)
            ),
            meter: s.describe(currency, now),
        }
    }

    /// `_acpd/session/usage` from the agent (the built-in one, after each model call).
    pub(super) async fn on_usage_report(&mut self, params: &Value) {
        let Some(t) = params.get("usage").and_then(Tokens::read) else {
            return;
        };
        if let Some(turn) = &mut self.usage.turn {
            turn.live.get_or_insert_with(Tokens::default).add(t);
        }
        self.spend_live(Spent {
            tokens: t.counted(),
            cost_micros: 0,
        })
        .await;
    }

    /// A `usage_update` with a `cost`: the session's running total in a currency.
    pub(super) async fn on_usage_update(&mut self, update: &Value) {
        let Some(cost) = update.get("cost") else {
            return;
        };
        let (Some(amount), Some(currency)) = (
            cost.get("amount").and_then(Value::as_f64),
            cost.get("currency").and_then(Value::as_str),
        ) else {
            return;
        };
        // A total lower than the last is an agent that started counting again.
        let delta = match self.usage.last_cost {
            Some(last) if amount >= last => amount - last,
            _ => amount,
        };
        self.usage.last_cost = Some(amount);
        let micros = (delta * 1e6).round().max(0.0) as u64;
        if let Some(turn) = &mut self.usage.turn {
            let c = turn.cost.get_or_insert_with(|| (0, currency.to_owned()));
            c.0 += micros;
        }
        if currency == self.shared.settings.budgets.currency {
            let spent = Spent {
                tokens: 0,
                cost_micros: micros,
            };
            self.spend_live(spent).await;
        }
    }

    /// Counts `spent` now (ledger, session, turn) and checks the budgets.
    async fn spend_live(&mut self, spent: Spent) {
        let day = budget::day_of(Utc::now());
        let (principal, profile) = (&self.row.principal_id, &self.row.agent);
        self.shared.ledger.add(principal, profile, &day, spent);
        self.usage.session.add(spent);
        if let Some(turn) = &mut self.usage.turn {
            turn.counted.add(spent);
        }
        self.check_budgets().await;
    }

    /// The thresholds newly reached are announced; a `stop` budget used up cancels the
    /// running turn (once).
    async fn check_budgets(&mut self) {
        let now = Utc::now();
        let statuses = self.announce_thresholds(now);
        if let Some(s) = self.stop_due(&statuses, now) {
            tracing::warn!(target: "acpd::audit", session = %self.id, principal = %self.usage.owner, budget = %s, "budget used up: cancelling the running turn");
            self.cancel().await;
        }
    }

    /// Whether the running turn is to be cancelled now (a `stop` budget is used up, and it
    /// was not cancelled for one already): the clients are told why, the budget named.
    fn stop_due(&mut self, statuses: &[Status], now: chrono::DateTime<Utc>) -> Option<String> {
        if self.usage.turn.is_none() || self.usage.stopped {
            return None;
        }
        let s = budget::gate(statuses)?;
        self.usage.stopped = true;
        let e = self.exceeded(s, now);
        self.tell_clients(("stopped", 100), s, e.to_string(), now);
        Some(s.meter.name.clone())
    }

    /// The meters' readings; the thresholds newly reached are announced (and the gauges set),
    /// and a changed reading goes to the clients as a `quota_update`.
    fn announce_thresholds(&mut self, now: chrono::DateTime<Utc>) -> Vec<Status> {
        if self.usage.meters.is_empty() {
            return Vec::new();
        }
        let (statuses, crossed) = self.shared.ledger.check(
            &self.row.principal_id,
            &self.row.agent,
            (&self.id, self.usage.session),
            &self.usage.meters,
            now,
        );
        for s in &statuses {
            let (budget, principal) = (s.meter.name.clone(), self.usage.owner.clone());
            metrics::gauge!(crate::metrics::BUDGET_USED_PERCENT, "budget" => budget, "principal" => principal)
                .set(s.percent as f64);
        }
        for (status, threshold) in crossed {
            self.announce(&status, threshold, now);
        }
        self.send_quota(&statuses, now);
        statuses
    }

    /// `quota_update` (the session's budgets, as `quota/read` has them) to the clients that
    /// declared `session.quota`, when it differs from the last one sent: live state, pushed as
    /// a raw message, never journaled, so a `session/load` never replays it.
    fn send_quota(&mut self, statuses: &[Status], now: chrono::DateTime<Utc>) {
        if !self.outbox.clients().any(|c| Need::Quota.met_by(c.caps())) {
            return;
        }
        let currency = &self.shared.settings.budgets.currency;
        let pools = budget::quota_pools(statuses, currency, now);
        if self.usage.quota_sent.as_ref() == Some(&pools) {
            return;
        }
        self.usage.quota_sent = Some(pools.clone());
        let text = json!({ "jsonrpc": "2.0", "method": method::SESSION_UPDATE, "params": {
            "sessionId": &*self.id,
            "update": {
                "sessionUpdate": "quota_update",
                "updatedAt": updated_at(now),
                "pools": pools,
            },
        }});
        self.outbox.push(Out::Raw {
            text: text.to_string().into(),
            except: None,
            need: Some(Need::Quota),
        });
    }

    fn announce(&mut self, s: &Status, threshold: u8, now: chrono::DateTime<Utc>) {
        let currency = self.shared.settings.budgets.currency.clone();
        let limit = budget::describe_limit(&s.meter.limit, &currency);
        tracing::warn!(target: "acpd::audit", session = %self.id, principal = %self.usage.owner, budget = %s.meter.name, threshold, percent = s.percent, "budget threshold reached");
        let message = format!(
            "budget {} ({limit}): {threshold} % reached ({} % used)",
            s.meter.name, s.percent
        );
        self.tell_clients(("threshold", threshold), s, message, now);
    }

    /// `_acpd/session/budget` to every client: live, never journaled.
    fn tell_clients(
        &mut self,
        (event, threshold): (&str, u8),
        s: &Status,
        message: String,
        now: chrono::DateTime<Utc>,
    ) {
        let currency = &self.shared.settings.budgets.currency;
        let text = json!({ "jsonrpc": "2.0", "method": method::ACPD_SESSION_BUDGET, "params": {
            "sessionId": &*self.id,
            "event": event,
            "threshold": threshold,
            "message": message,
            "meter": s.describe(currency, now),
        }});
        self.outbox.push(Out::Raw {
            text: text.to_string().into(),
            except: None,
            need: None,
        });
    }

    /// The prompt answer's `usage`, before the answer is judged (a cancel rewrites it).
    pub(super) fn usage_answered(&mut self, result: &Result<Value, acpd_wire::ResponseError>) {
        let usage = result.as_ref().ok().and_then(|v| v.get("usage"));
        if let (Some(turn), Some(t)) = (&mut self.usage.turn, usage.and_then(Tokens::read)) {
            turn.answer = Some(t);
        }
    }

    /// The turn is over: what it spent beyond the live count is added, and its row written.
    pub(super) fn turn_spent(&mut self) {
        let Some(turn) = self.usage.turn.take() else {
            return;
        };
        let now = Utc::now();
        let day = budget::day_of(now);
        let tokens = turn.tokens();
        if let Some(t) = tokens {
            let rest = t.counted().saturating_sub(turn.counted.tokens);
            let spent = Spent {
                tokens: rest,
                cost_micros: 0,
            };
            let (principal, profile) = (&self.row.principal_id, &self.row.agent);
            self.shared.ledger.add(principal, profile, &day, spent);
            self.usage.session.add(spent);
        }
        self.count_metrics(tokens, &turn);
        self.announce_thresholds(now);
        let row = TurnUsageRow {
            session_id: self.id.to_string(),
            principal_id: self.row.principal_id.clone(),
            profile: self.row.agent.clone(),
            day,
            at_ms: now.timestamp_millis(),
            known: tokens.is_some() || turn.cost.is_some(),
            input_tokens: tokens.map(|t| t.input as i64),
            output_tokens: tokens.map(|t| t.output as i64),
            cached_tokens: tokens.map(|t| t.cached as i64),
            thought_tokens: tokens.map(|t| t.thought as i64),
            cost_micros: turn.cost.as_ref().map(|c| c.0 as i64),
            currency: turn.cost.map(|c| c.1),
        };
        // On the daemon's tracker, not the actor's set: a shutdown waits for it even when
        // the session ends first (an actor's end lets its own tasks go). A crash before it
        // commits loses this turn's record (docs/src/budgets.md).
        let store = self.shared.store.clone();
        self.shared.tasks.spawn(async move {
            if let Err(e) = store.record_turn_usage(&row).await {
                tracing::warn!(session = %row.session_id, error = %e, "cannot record what a turn spent");
            }
        });
    }

    fn count_metrics(&self, tokens: Option<Tokens>, turn: &TurnTally) {
        use crate::metrics::{USAGE_COST_MICROS_TOTAL, USAGE_TOKENS_TOTAL, USAGE_TURNS_TOTAL};
        let (principal, profile) = (self.usage.owner.clone(), self.row.agent.clone());
        let known = if tokens.is_some() || turn.cost.is_some() {
            "true"
        } else {
            "false"
        };
        metrics::counter!(USAGE_TURNS_TOTAL, "principal" => principal.clone(), "profile" => profile.clone(), "known" => known).increment(1);
        if let Some(t) = tokens {
            for (kind, n) in [
                ("input", t.input),
                ("output", t.output),
                ("cached", t.cached),
                ("thought", t.thought),
            ] {
                metrics::counter!(USAGE_TOKENS_TOTAL, "principal" => principal.clone(), "profile" => profile.clone(), "kind" => kind).increment(n);
            }
        }
        if let Some((micros, currency)) = &turn.cost {
            metrics::counter!(USAGE_COST_MICROS_TOTAL, "principal" => principal, "profile" => profile, "currency" => currency.clone()).increment(*micros);
        }
    }
}

//! Prometheus metrics: names, descriptions, and the recorder behind `GET /metrics`.
//!
//! Code records with the `metrics` macros using the names below; nothing else is needed.
//! `at_start` registers every series at zero (with `acpd_build_info`) when `serve` starts,
//! and `sample_process` keeps the `process_*` figures current.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const CONNECTIONS_LIVE: &str = "acpd_connections_live";
pub const CONNECTIONS_TOTAL: &str = "acpd_connections_total";
pub const CONNECTIONS_DETACHED: &str = "acpd_connections_detached";
pub const CONNECTIONS_REGISTERED: &str = "acpd_connections_registered";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "acpd_connections_refused_total";
pub const CONNECTIONS_EVICTED_TOTAL: &str = "acpd_connections_evicted_total";
pub const CONNECTIONS_PENDING: &str = "acpd_connections_pending";
pub const SESSIONS_LIVE: &str = "acpd_sessions_live";
pub const SESSIONS_DETACHED: &str = "acpd_sessions_detached";
pub const PROMPTS_TOTAL: &str = "acpd_prompts_total";
pub const RETENTION_PASSES_TOTAL: &str = "acpd_journal_retention_passes_total";
// The update path (ARCHITECTURE.md, "The path of one update"): where it gives way.
pub const CLIENTS_CATCHING_UP: &str = "acpd_clients_catching_up";
pub const CLIENT_CATCH_UPS_TOTAL: &str = "acpd_client_catch_ups_total";
pub const SESSIONS_BEHIND_AGENT: &str = "acpd_sessions_behind_agent";
pub const AGENT_OUTPUT_PAUSES_TOTAL: &str = "acpd_agent_output_pauses_total";
pub const SESSIONS_CUT_FROM_AGENT_TOTAL: &str = "acpd_sessions_cut_from_agent_total";
// The store records its own (it is a crate of its own); they are described here with the rest.
use acpd_store::metrics::{
    JOURNAL_APPEND_SECONDS, JOURNAL_BATCH_SIZE, JOURNAL_ENTRIES_TOTAL, STORE_ERRORS_TOTAL,
};
pub const AGENT_PROCESSES: &str = "acpd_agent_processes";
pub const AGENT_STARTS_TOTAL: &str = "acpd_agent_starts_total";
pub const AGENT_STDERR_DROPPED_BYTES_TOTAL: &str = "acpd_agent_stderr_dropped_bytes_total";
pub const AGENT_EXITS_TOTAL: &str = "acpd_agent_exits_total";
pub const AGENT_START_FAILURES_TOTAL: &str = "acpd_agent_start_failures_total";
pub const AGENT_CRASH_LOOPS_TOTAL: &str = "acpd_agent_backoffs_total";
pub const AGENT_BACKOFF_REFUSALS_TOTAL: &str = "acpd_agent_backoff_refusals_total";
pub const BYTES_IN_TOTAL: &str = "acpd_bytes_in_total";
pub const BYTES_OUT_TOTAL: &str = "acpd_bytes_out_total";
pub const LOG_WRITES_DROPPED_TOTAL: &str = "acpd_log_writes_dropped_total";
pub const BUILD_INFO: &str = "acpd_build_info";
// What turns spend (`session/actor/usage.rs`), by principal and profile.
pub const USAGE_TURNS_TOTAL: &str = "acpd_usage_turns_total";
pub const USAGE_TOKENS_TOTAL: &str = "acpd_usage_tokens_total";
pub const USAGE_COST_MICROS_TOTAL: &str = "acpd_usage_cost_micros_total";
pub const BUDGET_USED_PERCENT: &str = "acpd_budget_used_percent";
/// How often the `process_*` gauges are read from `/proc`: well under a scrape interval.
const PROCESS_SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once) and returns the handle that renders it.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
                ])
                .ok()?
                .set_buckets_for_metric(
                    Matcher::Full(JOURNAL_BATCH_SIZE.to_owned()),
                    &[
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
                        4096.0,
                    ],
                )
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
                return None;
            }
            describe();
            Some(handle)
        })
        .as_ref()
}

// long: a declarative list, one description per metric.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(CONNECTIONS_LIVE, "Client connections with an open socket");
    describe_counter!(CONNECTIONS_TOTAL, "Client connections accepted");
    describe_counter!(
        USAGE_TURNS_TOTAL,
        "Prompt turns ended, by principal, profile and whether the agent reported usage"
    );
    describe_counter!(
        USAGE_TOKENS_TOTAL,
        "Tokens turns spent as their agents reported them, by principal, profile and kind"
    );
    describe_counter!(
        USAGE_COST_MICROS_TOTAL,
        "Cost turns spent as their agents reported it, in millionths of the currency"
    );
    describe_gauge!(
        BUDGET_USED_PERCENT,
        "How much of a budget a principal used, in percent (at the last turn that spent)"
    );
    describe_gauge!(
        CONNECTIONS_DETACHED,
        "Resumable links waiting for their client to reconnect"
    );
    describe_gauge!(
        CONNECTIONS_REGISTERED,
        "Connections counted against the connection limits"
    );
    describe_counter!(CONNECTIONS_REFUSED_TOTAL, "Connections refused by a limit");
    describe_counter!(
        CONNECTIONS_EVICTED_TOTAL,
        "Pending (unauthenticated) connections closed to make room for a new one"
    );
    describe_gauge!(
        CONNECTIONS_PENDING,
        "Accepted connections not yet authenticated, all listeners"
    );
    describe_gauge!(SESSIONS_LIVE, "Sessions with a live actor");
    describe_gauge!(SESSIONS_DETACHED, "Live sessions with no client attached");
    describe_counter!(
        PROMPTS_TOTAL,
        "Prompt turns ended, by stop reason (error: the turn failed)"
    );
    describe_counter!(
        RETENTION_PASSES_TOTAL,
        "Journal retention passes started (a session's journal measured, and cut if over a cap)"
    );
    describe_gauge!(
        CLIENTS_CATCHING_UP,
        "Attached clients fed from the journal rather than live (a replay, or a client behind)"
    );
    describe_counter!(
        CLIENT_CATCH_UPS_TOTAL,
        "Times a client started to be fed from the journal, by cause (attach: a load, resume \
         or attach replays it; behind: its connection's queue filled)"
    );
    describe_gauge!(
        SESSIONS_BEHIND_AGENT,
        "Sessions so far behind their agent's output that the agent's stdout is not read"
    );
    describe_counter!(
        AGENT_OUTPUT_PAUSES_TOTAL,
        "Times a session fell so far behind that its agent's output was paused"
    );
    describe_counter!(
        SESSIONS_CUT_FROM_AGENT_TOTAL,
        "Sessions detached from their agent for taking nothing while it waited"
    );
    describe_histogram!(JOURNAL_APPEND_SECONDS, "Time to commit one journal batch");
    describe_histogram!(JOURNAL_BATCH_SIZE, "Journal entries per committed batch");
    describe_counter!(JOURNAL_ENTRIES_TOTAL, "Journal entries committed");
    describe_counter!(
        STORE_ERRORS_TOTAL,
        "Failed store operations (retried or reported)"
    );
    describe_gauge!(AGENT_PROCESSES, "Hosted agent processes running");
    describe_counter!(
        AGENT_STARTS_TOTAL,
        "Agent processes started (restarts included)"
    );
    describe_counter!(AGENT_EXITS_TOTAL, "Agent processes that ended");
    describe_counter!(
        AGENT_STDERR_DROPPED_BYTES_TOTAL,
        "Bytes of over-long agent stderr lines discarded instead of logged"
    );
    describe_counter!(
        AGENT_START_FAILURES_TOTAL,
        "Agent starts that failed (spawn or initialize)"
    );
    describe_counter!(
        AGENT_CRASH_LOOPS_TOTAL,
        "Times an agent's next start was put off (crash-loop backoff)"
    );
    describe_counter!(
        AGENT_BACKOFF_REFUSALS_TOTAL,
        "Requests refused because their agent was backing off"
    );
    describe_counter!(BYTES_IN_TOTAL, "Bytes received from clients");
    describe_counter!(BYTES_OUT_TOTAL, "Bytes sent to clients");
    describe_counter!(
        LOG_WRITES_DROPPED_TOTAL,
        "Log lines lost because stderr could not be written (its reader gone)"
    );
}

/// Registers every series at zero, so `/metrics` shows it (and a rate or an alert on it has a
/// baseline) before its first event: a store error or a failed agent start is exactly what
/// should not appear only once it happens. Gauges are moved by 0, never set, in case
/// something already counted. Also `acpd_build_info{version}` at 1.
pub fn at_start() {
    use metrics::{counter, gauge, histogram};
    install();
    for name in [
        CONNECTIONS_TOTAL,
        CONNECTIONS_REFUSED_TOTAL,
        CONNECTIONS_EVICTED_TOTAL,
        RETENTION_PASSES_TOTAL,
        AGENT_OUTPUT_PAUSES_TOTAL,
        SESSIONS_CUT_FROM_AGENT_TOTAL,
        JOURNAL_ENTRIES_TOTAL,
        STORE_ERRORS_TOTAL,
        AGENT_STARTS_TOTAL,
        AGENT_EXITS_TOTAL,
        AGENT_START_FAILURES_TOTAL,
        AGENT_CRASH_LOOPS_TOTAL,
        AGENT_BACKOFF_REFUSALS_TOTAL,
        BYTES_IN_TOTAL,
        BYTES_OUT_TOTAL,
        LOG_WRITES_DROPPED_TOTAL,
        AGENT_STDERR_DROPPED_BYTES_TOTAL,
    ] {
        counter!(name).increment(0);
    }
    for reason in STOP_REASON_LABELS {
        counter!(PROMPTS_TOTAL, "stop_reason" => reason).increment(0);
    }
    for cause in ["attach", "behind"] {
        counter!(CLIENT_CATCH_UPS_TOTAL, "cause" => cause).increment(0);
    }
    for name in [
        CONNECTIONS_LIVE,
        CONNECTIONS_DETACHED,
        CONNECTIONS_REGISTERED,
        CONNECTIONS_PENDING,
        SESSIONS_LIVE,
        SESSIONS_DETACHED,
        CLIENTS_CATCHING_UP,
        SESSIONS_BEHIND_AGENT,
        AGENT_PROCESSES,
    ] {
        gauge!(name).increment(0.0);
    }
    // Registered with no sample: rendered with zero counts.
    let _ = histogram!(JOURNAL_APPEND_SECONDS);
    let _ = histogram!(JOURNAL_BATCH_SIZE);
    metrics::describe_gauge!(BUILD_INFO, "Always 1; the version of the running acpd");
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Reads the process figures (`process_resident_memory_bytes`, `process_open_fds`,
/// `process_cpu_seconds_total`, `process_start_time_seconds`, …) now, so the first scrape
/// has them, and returns the task that reads them again every few seconds.
pub fn sample_process() -> impl std::future::Future<Output = ()> + Send + 'static {
    let collector = metrics_process::Collector::default();
    collector.describe();
    collector.collect();
    async move {
        let start = tokio::time::Instant::now() + PROCESS_SAMPLE_EVERY;
        let mut tick = tokio::time::interval_at(start, PROCESS_SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            collector.collect();
        }
    }
}

/// Every `stop_reason` label `stop_reason_label` gives.
const STOP_REASON_LABELS: [&str; 7] = [
    "end_turn",
    "max_tokens",
    "max_turn_requests",
    "refusal",
    "cancelled",
    "error",
    "other",
];

/// The `stop_reason` label of `PROMPTS_TOTAL`: the spec's stop reasons, `error` for a failed
/// turn and `other` for anything else an agent sends, so an agent cannot grow the label set.
pub fn stop_reason_label(
    result: &Result<serde_json::Value, acpd_wire::ResponseError>,
) -> &'static str {
    match result {
        Err(_) => "error",
        Ok(v) => match v.get("stopReason").and_then(serde_json::Value::as_str) {
            Some("end_turn") => "end_turn",
            Some("max_tokens") => "max_tokens",
            Some("max_turn_requests") => "max_turn_requests",
            Some("refusal") => "refusal",
            Some("cancelled") => "cancelled",
            _ => "other",
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn stop_reasons_outside_the_spec_share_one_label() {
        let label = |v| super::stop_reason_label(&Ok(v));
        assert_eq!(label(json!({ "stopReason": "end_turn" })), "end_turn");
        assert_eq!(label(json!({ "stopReason": "refusal" })), "refusal");
        assert_eq!(
            label(json!({ "stopReason": "made up by an agent" })),
            "other"
        );
        assert_eq!(label(json!({})), "other");
        let err = acpd_wire::ResponseError::internal("x");
        assert_eq!(super::stop_reason_label(&Err(err)), "error");
    }

    #[test]
    fn every_stop_reason_label_is_registered_at_start() {
        let reasons = [
            "end_turn",
            "max_tokens",
            "max_turn_requests",
            "refusal",
            "cancelled",
            "not in the spec",
        ];
        for r in reasons {
            let label = super::stop_reason_label(&Ok(json!({ "stopReason": r })));
            assert!(super::STOP_REASON_LABELS.contains(&label), "{label}");
        }
        let err = Err(acpd_wire::ResponseError::internal("x"));
        assert!(super::STOP_REASON_LABELS.contains(&super::stop_reason_label(&err)));
    }
}

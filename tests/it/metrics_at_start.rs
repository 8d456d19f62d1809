//! `/metrics` on a daemon nobody has used yet: every metric the README lists is there at
//! zero (a dashboard or an alert on a rate sees a series from the start, not after the first
//! failure), with `acpd_build_info` and the process metrics.

use crate::logging::metric;
use crate::operations::http_get;
use crate::support::Daemon;

/// The counters and gauges README's metrics section names, as unlabelled series.
const AT_ZERO: &[&str] = &[
    "acpd_connections_live",
    "acpd_connections_total",
    "acpd_sessions_live",
    "acpd_sessions_detached",
    "acpd_journal_entries_total",
    "acpd_store_errors_total",
    "acpd_agent_processes",
    "acpd_agent_starts_total",
    "acpd_agent_exits_total",
    "acpd_agent_start_failures_total",
    "acpd_agent_backoffs_total",
    "acpd_agent_backoff_refusals_total",
    "acpd_bytes_in_total",
    "acpd_bytes_out_total",
    "acpd_journal_retention_passes_total",
    "acpd_clients_catching_up",
    "acpd_sessions_behind_agent",
    "acpd_agent_output_pauses_total",
    "acpd_sessions_cut_from_agent_total",
    "acpd_log_writes_dropped_total",
    "acpd_agent_stderr_dropped_bytes_total",
    "acpd_connections_evicted_total",
];

#[tokio::test]
async fn a_fresh_daemon_lists_every_metric_at_zero() {
    let daemon = Daemon::start().await;
    let (status, metrics) = http_get(daemon.addr, "/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    for name in AT_ZERO {
        assert_eq!(metric(&metrics, name), 0.0, "{name} on a fresh daemon");
    }
    // The scrape's own connection is pending (not authenticated) while it is answered.
    assert!(metric(&metrics, "acpd_connections_pending") >= 1.0);
    for series in [
        "acpd_prompts_total{stop_reason=\"end_turn\"} 0",
        "acpd_prompts_total{stop_reason=\"error\"} 0",
        "acpd_client_catch_ups_total{cause=\"attach\"} 0",
        "acpd_client_catch_ups_total{cause=\"behind\"} 0",
        "acpd_journal_commit_seconds_count 0",
        "acpd_journal_batch_size_count 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == series),
            "{series} missing:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn metrics_carry_build_info_and_process_figures() {
    let daemon = Daemon::start().await;
    let (_, metrics) = http_get(daemon.addr, "/metrics").await;
    let build = format!(
        "acpd_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        metrics.lines().any(|l| l == build),
        "{build} missing:\n{metrics}"
    );
    assert!(metric(&metrics, "process_resident_memory_bytes") > 1e6);
    assert!(metric(&metrics, "process_open_fds") >= 3.0);
    // A counter of whole seconds (the `metrics` crate's counters are integers): present.
    assert!(metric(&metrics, "process_cpu_seconds_total") >= 0.0);
    let started = metric(&metrics, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 120.0..=now + 1.0).contains(&started),
        "process_start_time_seconds {started}, now {now}"
    );
}

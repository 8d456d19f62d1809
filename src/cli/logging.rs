//! acpd's log: tracing on stderr, text (coloured only at a terminal) or JSON, through a
//! writer that loses a line rather than fail when stderr is gone.
//!
//! A log write never fails the daemon: the writer drops a line stderr refuses (a reader gone)
//! and counts it in `acpd_log_writes_dropped_total`; nothing on the serving path uses
//! `eprintln!`, which panics on a closed pipe (tests/it
//! `logging::a_closed_log_reader_costs_log_lines_not_the_daemon`).

use super::LogFormat;

/// Sets up the global subscriber: `format` on stderr, `ACPD_LOG`/`RUST_LOG` else `default`.
pub(super) fn init(format: LogFormat, default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ACPD_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for a person at a terminal, not in a file or a log collector.
        .with_ansi(std::io::stderr().is_terminal())
        // The subscriber reports its own write errors with `eprintln!`, which panics on a
        // closed pipe; `LossyStderr` never returns one, and this keeps it quiet regardless.
        .log_internal_errors(false)
        .with_writer(|| LossyStderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// stderr for the log, where a failed write (`acpd serve 2>&1 | head -3`, once `head` is
/// gone) loses that line and is counted, and is never an error: a log line is not worth a
/// worker, and a panic there once left the drain unstarted and SIGTERM ignored.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // One event arrives as one buffer: written whole, or dropped whole.
        if std::io::stderr().lock().write_all(buf).is_err() {
            metrics::counter!(crate::metrics::LOG_WRITES_DROPPED_TOTAL).increment(1);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

//! Names of the metrics the store records; the daemon's recorder describes and serves them.

pub const JOURNAL_APPEND_SECONDS: &str = "acpd_journal_commit_seconds";
pub const JOURNAL_BATCH_SIZE: &str = "acpd_journal_batch_size";
pub const JOURNAL_ENTRIES_TOTAL: &str = "acpd_journal_entries_total";
pub const STORE_ERRORS_TOTAL: &str = "acpd_store_errors_total";

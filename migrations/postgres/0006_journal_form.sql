-- acpd schema v6 (Postgres). Kept line-for-line parallel with ../sqlite/0006_journal_form.sql.

-- Journal format 3: a session/update's body may be stored without what its row's columns
-- already hold (its session id and seq, inside a fixed head and tail); every read puts them
-- back (crates/store/src/form.rs, src/session/journal_form.rs). Rows written before are read
-- as they are. A build that knows format 2 only refuses this database instead of sending
-- shortened bodies.
UPDATE meta SET value = '3' WHERE key = 'journal_format';

-- acpd schema v5 (SQLite). Kept line-for-line parallel with ../postgres/0005_journal_packs.sql.

-- A journal row holds a run of entries (crates/store/src/pack.rs): n_entries consecutive seqs
-- from seq on, of one kind and one at_ms, their bodies joined by a newline. Rows written before
-- hold one entry each, which is what the default says. Journal format 2: a row's body is no
-- longer always one entry's.
ALTER TABLE journal ADD COLUMN n_entries INTEGER NOT NULL DEFAULT 1;
UPDATE meta SET value = '2' WHERE key = 'journal_format';

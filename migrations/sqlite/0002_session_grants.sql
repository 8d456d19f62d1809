-- acpd schema v2 (SQLite). Kept line-for-line parallel with ../postgres/0002_session_grants.sql.

-- Shared sessions: the principals a session's owner let attach (`acpd share`). A revoked
-- grant keeps its row with revoked_at_ms set (the audit trail; daemons poll it to cut the
-- grantee's clients off); granting again clears it.
CREATE TABLE session_grants (
    session_id    TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    principal_id  TEXT NOT NULL,
    role          TEXT NOT NULL,
    granted_by    TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    revoked_at_ms BIGINT,
    PRIMARY KEY (session_id, principal_id)
);
-- The daemons' poll: grants revoked since the last look.
CREATE INDEX session_grants_revoked ON session_grants (revoked_at_ms)
    WHERE revoked_at_ms IS NOT NULL;

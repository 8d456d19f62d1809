-- acpd schema v3 (SQLite). Kept line-for-line parallel with ../postgres/0003_web_sessions.sql.

-- The web console's sign-in. Only SHA-256 hashes of the secrets are stored, like tokens.
-- A one-time code printed by `acpd web-login`: exchanged once (the row is deleted by the
-- exchange), and only before it expires.
CREATE TABLE web_logins (
    hash          TEXT PRIMARY KEY,
    principal_id  TEXT NOT NULL REFERENCES principals (id),
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
-- A browser's cookie credential, bound to a principal and, when it was made from a pasted
-- token, to that token: revoking the token ends it. Sign-out deletes the row.
CREATE TABLE web_sessions (
    hash          TEXT PRIMARY KEY,
    principal_id  TEXT NOT NULL REFERENCES principals (id),
    token_id      TEXT REFERENCES tokens (id),
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
-- Revoking a token: its web sessions go.
CREATE INDEX web_sessions_by_token ON web_sessions (token_id);
CREATE INDEX web_sessions_by_principal ON web_sessions (principal_id);

-- acpd schema v1 (Postgres). Kept line-for-line parallel with ../sqlite/0001_init.sql:
-- TEXT ids, BIGINT epoch milliseconds, JSON stored as TEXT.

-- Disk-format versions that are not schema versions (e.g. how journal bodies are encoded).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO meta (key, value) VALUES ('journal_format', '1');

CREATE TABLE principals (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE tokens (
    id            TEXT PRIMARY KEY,
    principal_id  TEXT NOT NULL REFERENCES principals (id),
    name          TEXT NOT NULL,
    hash          TEXT NOT NULL UNIQUE,
    created_at_ms BIGINT NOT NULL,
    last_used_ms  BIGINT,
    revoked       BOOLEAN NOT NULL DEFAULT FALSE
);

-- Rows are never removed: a deleted session keeps its row with deleted_at_ms set, so its id
-- is never reused. principal_id is deliberately not a foreign key: the session layer may
-- run without auth under a principal that has no row.
CREATE TABLE sessions (
    id               TEXT PRIMARY KEY,
    principal_id     TEXT NOT NULL,
    agent            TEXT NOT NULL,
    agent_session_id TEXT,
    cwd              TEXT NOT NULL,
    additional_dirs  TEXT NOT NULL,
    title            TEXT,
    mode_id          TEXT,
    config_values    TEXT NOT NULL,
    meta             TEXT NOT NULL,
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL,
    closed           BOOLEAN NOT NULL DEFAULT FALSE,
    last_seq         BIGINT NOT NULL DEFAULT 0,
    owner_instance   TEXT,
    lease_until_ms   BIGINT,
    deleted_at_ms    BIGINT
);
-- session/list: one principal's live sessions, newest first, keyset-paginated.
CREATE INDEX sessions_by_principal ON sessions (principal_id, created_at_ms DESC, id DESC)
    WHERE deleted_at_ms IS NULL;
CREATE INDEX sessions_by_principal_cwd ON sessions (principal_id, cwd, created_at_ms DESC, id DESC)
    WHERE deleted_at_ms IS NULL;

-- body is the exact JSON text that was sent, byte for byte.
CREATE TABLE journal (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    at_ms      BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE agent_state (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);

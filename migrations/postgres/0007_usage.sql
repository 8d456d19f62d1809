-- acpd schema v7 (Postgres). Kept line-for-line parallel with ../sqlite/0007_usage.sql.

-- What every prompt turn spent, one row per turn, written when the turn ends. Tokens and
-- cost are NULL where the agent reported none: a turn with `known = FALSE` is a turn of
-- unknown usage, never a turn that spent nothing. `day` is the UTC date (YYYY-MM-DD) the
-- turn ended on; rollups per session, principal, profile and day are sums over these rows.
-- A deleted session's turns stay: they were spent.
CREATE TABLE turn_usage (
    id            BIGSERIAL PRIMARY KEY,
    session_id    TEXT NOT NULL,
    principal_id  TEXT NOT NULL,
    profile       TEXT NOT NULL,
    day           TEXT NOT NULL,
    at_ms         BIGINT NOT NULL,
    known         BOOLEAN NOT NULL,
    input_tokens  BIGINT,
    output_tokens BIGINT,
    cached_tokens BIGINT,
    thought_tokens BIGINT,
    -- Millionths of the currency's unit.
    cost_micros   BIGINT,
    currency      TEXT
);
CREATE INDEX turn_usage_by_session ON turn_usage (session_id);
CREATE INDEX turn_usage_by_day ON turn_usage (day, principal_id);

-- Every answer to an agent's permission request: which option, by whom (a client's
-- description, JSON), or automatically (a profile's `approve` preset, acpd itself).
CREATE TABLE permission_decisions (
    id            BIGSERIAL PRIMARY KEY,
    session_id    TEXT NOT NULL,
    at_ms         BIGINT NOT NULL,
    tool_call_id  TEXT,
    title         TEXT,
    tool_kind     TEXT,
    option_id     TEXT,
    option_kind   TEXT,
    outcome       TEXT NOT NULL,
    decided_by    TEXT,
    automatic     BOOLEAN NOT NULL
);
CREATE INDEX permission_decisions_by_session ON permission_decisions (session_id, at_ms);

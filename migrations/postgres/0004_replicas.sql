-- acpd schema v4 (Postgres). Kept line-for-line parallel with ../sqlite/0004_replicas.sql.

-- Several replicas on one store (Postgres; SQLite stays single-replica). A live session is
-- owned by one replica through its lease: owner_instance, lease_until_ms (both from v1,
-- unused until now) and lease_epoch, raised by every acquisition. A journal append carries
-- the epoch its writer holds and is refused in its own transaction when the row's differs
-- (fencing), so a replica that lost the lease cannot write, even one that was only paused.
ALTER TABLE sessions ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
-- A replica renews and, draining, gives back the leases it holds.
CREATE INDEX sessions_by_owner ON sessions (owner_instance) WHERE owner_instance IS NOT NULL;

-- The replicas serving this store: where their peers reach them, and their last heartbeat.
CREATE TABLE replicas (
    id            TEXT PRIMARY KEY,
    advertise_url TEXT,
    started_at_ms BIGINT NOT NULL,
    heartbeat_ms  BIGINT NOT NULL
);

-- delayq's SQLite schema (version 1). Applied in one BEGIN IMMEDIATE transaction by
-- the first connection that finds it missing; every statement is idempotent.
--
-- One row per message. Stored states are 'scheduled', 'active' and 'dead' (READY is
-- a scheduled row whose due_at has passed). Times are epoch milliseconds.

CREATE TABLE IF NOT EXISTS delayq_messages (
    queue        TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    encoding     TEXT    NOT NULL,
    due_at       INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('scheduled', 'active', 'dead')),
    headers      TEXT,              -- JSON object, NULL when empty
    last_error   TEXT,
    lease        TEXT,              -- set only while active
    lease_until  INTEGER,           -- set only while active
    PRIMARY KEY (queue, id)
);

-- The claim index: due messages of a queue, earliest due first, then put order.
-- Partial, so active and dead rows never slow a claim down.
CREATE INDEX IF NOT EXISTS delayq_messages_due
    ON delayq_messages (queue, due_at, seq) WHERE state = 'scheduled';

-- Leases by expiry: the claim settles expired ones with one index range scan.
CREATE INDEX IF NOT EXISTS delayq_messages_lease
    ON delayq_messages (queue, lease_until) WHERE state = 'active';

-- Dead letters in the order they died.
CREATE INDEX IF NOT EXISTS delayq_messages_dead
    ON delayq_messages (queue, seq) WHERE state = 'dead';

-- 'seq': the last sequence number given (shared by every queue of the file, so it
-- increases across processes); 'schema': the schema version.
CREATE TABLE IF NOT EXISTS delayq_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

INSERT OR IGNORE INTO delayq_meta (key, value) VALUES ('seq', 0), ('schema', 1);

"""delayq's PostgreSQL schema, as the steps that build it version by version.

A schema (``?schema=``, ``delayq`` by default) holds one queue store: the table of
messages, the sequence that orders them, the functions of the claim and of the
wake-up, the sleeping consumers (``waiters``), and ``meta``, whose ``schema`` row
says which steps are applied. The first
backend object to find it missing or older than :data:`VERSION` applies the missing
steps in one transaction, under a transaction-scoped advisory lock on the schema's
name, so processes that start together wait for the first and then find the work
done (``CREATE ... IF NOT EXISTS`` alone still races on the catalogs).
"""

from __future__ import annotations

from collections.abc import Callable

from . import statements

__all__ = ["HAS_META", "LOCK", "MIGRATIONS", "VERSION", "VERSION_OF", "migrations_after"]


def _version_1(s: str) -> list[str]:
    """The table, its indexes, the sequence and ``meta``."""
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        # One row per message. Stored states are 'scheduled', 'active' and 'dead' (READY
        # is a scheduled row whose due_at has passed). Times are epoch milliseconds.
        f"""
CREATE TABLE IF NOT EXISTS {s}.messages (
    queue        text     NOT NULL,
    id           text     NOT NULL,
    payload      bytea    NOT NULL,
    encoding     text     NOT NULL,
    due_at       bigint   NOT NULL,
    seq          bigint   NOT NULL,
    attempts     integer  NOT NULL DEFAULT 0,
    max_attempts integer  NOT NULL,
    state        text     NOT NULL CHECK (state IN ('scheduled', 'active', 'dead')),
    headers      text,
    last_error   text,
    lease        text,
    lease_until  bigint,
    PRIMARY KEY (queue, id)
)""",
        # The claim index: a queue's waiting messages by (due_at, seq). Partial, so
        # active and dead rows never lengthen a claim's scan.
        f"""CREATE INDEX IF NOT EXISTS messages_due ON {s}.messages (queue, due_at, seq)
WHERE state = 'scheduled'""",
        # Leases by expiry: a claim settles the expired ones with one range scan.
        f"""CREATE INDEX IF NOT EXISTS messages_lease ON {s}.messages (queue, lease_until)
WHERE state = 'active'""",
        # Dead letters in the order they died.
        f"""CREATE INDEX IF NOT EXISTS messages_dead ON {s}.messages (queue, seq)
WHERE state = 'dead'""",
        # seq: one sequence for every queue of the schema, so it increases across
        # processes without a counter row that every put would have to lock.
        f"CREATE SEQUENCE IF NOT EXISTS {s}.seq AS bigint",
        f"CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value bigint NOT NULL)",
    ]


def _version_2(s: str) -> list[str]:
    """The claim and wake-up functions (as this code defines them, but for ``wake``,
    which is the lookup of ``wake_sleepers`` until version 6; version 3 defines them
    again); autovacuum settings for a queue's churn.

    Every message is inserted, updated once or twice and deleted within minutes, so
    the table is mostly dead tuples between vacuums: with PostgreSQL's defaults (a
    vacuum after 20% of the table changed) a queue of 10,000 waiting messages churning
    1,000 a second grows its table and its partial indexes for minutes between
    vacuums, and every claim walks the dead index entries. Vacuum after 1% (or 1,000
    rows) instead, without the cost delay that makes it lag behind; analyze often so
    the planner keeps the claim on its index.
    """
    return [
        statements.wake_sleepers_function(s, name="wake"),
        statements.claim_function(s),
        f"""ALTER TABLE {s}.messages SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
)""",
    ]


def _version_3(s: str) -> list[str]:
    """Waiters register how long they sleep, so that a put notifies only when someone
    sleeps past its message (``statements.wake_function``): ``waiters``, the conditional
    ``wake``, the unconditional ``announce`` and the claim that registers (as this
    code defines it; version 4 defines it again).

    ``waiters`` is UNLOGGED: registering writes no WAL, so a consumer going to sleep
    never waits for a disk flush. A crash empties it, which only means that the
    consumers, reconnecting, register again (their listener wakes them all when it
    LISTENs again).
    """
    return [
        f"""
CREATE UNLOGGED TABLE IF NOT EXISTS {s}.waiters (
    queue  text   NOT NULL,
    waiter text   NOT NULL,
    until  bigint NOT NULL,
    PRIMARY KEY (queue, waiter)
)""",
        f"DROP FUNCTION IF EXISTS {s}.claim(text, integer, bigint, text)",
        statements.announce_function(s),
        statements.wake_sleepers_function(s, name="wake"),
        statements.claim_function(s),
    ]


def _version_4(s: str) -> list[str]:
    """Backend objects reuse their waiter tokens (``statements.claim_function``): a
    claim that finds messages marks its row awake instead of deleting it, and a sleep
    updates it in place. Half-empty pages give each row room for those updates next to
    it (HOT: no new index entry per sleep)."""
    return [
        f"ALTER TABLE {s}.waiters SET (fillfactor = 50)",
        statements.claim_function(s),
    ]


def _version_5(s: str) -> list[str]:
    """A message's state is checked by its type, the domain ``message_state``, instead
    of a CHECK constraint of the table: the same three values, but a table's CHECK is
    read back from its stored text and planned again by every statement that writes a
    row (a put, a claim, a nack...), about an eighth of a put's server work, while a
    domain's check is planned once per session. Changing the column's type rewrites
    the table and its indexes once, under an exclusive lock: the upgrade of a large
    queue takes that long. The claim, which returns the state as text, is defined
    again (its RETURN QUERY casts it: plpgsql wants the declared type exactly)."""
    return [
        f"""CREATE DOMAIN {s}.message_state AS text
CHECK (VALUE IN ('scheduled', 'active', 'dead'))""",
        f"""ALTER TABLE {s}.messages
    DROP CONSTRAINT IF EXISTS messages_state_check,
    ALTER COLUMN state TYPE {s}.message_state""",
        statements.claim_function(s),
    ]


def _version_6(s: str) -> list[str]:
    """A put looks at ``waiters`` only when someone may sleep past it: the sequence
    ``sleep_hint`` (``statements.hint``), which a consumer going to sleep raises to
    its ``until``, and ``wake`` as one inlined expression over it, its lookup moved to
    ``wake_sleepers`` (``statements.wake_function``). The sequence is UNLOGGED where
    the server allows (PostgreSQL 15 and later): raising it writes no WAL, so a
    consumer going to sleep still never waits for a flush; a crash resets it with
    ``waiters``. Before 15 it is logged, and a consumer's sleep costs a flush.

    ``queue`` and ``id`` compare bytewise (``COLLATE "C"``): a put's primary-key
    probe and insert compare its key with a dozen others, by the database's collation
    until now (``strcoll`` for anything but C); nothing orders by them but the
    primary key itself. The change rebuilds the table's indexes once, under an
    exclusive lock. The hint starts at the latest ``until`` of the consumers that
    registered before the upgrade."""
    return [
        f"""DO $$ BEGIN
    IF current_setting('server_version_num')::integer >= 150000 THEN
        EXECUTE 'CREATE UNLOGGED SEQUENCE IF NOT EXISTS {statements.hint(s)} AS bigint MINVALUE 0';
    ELSE
        EXECUTE 'CREATE SEQUENCE IF NOT EXISTS {statements.hint(s)} AS bigint MINVALUE 0';
    END IF;
END $$""",
        f'ALTER TABLE {s}.messages ALTER COLUMN queue TYPE text COLLATE "C", '
        'ALTER COLUMN id TYPE text COLLATE "C"',
        f'ALTER TABLE {s}.waiters ALTER COLUMN queue TYPE text COLLATE "C"',
        # Consumers asleep through the upgrade registered without the hint.
        f"SELECT setval('{statements.hint(s)}', max(until)) FROM {s}.waiters "
        "HAVING max(until) IS NOT NULL",
        statements.wake_sleepers_function(s),
        statements.wake_function(s),
        statements.claim_function(s),
    ]


def _version_7(s: str) -> list[str]:
    """Less server work per put (issue 19): every index of the table is opened and
    every partial index's predicate planned and checked by each statement that writes
    a row, and a put touches all of them.

    ``state`` is an enum, ``message_state`` (the domain of version 5 renamed and
    dropped): its literals are read once, when a statement is planned, so a row's
    state is checked by nothing per row, and compared as a number. A cast from text
    on assignment keeps the statements that set it from a text expression (a
    ``CASE`` of literals) as they are. The active and dead rows share one partial
    index, ``messages_held`` ``(queue, lease_until, seq) WHERE state <> 'scheduled'``,
    in place of ``messages_lease`` and ``messages_dead``: a dead row's ``lease_until``
    is NULL, so the range scans of expired leases skip them, and the dead listing
    reads the queue's held rows by ``seq``. ``wake`` and the functions that take the
    queue's advisory lock are defined again (its key is ``hashtextextended`` of the
    queue name with a seed of the schema's, :func:`statements.queue_lock`). The change
    of type rewrites the table and its indexes once, under an exclusive lock."""
    return [
        f"ALTER DOMAIN {s}.message_state RENAME TO message_state_text",
        f"CREATE TYPE {s}.message_state AS ENUM ('scheduled', 'active', 'dead')",
        f"CREATE CAST (text AS {s}.message_state) WITH INOUT AS ASSIGNMENT",
        # Built again below over the enum (a rebuild from their text would compare
        # the state as text).
        f"DROP INDEX {s}.messages_due, {s}.messages_lease, {s}.messages_dead",
        f"ALTER TABLE {s}.messages ALTER COLUMN state TYPE {s}.message_state "
        f"USING state::text::{s}.message_state",
        f"DROP DOMAIN {s}.message_state_text",
        f"""CREATE INDEX messages_due ON {s}.messages (queue, due_at, seq)
WHERE state = 'scheduled'""",
        f"""CREATE INDEX messages_held ON {s}.messages (queue, lease_until, seq)
WHERE state <> 'scheduled'""",
        statements.wake_sleepers_function(s),
        statements.wake_function(s),
        statements.claim_function(s),
    ]


def _version_8(s: str) -> list[str]:
    """A claim commits without waiting for a WAL flush (``statements.claim_function``,
    ``statements.CLAIM_COMMIT``): a consumer's lateness no longer holds the disk's
    commit time twice per batch (its claim, then its ack), only once (its ack). Lost
    in a crash, a claim is only undone: its messages are delivered again, as
    at-least-once delivery allows; everything else stays a synchronous commit."""
    return [statements.claim_function(s)]


def _version_9(s: str) -> list[str]:
    """A claim no longer waits for an expired lease's row that another transaction
    holds locked: it settles the others and names the held one as an event soon
    (``statements.SETTLE_RETRY_MS``)."""
    return [statements.claim_function(s)]


#: The steps, in order: ``MIGRATIONS[i]`` takes a schema from version ``i`` to ``i + 1``.
MIGRATIONS: list[Callable[[str], list[str]]] = [
    _version_1,
    _version_2,
    _version_3,
    _version_4,
    _version_5,
    _version_6,
    _version_7,
    _version_8,
    _version_9,
]
#: The version this code writes and reads.
VERSION = len(MIGRATIONS)

#: Whether ``meta`` exists in schema ``%(schema)s``, as an answer rather than the error
#: a query of a missing table is. Read from the catalog tables, not by name lookup
#: (``to_regclass``): a lookup may answer from the session's cache, which still says
#: "missing" after the advisory lock was waited for, while another process created the
#: schema and committed; then the steps would run again, and a step that cannot be
#: repeated (``CREATE DOMAIN``) fails.
HAS_META = """SELECT EXISTS (
    SELECT FROM pg_catalog.pg_tables WHERE schemaname = %(schema)s AND tablename = 'meta')"""
#: The version a schema is at, once ``meta`` exists (no row: 0).
VERSION_OF = "SELECT coalesce((SELECT value FROM {s}.meta WHERE key = 'schema'), 0)"

#: Taken in the upgrading transaction; released when it ends.
LOCK = "SELECT pg_advisory_xact_lock(hashtext(%(name)s))"


def migrations_after(s: str, version: int) -> list[str]:
    """The statements that take schema ``s`` from ``version`` to :data:`VERSION`, the
    version row written last."""
    steps = [sql for step in MIGRATIONS[version:] for sql in step(s)]
    steps.append(
        f"INSERT INTO {s}.meta (key, value) VALUES ('schema', {VERSION}) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    )
    return steps

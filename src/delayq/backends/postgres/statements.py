"""The SQL of the PostgreSQL backend: each state change mirrors a pure transition of
:mod:`delayq.durable.message` and is named after it.

Conventions:

* every statement reads the server's clock once, ``clock_timestamp()`` in the
  materialized ``now`` CTE (:data:`NOW`; the put of one message, which needs only
  one of the two, reads it inline), as its floor ``f`` and ceiling ``c`` in epoch
  ms (:class:`~delayq.durable.message.Now`): checks (``due_at <= f``,
  ``lease_until > f``) and "due now" use ``f``; a time computed as now plus a positive
  duration starts from ``c`` (:func:`due`, the lease expiry), so nothing is early;
* a row is *in flight* when ``state = 'active' AND lease_until > f``; an active row
  whose lease has expired is, logically, already settled
  (:func:`~delayq.durable.message.settle`): scheduled again due at ``lease_until``, or
  dead once ``attempts >= max_attempts``. The claim function settles a queue's expired
  leases before it claims; every other statement spells the settled state out inline;
* the literal ``state = '...'`` terms imply the partial indexes' predicates
  (``_schema.py``);
* a statement that makes a message due (put, nack, release, reschedule, retry_dead)
  calls ``wake(queue, due)`` once with the earliest due time it wrote: a
  ``pg_notify``, which waiting consumers of other processes hear, only when a consumer
  registered in ``waiters`` sleeps past ``due``, looked up only when the schema's
  ``sleep_hint`` says one may (see :func:`wake_function` and
  :mod:`delayq.backends.postgres._wakeup` for why no wake-up is lost);
* ``{s}`` is the quoted schema name.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "CLAIM_COMMIT",
    "CLAIM_PICK",
    "SETTLE_RETRY_MS",
    "WAITER_STALE_MS",
    "Prepared",
    "Statements",
    "announce_function",
    "channel",
    "claim_function",
    "due",
    "hint",
    "put_kind",
    "wake_function",
    "wake_sleepers_function",
]

#: The server's clock, read once per statement (a CTE with a volatile function is
#: evaluated once): ``f`` the floor, ``c`` the ceiling, in epoch ms.
NOW = """now AS MATERIALIZED (
    SELECT floor(ms)::bigint AS f, ceil(ms)::bigint AS c
    FROM (SELECT extract(epoch FROM clock_timestamp()) * 1000 AS ms) AS clock
)"""

#: The server's clock read on its own, in epoch ms: its floor and its ceiling (a
#: statement that needs only one of them, once: the put of one message). In float8
#: (``date_part``), not numeric (``extract``), a quarter of the numeric's work: the
#: product is within half a microsecond of the exact time, a whole number of
#: microseconds, so its floor and ceiling are exact but perhaps at a whole ms, where
#: the floor could come out 1 ms low and the ceiling 1 ms high: never later, never
#: earlier than the clock.
_MS = "date_part('epoch', clock_timestamp()) * 1000"
_FLOOR = f"floor({_MS})::bigint"
_CEIL = f"ceil({_MS})::bigint"

#: The record's columns, in :class:`~delayq.durable.message.Record` field order.
COLUMNS = (
    "m.id, m.payload, m.encoding, m.due_at, m.seq, m.attempts, m.max_attempts, m.state, "
    "m.headers, m.last_error, m.lease, m.lease_until"
)

_EXPIRED = "m.state = 'active' AND m.lease_until <= now.f"
_EXPIRED_BACK = f"{_EXPIRED} AND m.attempts < m.max_attempts"
_EXPIRED_DEAD = f"{_EXPIRED} AND m.attempts >= m.max_attempts"

#: What a claim takes (apply_reserve's candidates): the earliest due of a queue, by
#: (due_at, seq), rows another claim holds skipped. The partial index messages_due
#: serves it (tests/backends/test_postgres.py checks the plan). ``{q}``, ``{f}`` and
#: ``{n}`` are the queue, the floor and the limit: the claim function's variables.
#: The expired leases a claim settles first (:func:`claim_function`): those of the
#: queue another transaction does not hold locked. ``{s}``, ``{q}``, ``{f}`` as in
#: :data:`CLAIM_PICK`.
CLAIM_EXPIRED = """
SELECT e.id FROM {s}.messages AS e
WHERE e.queue = {q} AND e.state = 'active' AND e.lease_until <= {f}
FOR UPDATE SKIP LOCKED"""

#: How soon a claim that left an expired lease unsettled, because another transaction
#: held its row, names as the queue's next event (ms): a consumer looks again then,
#: rather than at once (a spin) or only when its sleep ends.
SETTLE_RETRY_MS = 50

CLAIM_PICK = """
SELECT d.id FROM {s}.messages AS d
WHERE d.queue = {q} AND d.state = 'scheduled' AND d.due_at <= {f}
ORDER BY d.due_at, d.seq
LIMIT {n}
FOR UPDATE SKIP LOCKED"""


#: The first statement of the claim function: its transaction alone commits without
#: waiting for a WAL flush (see :func:`claim_function`). ``set_config(..., true)`` is
#: ``SET LOCAL``: it lasts to the end of the transaction, past the function's return
#: (a function's ``SET`` clause would be undone at its return, before the commit).
CLAIM_COMMIT = "PERFORM set_config('synchronous_commit', 'off', true);"


def put_kind(delay_ms: int | None, at_ms: int | None) -> str:
    """Which statement of ``Statements.PUT_ONE`` resolves a put's due time: ``"at"``
    (an absolute time), ``"delay"`` (a positive delay) or ``"now"``, as
    resolve_due() decides."""
    if at_ms is not None:
        return "at"
    if delay_ms is not None and delay_ms > 0:
        return "delay"
    return "now"


def channel(schema: str) -> str:
    """The NOTIFY channel of a schema's wake-ups (an identifier: the schema name is
    one, checked by the URL parser)."""
    return f"delayq_{schema}"


def due(delay: str, at: str | None) -> str:
    """resolve_due() in SQL, over the ``now`` CTE: ``at`` (an absolute time) or
    ``delay`` from the ceiling, never before the floor; neither (NULL, or a delay <=
    0) is the floor."""
    at_case = "" if at is None else f"WHEN {at} IS NOT NULL THEN greatest({at}, now.f) "
    return f"(CASE {at_case}WHEN {delay} > 0 THEN greatest(now.c + {delay}, now.f) ELSE now.f END)"


#: How long after its sleep ended a row of ``waiters`` is dropped, ms: a backend object
#: reuses its tokens, so a row ended that long ago belongs to one that is gone (or
#: idle; it inserts its row again when it next sleeps).
WAITER_STALE_MS = 600_000


def _queue_lock(s: str, q: str) -> str:
    """The advisory lock key of queue ``q`` (an SQL expression) of schema ``s``: the
    name hashed with a seed of the schema's (63 bits of a hash of its name), rather
    than a prefix concatenated to it at every call."""
    digest = hashlib.blake2b(f"delayq:{s}".encode(), digest_size=8).digest()
    seed = int.from_bytes(digest, "big") >> 1
    return f"hashtextextended({q}, {seed})"


def _hint_lock(s: str) -> str:
    """The advisory lock key under which schema ``s``'s :func:`hint` is raised."""
    return f"hashtextextended('delayq:{s}:sleep_hint', 0)"


def announce_function(s: str) -> str:
    """``announce(queue, due)``: notify waiting consumers that ``queue`` has something
    due at ``due`` (epoch ms, or NULL: nothing, no notification), unconditionally;
    returns ``due``. The payload is ``"<due> <queue>"``. For a put inside the caller's
    own transaction, which may stay open long: it takes no lock (see
    :func:`wake_function`)."""
    name = s.strip('"')
    return f"""
CREATE OR REPLACE FUNCTION {s}.announce(q text, due bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('{channel(name)}', due::text || ' ' || q) WHERE due IS NOT NULL;
    SELECT due;
$$"""


def hint(s: str) -> str:
    """The sequence ``sleep_hint`` of schema ``s``: the latest ``until`` any consumer has
    registered in ``waiters``, epoch ms (unset: none since the schema was made or the
    server crashed, which empties ``waiters`` too). A sequence's value is not
    transactional: it is read and set in place, so a put reads it without a fresh
    snapshot (see :func:`wake_function`)."""
    return f"{s}.sleep_hint"


def _hint_value(s: str) -> str:
    return f"coalesce(pg_sequence_last_value('{hint(s)}'::regclass), 0)"


def wake_function(s: str) -> str:
    """``wake(queue, due)``: :func:`announce` only when a consumer registered in
    ``waiters`` sleeps until after ``due``; returns ``due``.

    A notifying transaction holds a cluster-wide lock through its commit (PostgreSQL
    serializes them), so concurrent puts that all notified could not share a WAL flush;
    most puts have nobody to wake. The check cannot miss a consumer going to sleep: it
    takes the queue's advisory lock in shared mode, held to commit, while a consumer
    registers under the same lock in exclusive mode and looks for its next event after
    taking it (:func:`claim_function`), and, before its commit, raises the schema's
    :func:`hint` to at least its ``until``. Either the put took the lock first, and the
    consumer's look waits for its commit and sees its message; or the consumer did, and
    the put, its lock granted once the registration committed, reads a hint at or past
    that ``until``.

    An SQL function of one expression, which the planner inlines into the calling
    statement: a put due at or after the hint (nobody sleeps past it: the usual case
    while no consumer sleeps) costs the lock and one read of the hint; only a put
    due before it runs :func:`wake_sleepers_function`'s lookup of ``waiters``. An
    unset hint (NULL) or ``due`` compares as not before: nobody to wake."""
    name = s.strip('"')
    return f"""
CREATE OR REPLACE FUNCTION {s}.wake(q text, due bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT CASE
        WHEN pg_advisory_xact_lock_shared({_queue_lock(name, "q")}) IS NULL THEN NULL
        WHEN due < pg_sequence_last_value('{hint(s)}'::regclass) THEN {s}.wake_sleepers(q, due)
        ELSE due
    END
$$"""


def wake_sleepers_function(s: str, name: str = "wake_sleepers") -> str:
    """``wake_sleepers(queue, due)``: :func:`wake`'s look at ``waiters``, once the put
    holds the queue's lock and the hint says someone may sleep past ``due``: a
    PL/pgSQL function, so that the look is a fresh snapshot, which sees every
    registration committed before the lock was granted. (Schema versions 2 to 5 had
    it as ``wake`` itself: ``name``.)"""
    schema = s.strip('"')
    return f"""
CREATE OR REPLACE FUNCTION {s}.{name}(q text, due bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({_queue_lock(schema, "q")});
    IF EXISTS (SELECT 1 FROM {s}.waiters AS w WHERE w.queue = q AND w.until > due) THEN
        PERFORM pg_notify('{channel(schema)}', due::text || ' ' || q);
    END IF;
    RETURN due;
END
$$"""


def claim_function(s: str) -> str:
    """``claim(queue, n, lease_ms, expired, waiter, sleep_ms)``: settle() the queue's
    expired leases (but those whose rows another transaction holds, which it names as an
    event :data:`SETTLE_RETRY_MS` away), then apply_reserve() to up to ``n`` due messages
    (earliest first, FIFO), each under a fresh random token until ``c + lease_ms``; one
    clock reading, one transaction. Returns the claimed rows with the floor as ``now_ms``;
    when none was due, one row whose ``id`` is NULL and whose ``lease_until`` is the next
    event (the earliest due time or lease expiry of the queue, NULL when there is none).

    ``waiter`` (NULL: none) names a consumer that will sleep up to ``sleep_ms`` when
    nothing is due: then, under the queue's advisory lock in exclusive mode (see
    :func:`wake_function`), the next event is read in a fresh snapshot and the waiter
    registered in ``waiters`` until the earlier of it and ``f + sleep_ms`` (an update
    of its row when the token slept before; the queue's rows that ended more than
    :data:`WAITER_STALE_MS` ago, left by backend objects that are gone, are dropped).
    No margin is added: a message due at or after ``until`` needs no notification,
    since the consumer claims again when its sleep ends (its timer runs out no later
    than ``until``, counted from when the claim left) and that claim, or the one that
    registers it again, sees the message. A claim that finds messages marks the
    waiter's row awake (``until`` = now): its backend object reuses the token for its
    next sleep, so the row is updated in place rather than deleted and inserted
    again.

    The claim's transaction commits without waiting for its WAL to reach the disk
    (``synchronous_commit`` off for it alone, :data:`CLAIM_COMMIT`): what it writes, a
    lease and its attempt, expired leases settled, may be redone. A crash of the
    server (or its machine) within the moment before the WAL writer flushes it loses
    the claim: the message is scheduled again as before it, its attempt not counted,
    and delivered again while its first consumer may still hold it (whose ack or
    extend then finds its lease lost), as at-least-once delivery allows. Any later
    synchronous commit of the server (an ack, a put, a nack of any session) flushes
    the WAL up to its own record, past the claim's: a message acked is never
    claimed back, and a claim whose message was acked, nacked or extended is
    durable."""
    name = s.strip('"')
    return f"""
CREATE OR REPLACE FUNCTION {s}.claim(
    q text, n integer, lease_ms bigint, expired text, w_id text, sleep_ms bigint)
RETURNS TABLE (
    id text, payload bytea, encoding text, due_at bigint, seq bigint, attempts integer,
    max_attempts integer, state text, headers text, last_error text, lease text,
    lease_until bigint, now_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    ms numeric := extract(epoch FROM clock_timestamp()) * 1000;
    f bigint := floor(ms);
    c bigint := ceil(ms);
    next_due bigint;
    next_lease bigint;
    sleeps_until bigint;
BEGIN
    {CLAIM_COMMIT}
    -- Rows another transaction holds are left for a later claim: a claim never waits.
    WITH gone AS MATERIALIZED ({CLAIM_EXPIRED.format(s=s, q="q", f="f")})
    UPDATE {s}.messages AS m
    SET state = CASE WHEN m.attempts >= m.max_attempts THEN 'dead' ELSE 'scheduled' END,
        due_at = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at ELSE m.lease_until END,
        lease = NULL, lease_until = NULL, last_error = expired
    FROM gone
    WHERE m.queue = q AND m.id = gone.id;

    -- MATERIALIZED: a pick rescanned as the inner side of a join would skip the rows it
    -- has just locked and take the next ones.
    RETURN QUERY
    WITH pick AS MATERIALIZED ({CLAIM_PICK.format(s=s, q="q", f="f", n="n")})
    UPDATE {s}.messages AS m
    SET state = 'active', attempts = m.attempts + 1,
        lease = replace(gen_random_uuid()::text, '-', ''), lease_until = c + lease_ms
    FROM pick
    WHERE m.queue = q AND m.id = pick.id
    RETURNING {COLUMNS.replace("m.state", "m.state::text")}, f;
    IF FOUND THEN
        IF w_id IS NOT NULL THEN
            -- Awake: it sleeps until now, so no put notifies it (the row stays, for
            -- its next sleep).
            UPDATE {s}.waiters AS w SET until = f
            WHERE w.queue = q AND w.waiter = w_id AND w.until > f;
        END IF;
        RETURN;
    END IF;
    IF w_id IS NOT NULL AND sleep_ms > 0 THEN
        -- Waits for every put whose wake() holds the lock: committed, the looks below
        -- (each a fresh snapshot) see its message.
        PERFORM pg_advisory_xact_lock({_queue_lock(name, "q")});
    END IF;
    SELECT min(d.due_at) INTO next_due FROM {s}.messages AS d
    WHERE d.queue = q AND d.state = 'scheduled';
    -- An expired lease still here is one another transaction held: look again soon.
    SELECT min(CASE WHEN d.lease_until > f THEN d.lease_until ELSE f + {SETTLE_RETRY_MS} END)
    INTO next_lease FROM {s}.messages AS d
    WHERE d.queue = q AND d.state = 'active';
    IF w_id IS NOT NULL AND sleep_ms > 0 THEN
        DELETE FROM {s}.waiters AS w WHERE w.queue = q AND w.until < f - {WAITER_STALE_MS};
        sleeps_until := least(next_due, next_lease, f + sleep_ms);
        INSERT INTO {s}.waiters AS w (queue, waiter, until)
        VALUES (q, w_id, sleeps_until)
        ON CONFLICT (queue, waiter) DO UPDATE SET until = excluded.until;
        -- Before the commit that lets puts of the queue take its lock (see wake()):
        -- the hint only grows, under the schema's lock, so that two consumers of two
        -- queues raising it at once cannot leave it below either.
        IF sleeps_until > {_hint_value(s)} THEN
            PERFORM pg_advisory_xact_lock({_hint_lock(name)});
            PERFORM setval('{hint(s)}', greatest(sleeps_until, {_hint_value(s)}));
        END IF;
    END IF;
    RETURN QUERY SELECT NULL::text, NULL::bytea, NULL::text, NULL::bigint, NULL::bigint,
        NULL::integer, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::text,
        least(next_due, next_lease), f;
END
$$"""


_INSERT = """
INSERT INTO {s}.messages AS m
    (queue, id, payload, encoding, due_at, seq, attempts, max_attempts, state, headers)
SELECT %(queue)s, r.id, r.payload, r.encoding, {due}, r.seq, 0, r.max_attempts,
       'scheduled', r.headers
FROM req AS r, now
ORDER BY r.ord"""

_REQUESTS = """req AS MATERIALIZED (
    SELECT u.*, nextval('{s}.seq') AS seq
    FROM unnest(%(ids)b::text[], %(payloads)b::bytea[], %(encodings)b::text[],
                %(delays)b::bigint[], %(ats)b::bigint[], %(maxes)b::integer[],
                %(headers)b::text[])
         WITH ORDINALITY AS u(id, payload, encoding, delay_ms, at_ms, max_attempts,
                              headers, ord)
)"""


class Prepared:
    """A statement run as a prepared statement of this name, prepared on each
    connection before its first run there, and executed through libpq without
    psycopg's cursor: for the put of one message, where psycopg's Python work per
    ``execute`` (a cursor, the parameters' adaptation, its own prepared-statement
    bookkeeping) was about a sixth of a put's time. Its parameters are ``$n``."""

    __slots__ = ("formats", "name", "sql")

    def __init__(self, name: str, sql: str, formats: tuple[int, ...]) -> None:
        self.name = name.encode()
        self.sql = sql.encode()
        #: libpq's format of each parameter: 1 binary (passed as bytes), 0 text.
        self.formats = formats


class Statements:
    """Every statement of the backend for one schema (``schema``, unquoted)."""

    def __init__(self, schema: str) -> None:
        s = f'"{schema}"'
        self.schema = schema
        self.channel = channel(schema)
        request_due = due("r.delay_ms", "r.at_ms")
        insert = _INSERT.format(s=s, due=request_due)
        requests = _REQUESTS.format(s=s)

        #: apply_put(on_conflict="ignore") of a batch, as one statement: the requests
        #: (arrays, in order) each take the next seq; a stored id keeps its message
        #: (DO NOTHING; an id repeated in the batch keeps the first). Returns the
        #: positions (1-based) of the inserted requests when fewer than ``%(n)s`` were,
        #: and the earliest due time written, notified (``PUT_IGNORE_QUIET``: not).
        put_ignore = f"""
WITH {NOW}, {requests},
ins AS ({insert}
    ON CONFLICT (queue, id) DO NOTHING
    RETURNING m.seq, m.due_at)
SELECT CASE WHEN count(*) < %(n)s THEN coalesce(array_agg(r.ord), ARRAY[]::bigint[]) END,
       {{wake}}
FROM ins JOIN req AS r ON r.seq = ins.seq"""
        self.PUT_IGNORE = put_ignore.format(wake=f"{s}.wake(%(queue)s, min(ins.due_at))")
        self.PUT_IGNORE_QUIET = put_ignore.format(wake="min(ins.due_at)")
        #: PUT_IGNORE of a batch whose ids the facade drew (``generated_id``, all of
        #: them): no stored message has one, so no ``ON CONFLICT`` (its probe of the
        #: primary key and speculative insertion are about a quarter of the statement's
        #: server time) and no join back to the requests (every one is stored). Should
        #: one exist all the same, the statement fails on the primary key, storing
        #: nothing, and the put runs PUT_IGNORE instead. Returns the earliest due time
        #: written, notified.
        self.PUT_NEW_MANY = f"""
WITH {NOW}, {requests},
ins AS ({insert}
    RETURNING m.due_at)
SELECT {s}.wake(%(queue)s, min(ins.due_at)) FROM ins"""

        #: apply_put(on_conflict="ignore") of one request (the default put), by how its
        #: due time is given (:func:`put_kind`): one row VALUES, no CTE and no arrays,
        #: since a put one by one is bound by its server work beside the commit. Its
        #: clock is read once, in the one branch of resolve_due() that applies (a
        #: positive delay from the ceiling is never before the floor). Parameters, in
        #: order: queue, id, payload, encoding, max_attempts, headers, then the delay
        #: or the time. A row back (its due time, notified) when stored, none when a
        #: stored id kept its message. Prepared by name on each connection (see
        #: :class:`Prepared`), hence numbered parameters.
        put_one = f"""
INSERT INTO {s}.messages AS m
    (queue, id, payload, encoding, max_attempts, headers, due_at, seq, attempts, state)
VALUES ($1, $2, $3, $4, $5, $6, {{due_at}}, nextval('{s}.seq'), 0, 'scheduled')
{{conflict}}RETURNING {s}.wake(m.queue, m.due_at)"""
        dues = (
            ("now", _FLOOR),
            ("delay", f"{_CEIL} + $7::bigint"),
            ("at", f"greatest($7::bigint, {_FLOOR})"),
        )
        # The payload in binary; the due time's parameter, when there is one, in text.
        formats = {"now": (0, 0, 1, 0, 0, 0), "delay": (0, 0, 1, 0, 0, 0, 0)}
        formats["at"] = formats["delay"]
        self.PUT_ONE = {
            kind: Prepared(
                f"delayq_put_one_{kind}",
                put_one.format(due_at=due_at, conflict="ON CONFLICT (queue, id) DO NOTHING\n"),
                formats[kind],
            )
            for kind, due_at in dues
        }
        #: PUT_ONE of a request whose id the facade drew (``generated_id``): no stored
        #: message has it, so no ``ON CONFLICT`` (its probe of the primary key before
        #: the insert is about a tenth of a put's server work). Should one exist all
        #: the same, the insert fails on the primary key, storing nothing.
        self.PUT_NEW = {
            kind: Prepared(
                f"delayq_put_new_{kind}", put_one.format(due_at=due_at, conflict=""), formats[kind]
            )
            for kind, due_at in dues
        }

        #: apply_put(on_conflict="error") of one request: a stored id violates the
        #: primary key -> DuplicateId. Returns its due time.
        self.PUT_ERROR = f"WITH {NOW}, {requests} {insert} RETURNING m.due_at"

        #: apply_put(on_conflict="replace") of one request: a fresh message over the
        #: stored one, unless that one is in flight (then no row: DuplicateId).
        self.PUT_REPLACE = f"""
WITH {NOW}, {requests} {insert}
ON CONFLICT (queue, id) DO UPDATE SET
    payload = excluded.payload, encoding = excluded.encoding, due_at = excluded.due_at,
    seq = excluded.seq, attempts = 0, max_attempts = excluded.max_attempts,
    state = 'scheduled', headers = excluded.headers, last_error = NULL, lease = NULL,
    lease_until = NULL
WHERE NOT (m.state = 'active' AND m.lease_until > (SELECT f FROM now))
RETURNING m.due_at"""

        #: Wake for the earliest due time of a multi-statement put, once, at its end
        #: (``ANNOUNCE``: notify unconditionally, taking no lock, for a transaction of
        #: the caller's that may stay open long).
        self.WAKE = f"SELECT {s}.wake(%(queue)s, %(due)s)"
        self.ANNOUNCE = f"SELECT {s}.announce(%(queue)s, %(due)s)"

        #: A closing backend object's rows of ``waiters``, by (queue, token) arrays.
        self.FORGET_WAITERS = f"""
DELETE FROM {s}.waiters AS w
USING unnest(%(queues)s::text[], %(tokens)s::text[]) AS t(queue, waiter)
WHERE w.queue = t.queue AND w.waiter = t.waiter"""

        #: settle() then apply_reserve(), registering a waiter: see claim_function().
        self.CLAIM = f"""
SELECT * FROM {s}.claim(%(queue)s, %(limit)s, %(lease_ms)s, %(expired)s, %(waiter)s,
                        %(sleep_ms)s)"""

        held = "m.state = 'active' AND m.lease = {token} AND m.lease_until > now.f"

        #: apply_ack(): delete the message if the token holds its unexpired lease.
        self.ACK = f"""
WITH {NOW}
DELETE FROM {s}.messages AS m USING now
WHERE m.queue = %(queue)s AND m.id = %(id)s AND {held.format(token="%(token)s")}"""

        #: apply_ack_many(): ACK for every (id, token) pair of two arrays, one
        #: primary-key lookup each. RETURNING gives the deleted (id, lease) pairs; the
        #: caller reports the others as lost, in order (a row is deleted once, so a
        #: repeated pair is lost the second time).
        self.ACK_MANY = f"""
WITH {NOW}
DELETE FROM {s}.messages AS m
USING now, unnest(%(ids)s::text[], %(tokens)s::text[]) AS item(id, token)
WHERE m.queue = %(queue)s AND m.id = item.id AND {held.format(token="item.token")}
RETURNING m.id, m.lease"""

        #: apply_nack(): scheduled at resolve_due(delay_ms), or dead when ``dead`` or
        #: once out of attempts (due time kept); last_error set, a new seq, the lease
        #: dropped. Returns the new state (a scheduled one is notified).
        dead_now = "(%(dead)s::boolean OR m.attempts >= m.max_attempts)"
        self.NACK = f"""
WITH {NOW}, upd AS (
    UPDATE {s}.messages AS m
    SET state = CASE WHEN {dead_now} THEN 'dead' ELSE 'scheduled' END,
        due_at = CASE WHEN {dead_now} THEN m.due_at ELSE {due("%(delay_ms)s::bigint", None)} END,
        seq = nextval('{s}.seq'), lease = NULL, lease_until = NULL, last_error = %(error)s
    FROM now
    WHERE m.queue = %(queue)s AND m.id = %(id)s AND {held.format(token="%(token)s")}
    RETURNING m.state, m.due_at)
SELECT state, CASE WHEN state = 'scheduled' THEN {s}.wake(%(queue)s, due_at) END FROM upd"""

        #: apply_release(): each held message of the arrays goes back to exactly the
        #: row before its claim (scheduled, one attempt less, no lease; due_at, seq and
        #: last_error untouched). Also undoes a claim nobody received (a cancelled
        #: reserve). Returns how many, notified.
        self.RELEASE = f"""
WITH {NOW}, upd AS (
    UPDATE {s}.messages AS m
    SET state = 'scheduled', attempts = m.attempts - 1, lease = NULL, lease_until = NULL
    FROM now, unnest(%(ids)s::text[], %(tokens)s::text[]) AS item(id, token)
    WHERE m.queue = %(queue)s AND m.id = item.id AND {held.format(token="item.token")}
    RETURNING m.due_at)
SELECT count(*), {s}.wake(%(queue)s, min(due_at)) FROM upd"""

        #: apply_extend(): the lease now expires at c + lease_ms.
        self.EXTEND = f"""
WITH {NOW}
UPDATE {s}.messages AS m SET lease_until = now.c + %(lease_ms)s
FROM now
WHERE m.queue = %(queue)s AND m.id = %(id)s AND {held.format(token="%(token)s")}
RETURNING m.lease_until"""

        #: can_cancel(): delete unless in flight.
        self.CANCEL = f"""
WITH {NOW}
DELETE FROM {s}.messages AS m USING now
WHERE m.queue = %(queue)s AND m.id = %(id)s
  AND NOT (m.state = 'active' AND m.lease_until > now.f)"""

        #: apply_reschedule(): a scheduled message (or one whose expired lease makes it
        #: scheduled again, settled here) moves to resolve_due(), a new seq. Notified.
        self.RESCHEDULE = f"""
WITH {NOW}, upd AS (
    UPDATE {s}.messages AS m
    SET due_at = {due("%(delay_ms)s::bigint", "%(at_ms)s::bigint")}, seq = nextval('{s}.seq'),
        state = 'scheduled', lease = NULL, lease_until = NULL,
        last_error = CASE WHEN m.state = 'active' THEN %(expired)s ELSE m.last_error END
    FROM now
    WHERE m.queue = %(queue)s AND m.id = %(id)s
      AND (m.state = 'scheduled' OR ({_EXPIRED_BACK}))
    RETURNING m.due_at)
SELECT {s}.wake(%(queue)s, due_at) FROM upd"""

        dead_rows = f"(m.state = 'dead' OR ({_EXPIRED_DEAD}))"
        #: apply_retry_dead(): dead messages (settled inline; all of the queue, or
        #: those of the ids) become scheduled, due now (the floor), attempts 0, a new
        #: seq in the order they died; last_error kept. Returns how many, notified.
        self.RETRY_DEAD = f"""
WITH {NOW}, pick AS MATERIALIZED (
    SELECT m.id, m.seq FROM {s}.messages AS m, now
    WHERE m.queue = %(queue)s AND (%(all)s::boolean OR m.id = ANY(%(ids)s::text[])) AND {dead_rows}
    ORDER BY m.seq
    FOR UPDATE OF m),
numbered AS MATERIALIZED (
    SELECT p.id, nextval('{s}.seq') AS seq FROM (SELECT * FROM pick ORDER BY seq) AS p),
upd AS (
    UPDATE {s}.messages AS m
    SET state = 'scheduled', due_at = now.f, seq = numbered.seq, attempts = 0,
        lease = NULL, lease_until = NULL,
        last_error = CASE WHEN m.state = 'active' THEN %(expired)s ELSE m.last_error END
    FROM numbered, now
    WHERE m.queue = %(queue)s AND m.id = numbered.id
    RETURNING m.due_at)
SELECT count(*), {s}.wake(%(queue)s, min(due_at)) FROM upd"""

        purge = f"WITH {NOW} DELETE FROM {s}.messages AS m USING now WHERE m.queue = %(queue)s"
        #: purge(state): the observed state of a row, settled inline (None: all).
        self.PURGE: dict[str | None, str] = {
            None: purge,
            "scheduled": purge + " AND m.state = 'scheduled' AND m.due_at > now.f",
            "ready": purge
            + f" AND ((m.state = 'scheduled' AND m.due_at <= now.f) OR ({_EXPIRED_BACK}))",
            "active": purge + " AND m.state = 'active' AND m.lease_until > now.f",
            "dead": purge + f" AND {dead_rows}",
        }

        #: get(): the floor and the stored row (NULLs when none); the caller observes.
        self.GET = f"""
WITH {NOW}
SELECT {COLUMNS}, now.f FROM now
LEFT JOIN {s}.messages AS m ON m.queue = %(queue)s AND m.id = %(id)s"""

        #: dead(): dead rows and rows whose expired lease made them dead, by seq.
        self.DEAD = f"""
WITH {NOW}
SELECT {COLUMNS}, now.f FROM {s}.messages AS m, now
WHERE m.queue = %(queue)s AND {dead_rows} AND m.seq > %(after)s
ORDER BY m.seq
LIMIT %(limit)s"""

        #: compute_stats(): counts per observed state, the next due time and the
        #: oldest ready due time, expired leases settled inline; and the floor.
        self.STATS = f"""
WITH {NOW}
SELECT
    count(*) FILTER (WHERE m.state = 'scheduled' AND m.due_at > now.f),
    count(*) FILTER (WHERE (m.state = 'scheduled' AND m.due_at <= now.f)
                        OR ({_EXPIRED_BACK})),
    count(*) FILTER (WHERE m.state = 'active' AND m.lease_until > now.f),
    count(*) FILTER (WHERE {dead_rows}),
    min(CASE WHEN m.state = 'scheduled' THEN m.due_at
             WHEN {_EXPIRED_BACK} THEN m.lease_until END),
    min(CASE WHEN m.state = 'scheduled' AND m.due_at <= now.f THEN m.due_at
             WHEN {_EXPIRED_BACK} THEN m.lease_until END),
    min(now.f)
FROM now LEFT JOIN {s}.messages AS m ON m.queue = %(queue)s"""

        #: queues(): the distinct queue names, sorted, skipping through the primary
        #: key from one name to the next (one index probe per queue, not a scan).
        self.QUEUES = f"""
WITH RECURSIVE names(name) AS (
    SELECT min(queue) FROM {s}.messages
    UNION ALL
    SELECT (SELECT min(queue) FROM {s}.messages WHERE queue > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL"""

        peek_due = f"""
(SELECT {COLUMNS}, now.f FROM {s}.messages AS m, now
 WHERE m.queue = %(queue)s AND m.state = 'scheduled'{{due}}
   AND (m.due_at, m.seq) > (%(after_key)s, %(after_seq)s)
 ORDER BY m.due_at, m.seq
 LIMIT %(limit)s)"""
        peek_back = f"""
(SELECT {COLUMNS}, now.f FROM {s}.messages AS m, now
 WHERE m.queue = %(queue)s AND {_EXPIRED_BACK}
   AND (m.lease_until, m.seq) > (%(after_key)s, %(after_seq)s)
 ORDER BY m.lease_until, m.seq
 LIMIT %(limit)s)"""
        #: peek(state) per State value (None: waiting): up to ``limit`` candidate
        #: rows of each part, one statement (one snapshot); the caller observes,
        #: merges in peek order and cuts (durable.inspection.select_peek()).
        self.PEEK: dict[str | None, str] = {
            None: f"WITH {NOW} {peek_due.format(due='')} UNION ALL {peek_back}",
            "ready": f"WITH {NOW} {peek_due.format(due=' AND m.due_at <= now.f')}"
            f" UNION ALL {peek_back}",
            "scheduled": f"WITH {NOW} {peek_due.format(due=' AND m.due_at > now.f')}",
            "active": f"""
WITH {NOW}
SELECT {COLUMNS}, now.f FROM {s}.messages AS m, now
WHERE m.queue = %(queue)s AND m.state = 'active' AND m.lease_until > now.f
  AND (m.lease_until, m.seq) > (%(after_key)s, %(after_seq)s)
ORDER BY m.lease_until, m.seq
LIMIT %(limit)s""",
            "dead": self.DEAD,
        }

        #: due_counts(): scheduled messages not yet due and within the window, per
        #: bucket of ``width`` ms from the floor; one range scan of the claim index.
        #: Always one row at least, for the floor.
        self.DUE_COUNTS = f"""
WITH {NOW}
SELECT now.f, b.i, b.n FROM now
LEFT JOIN LATERAL (
    SELECT ((m.due_at - now.f) / %(width)s::bigint)::integer AS i, count(*) AS n
    FROM {s}.messages AS m
    WHERE m.queue = %(queue)s AND m.state = 'scheduled' AND m.due_at > now.f
      AND m.due_at < now.f + %(width)s::bigint * %(buckets)s::bigint
    GROUP BY 1) AS b ON true"""

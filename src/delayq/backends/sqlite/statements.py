"""Every SQL statement of the SQLite backend, each the mirror of a pure transition.

The state machine is written once, in :mod:`delayq.durable.message`; each statement
below names the function it mirrors. Conventions shared by all of them:

* ``:now`` is the backend's "now" in epoch ms, *floored*, and ``:ceil`` the same
  reading rounded *up* (:class:`~delayq.durable.message.Now`), both from one clock
  reading per transaction: every check against the clock (``due_at <= :now``,
  ``lease_until > :now``) and "due now" use ``:now``; a time computed as now plus a
  positive duration starts from ``:ceil`` (a lease expiry here; a due time is
  computed by :func:`~delayq.durable.message.resolve_due` and bound as ``:due_at``),
  so nothing is ever early;
* a row is *in flight* when ``state = 'active' AND lease_until > :now``; an active row
  whose lease has expired is, logically, already settled
  (:func:`~delayq.durable.message.settle`): scheduled again due at ``lease_until``, or
  dead once ``attempts >= max_attempts``. :data:`SETTLE` applies that for one queue;
  statements that run without it spell the settled state out inline;
* the literal ``state = '...'`` terms match the partial indexes of ``schema.sql``
  (a bound parameter would not let SQLite use them).
"""

from __future__ import annotations

__all__ = [
    "ACK",
    "ACK_MANY",
    "CANCEL",
    "CLAIM",
    "CLAIM_AHEAD",
    "COLUMNS",
    "DEAD",
    "DEAD_ROWIDS",
    "DEAD_ROWIDS_ALL",
    "DUE_COUNTS",
    "EXTEND",
    "GET",
    "INSERT",
    "INSERT_IGNORE",
    "INSERT_IGNORE_KEPT",
    "NACK",
    "NEXT_EVENT",
    "NEXT_SEQ",
    "PEEK",
    "PURGE",
    "QUEUES",
    "RELEASE",
    "REPLACE",
    "RESCHEDULE",
    "RETRY_DEAD",
    "SCHEMA_VERSION",
    "SETTLE",
    "STATS",
]

#: The columns of a :class:`~delayq.durable.message.Record`, in its field order.
COLUMNS = (
    "id, payload, encoding, due_at, seq, attempts, max_attempts, state, headers, "
    "last_error, lease, lease_until"
)

#: Reserve ``?`` sequence numbers; returns the last one (the batch ends there).
NEXT_SEQ = "UPDATE delayq_meta SET value = value + ? WHERE key = 'seq' RETURNING value"

SCHEMA_VERSION = "SELECT value FROM delayq_meta WHERE key = 'schema'"

# -- settle(): lease expiry, for a whole queue -------------------------------------

#: settle(): expired leases of ``:queue`` become scheduled at their expiry, or dead.
SETTLE = """
UPDATE delayq_messages
SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'scheduled' END,
    due_at = CASE WHEN attempts >= max_attempts THEN due_at ELSE lease_until END,
    lease = NULL,
    lease_until = NULL,
    last_error = :expired
WHERE queue = :queue AND state = 'active' AND lease_until <= :now
"""

# -- apply_put() --------------------------------------------------------------------

_INSERT = """
INSERT INTO delayq_messages
    (queue, id, payload, encoding, due_at, seq, attempts, max_attempts, state, headers)
VALUES (?, ?, ?, ?, ?, ?, 0, ?, 'scheduled', ?)
"""

#: apply_put(on_conflict="ignore"): a stored id keeps its message.
INSERT_IGNORE = _INSERT + "ON CONFLICT (queue, id) DO NOTHING"

#: Which requests of a run of INSERT_IGNORE were kept (apply_put returned None), asked
#: in the same transaction only when the run inserted fewer rows than it had: the seqs
#: its ids hold now (:ids, a JSON array). A request inserted its row exactly when that
#: row holds the seq it was given (each request has its own); an id given twice in the
#: run is looked up once.
INSERT_IGNORE_KEPT = """
SELECT held.seq
FROM (SELECT DISTINCT value FROM json_each(:ids)) AS asked
CROSS JOIN delayq_messages AS held
  ON held.queue = :queue AND held.id = asked.value
"""

#: apply_put(on_conflict="error"): a stored id violates the primary key -> DuplicateId.
INSERT = _INSERT

#: apply_put(on_conflict="replace"): a fresh message over the stored one, unless that
#: one is in flight (then no row comes back -> DuplicateId). The 9th parameter is now.
REPLACE = (
    _INSERT
    + """
ON CONFLICT (queue, id) DO UPDATE SET
    payload = excluded.payload,
    encoding = excluded.encoding,
    due_at = excluded.due_at,
    seq = excluded.seq,
    attempts = 0,
    max_attempts = excluded.max_attempts,
    state = 'scheduled',
    headers = excluded.headers,
    last_error = NULL,
    lease = NULL,
    lease_until = NULL
WHERE NOT (delayq_messages.state = 'active' AND delayq_messages.lease_until > ?)
RETURNING 1
"""
)

# -- apply_reserve() ----------------------------------------------------------------

#: apply_reserve() on up to ``:limit`` due messages, earliest due first, then by seq,
#: each with a fresh random 128-bit lease token until ``:ceil + :lease_ms``. Runs right
#: after SETTLE, in the same transaction. RETURNING gives rows in no particular order:
#: the caller sorts them.
CLAIM = f"""
UPDATE delayq_messages
SET state = 'active',
    attempts = attempts + 1,
    lease = lower(hex(randomblob(16))),
    lease_until = :ceil + :lease_ms
WHERE rowid IN (
    SELECT rowid FROM delayq_messages
    WHERE queue = :queue AND state = 'scheduled' AND due_at <= :now
    ORDER BY due_at, seq
    LIMIT :limit
)
RETURNING {COLUMNS}
"""

#: A reserve that fires ahead, when CLAIM found nothing due: apply_reserve() on up to
#: ``:limit`` messages of the earliest due time if it is at most ``:horizon`` (the floor
#: plus the backend's ``fire_ahead_ms``), by seq, each leased from its due time
#: (``due_at + :lease_ms``: the holder hands it over then, with its whole lease).
CLAIM_AHEAD = f"""
UPDATE delayq_messages
SET state = 'active',
    attempts = attempts + 1,
    lease = lower(hex(randomblob(16))),
    lease_until = due_at + :lease_ms
WHERE rowid IN (
    SELECT rowid FROM delayq_messages
    WHERE queue = :queue AND state = 'scheduled' AND due_at <= :horizon AND due_at = (
        SELECT min(due_at) FROM delayq_messages WHERE queue = :queue AND state = 'scheduled'
    )
    ORDER BY seq
    LIMIT :limit
)
RETURNING {COLUMNS}
"""

#: When to look again: the earliest due time and the earliest lease expiry.
NEXT_EVENT = """
SELECT
    (SELECT min(due_at) FROM delayq_messages WHERE queue = :queue AND state = 'scheduled'),
    (SELECT min(lease_until) FROM delayq_messages WHERE queue = :queue AND state = 'active')
"""

# -- apply_ack() / apply_nack() / apply_release() / apply_extend(): the token must hold
# -- the unexpired lease -------------------------------------------------------------

#: apply_ack(): delete the message if the token holds its unexpired lease.
ACK = """
DELETE FROM delayq_messages
WHERE queue = ? AND id = ? AND state = 'active' AND lease = ? AND lease_until > ?
"""

#: apply_ack_many(): ACK for every ``[id, token]`` pair of the JSON array ``:items``, in
#: one statement: json_each drives one primary key lookup per pair (CROSS JOIN fixes
#: that loop order; left free, the planner scans the queue's leases instead). RETURNING gives the
#: deleted ``(id, lease)`` pairs; the caller reports the other pairs as lost, in order
#: (each row is deleted once, so a duplicate pair is lost the second time).
ACK_MANY = """
DELETE FROM delayq_messages
WHERE rowid IN (
    SELECT held.rowid
    FROM json_each(:items) AS item
    CROSS JOIN delayq_messages AS held
      ON held.queue = :queue AND held.id = json_extract(item.value, '$[0]')
    WHERE held.state = 'active' AND held.lease = json_extract(item.value, '$[1]')
      AND held.lease_until > :now
)
RETURNING id, lease
"""

#: apply_nack(): scheduled at ``:due_at`` (``resolve_due(delay_ms, None, now)``), or dead
#: when ``:dead`` (1) or once out of attempts (due time kept); ``last_error`` set, a new
#: seq, the lease dropped.
NACK = """
UPDATE delayq_messages
SET state = CASE WHEN :dead OR attempts >= max_attempts THEN 'dead' ELSE 'scheduled' END,
    due_at = CASE WHEN :dead OR attempts >= max_attempts THEN due_at ELSE :due_at END,
    seq = :seq,
    lease = NULL,
    lease_until = NULL,
    last_error = :error
WHERE queue = :queue AND id = :id AND state = 'active' AND lease = :token
  AND lease_until > :now
RETURNING state
"""

#: apply_release(): the held message goes back to exactly the row before its claim
#: (scheduled, one attempt less, no lease; due_at, seq and last_error untouched). Also
#: undoes a claim nobody received (a cancelled async reserve).
RELEASE = """
UPDATE delayq_messages
SET state = 'scheduled', attempts = attempts - 1, lease = NULL, lease_until = NULL
WHERE queue = :queue AND id = :id AND state = 'active' AND lease = :token
  AND lease_until > :now
"""

#: apply_extend(): the lease now expires at ``:ceil + :lease_ms``.
EXTEND = """
UPDATE delayq_messages
SET lease_until = :ceil + :lease_ms
WHERE queue = :queue AND id = :id AND state = 'active' AND lease = :token
  AND lease_until > :now
RETURNING lease_until
"""

# -- can_cancel() / apply_reschedule() / apply_retry_dead() --------------------------

#: can_cancel(): delete unless in flight.
CANCEL = """
DELETE FROM delayq_messages
WHERE queue = ? AND id = ? AND NOT (state = 'active' AND lease_until > ?)
"""

#: apply_reschedule() (after SETTLE): a scheduled message moves to ``max(:due_at, :now)``
#: (``:due_at`` from resolve_due()).
RESCHEDULE = """
UPDATE delayq_messages
SET due_at = max(:due_at, :now), seq = :seq
WHERE queue = :queue AND id = :id AND state = 'scheduled'
"""

#: Dead rows of a queue in the order they died (after SETTLE), for retry_dead().
DEAD_ROWIDS_ALL = (
    "SELECT rowid FROM delayq_messages WHERE queue = ? AND state = 'dead' ORDER BY seq"
)

#: The row of one id if it is dead (after SETTLE), for retry_dead(ids).
DEAD_ROWIDS = "SELECT rowid FROM delayq_messages WHERE queue = ? AND id = ? AND state = 'dead'"

#: apply_retry_dead(): ready now (the floor), attempts back to 0, a new seq, last_error
#: kept.
RETRY_DEAD = """
UPDATE delayq_messages SET state = 'scheduled', due_at = ?, seq = ?, attempts = 0
WHERE rowid = ?
"""

# -- matches_state() for purge() (after SETTLE) -------------------------------------

_PURGE = "DELETE FROM delayq_messages WHERE queue = :queue"

#: purge(state): the observed state of a settled row, per State value (None: all).
PURGE: dict[str | None, str] = {
    None: _PURGE,
    "scheduled": _PURGE + " AND state = 'scheduled' AND due_at > :now",
    "ready": _PURGE + " AND state = 'scheduled' AND due_at <= :now",
    "active": _PURGE + " AND state = 'active'",
    "dead": _PURGE + " AND state = 'dead'",
}

# -- reads: observe() / compute_stats(), settled inline ------------------------------

#: get(): the stored row; the caller applies observe() to it.
GET = f"SELECT {COLUMNS} FROM delayq_messages WHERE queue = ? AND id = ?"

#: dead(): stored dead rows and rows whose expired lease made them dead, by seq.
DEAD = f"""
SELECT {COLUMNS} FROM delayq_messages
WHERE queue = :queue AND (
    state = 'dead'
    OR (state = 'active' AND lease_until <= :now AND attempts >= max_attempts))
  AND seq > :after
ORDER BY seq
LIMIT :limit
"""

_EXPIRED_BACK = "state = 'active' AND lease_until <= :now AND attempts < max_attempts"

#: compute_stats(): counts per observed state, the next due time and the oldest ready
#: due time, with expired leases settled inline (scheduled at lease_until, or dead).
STATS = f"""
SELECT
    count(CASE WHEN state = 'scheduled' AND due_at > :now THEN 1 END),
    count(CASE WHEN (state = 'scheduled' AND due_at <= :now) OR ({_EXPIRED_BACK})
               THEN 1 END),
    count(CASE WHEN state = 'active' AND lease_until > :now THEN 1 END),
    count(CASE WHEN state = 'dead'
                 OR (state = 'active' AND lease_until <= :now AND attempts >= max_attempts)
               THEN 1 END),
    min(CASE WHEN state = 'scheduled' THEN due_at
             WHEN {_EXPIRED_BACK} THEN lease_until END),
    min(CASE WHEN state = 'scheduled' AND due_at <= :now THEN due_at
             WHEN {_EXPIRED_BACK} THEN lease_until END)
FROM delayq_messages
WHERE queue = :queue
"""

# -- inspection: queues(), peek(), due_counts(); read only ----------------------------

#: queues(): the distinct queue names, sorted, by skipping through the primary key
#: index from one name to the next (one index seek per queue, not a scan of every row).
QUEUES = """
WITH RECURSIVE names(name) AS (
    SELECT min(queue) FROM delayq_messages
    UNION ALL
    SELECT (SELECT min(queue) FROM delayq_messages WHERE queue > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
"""

_PEEK_DUE = f"""
SELECT {COLUMNS} FROM (
    SELECT {COLUMNS} FROM delayq_messages
    WHERE queue = :queue AND state = 'scheduled'{{due}}
      AND (due_at, seq) > (:after_key, :after_seq)
    ORDER BY due_at, seq
    LIMIT :limit
)
"""

#: Expired leases that settle() makes scheduled (due at lease_until, so ready), first
#: ``:limit`` in that due order; the caller settles them with observe().
_PEEK_EXPIRED_BACK = f"""
SELECT {COLUMNS} FROM (
    SELECT {COLUMNS} FROM delayq_messages
    WHERE queue = :queue AND {_EXPIRED_BACK}
      AND (lease_until, seq) > (:after_key, :after_seq)
    ORDER BY lease_until, seq
    LIMIT :limit
)
"""

#: peek(state) per State value (None: waiting): up to ``:limit`` candidate rows each
#: part, in one statement (one snapshot); the caller observes, merges in peek order and
#: cuts to ``:limit`` (delayq.durable.inspection.select_peek()).
PEEK: dict[str | None, str] = {
    None: _PEEK_DUE.format(due="") + "UNION ALL" + _PEEK_EXPIRED_BACK,
    "ready": _PEEK_DUE.format(due=" AND due_at <= :now") + "UNION ALL" + _PEEK_EXPIRED_BACK,
    "scheduled": _PEEK_DUE.format(due=" AND due_at > :now"),
    "active": f"""
SELECT {COLUMNS} FROM delayq_messages
WHERE queue = :queue AND state = 'active' AND lease_until > :now
  AND (lease_until, seq) > (:after_key, :after_seq)
ORDER BY lease_until, seq
LIMIT :limit
""",
    "dead": DEAD,
}

#: due_counts(): scheduled messages not yet due and within the window, per bucket of
#: ``:width`` ms from ``:now``; one range scan of the claim index (covering).
DUE_COUNTS = """
SELECT (due_at - :now) / :width, count(*) FROM delayq_messages
WHERE queue = :queue AND state = 'scheduled' AND due_at > :now AND due_at < :end
GROUP BY 1
"""

"""Settings of the replicated backends (amqp://), in one place."""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_BYTES",
    "CHECKPOINT_CHUNK",
    "CHECKPOINT_ENTRIES",
    "CLIENTS_KEPT",
    "CLOSE_SETTLE",
    "DEDUP_CHUNK",
    "DEDUP_PRUNE_EVERY",
    "DEDUP_SIZE",
    "DEDUP_WINDOW",
    "DELIVER_BACKOFF_MAX_MS",
    "DELIVER_BACKOFF_MS",
    "DELIVER_IN_FLIGHT",
    "DELIVER_LEASE_MS",
    "FIRE_AHEAD_MS",
    "FOLDING",
    "FOLDING_EVERY",
    "FOLLOW_STALL",
    "FULL_EVERY",
    "HELD_REPLY_AHEAD_MS",
    "IMAGE_OVERHEAD",
    "LINGER_ENTRIES",
    "LINGER_MS",
    "LOCATE_TIMEOUT",
    "MAX_GROUP_BYTES",
    "QUIET_AFTER",
    "QUIET_EVERY",
    "QUIET_HOLD",
    "REJOIN_FIRST_PAUSE",
    "REJOIN_MAX_PAUSE",
    "RENEW_EVERY",
    "RESEND_FOR",
    "STANDBY_IDLE",
    "STANDBY_SWEEP_BYTES",
]

#: Request ids remembered with their replies, so that a resent request is answered,
#: not applied twice (the newest are kept) ...
DEDUP_SIZE = 200_000
#: ... and for DEDUP_WINDOW s after their decision, by the scheduler's logged time
#: (never in the first DEDUP_WINDOW s of a reign): a client sends a request (or
#: appends an intake message) again for at most RESEND_FOR s after its first send,
#: each send expiring after as long, so that the last copy arrives within
#: 2 x RESEND_FOR of the first; the rest is margin. An entry is dropped once a marker
#: appended to the intake after it aged is read back (the intake's copies of a fast
#: put lie before it), in rounds every DEDUP_PRUNE_EVERY s.
RESEND_FOR = 60.0
DEDUP_WINDOW = 150.0
DEDUP_PRUNE_EVERY = 5.0
#: Dedup entries carried per operation of a checkpoint (after its begin).
DEDUP_CHUNK = 2000
#: An entry of the log holds the operations decided while the previous append was in
#: flight, up to about this many bytes (one larger operation goes alone).
MAX_GROUP_BYTES = 1 << 20
#: A group that holds only what was folded from the intake (durable there already, and
#: folded again by a successor if it is lost) and no reply waits this long (ms) for
#: more before its append, or until it holds this many operations: puts that come one
#: at a time share an append. Anything else (a reply, a claim) sends it at once.
LINGER_MS = 20
LINGER_ENTRIES = 256
#: Seconds between two renewals of the election (a held delivery must be acked before
#: the broker's consumer timeout, 30 min by default on RabbitMQ).
RENEW_EVERY = 300.0
#: How long before its due time a message may be claimed for a waiting reserve (ms):
#: its lease is logged meanwhile, so that the log's confirm is not added to its
#: lateness. Meanwhile it counts as in flight (a cancel or reschedule finds it taken).
FIRE_AHEAD_MS = 10
#: How long before the due time the reply of a message claimed ahead leaves (ms); the
#: client holds it until the due time, so that the reply's hop is not added to its
#: lateness either. Until it leaves, the reserve stays parked: a message that falls
#: due before takes its place (the one claimed ahead goes back, its due time kept).
HELD_REPLY_AHEAD_MS = 2
#: A fast put due within FIRE_AHEAD_MS is copied to the scheduler (a nudge) for a
#: waiting consumer. Once no reserve has waited for this many seconds (and no queue is
#: delivered to an exchange), a nudge makes the scheduler tell the clients ``quiet``
#: (at most every QUIET_EVERY s): they send no copies for QUIET_HOLD s, or until a
#: reserve waits again (``nudge``), so that the scheduler reads each put once.
QUIET_AFTER = 1.0
QUIET_EVERY = 0.1
QUIET_HOLD = 1.0
#: Publishes to a user's exchange with their confirms in flight, per queue.
DELIVER_IN_FLIGHT = 1000
#: The lease a message being published holds (a successor scheduler publishes it again
#: once it has run out: delivery is at least once).
DELIVER_LEASE_MS = 30_000
#: The pause before a returned or nacked publish is tried again, doubling per attempt
#: up to the second figure (ms); dead after the message's max_attempts.
DELIVER_BACKOFF_MS = 1_000
DELIVER_BACKOFF_MAX_MS = 300_000
#: Seconds between a candidate's tries to connect again after it lost its connection,
#: doubling from the first to the second.
REJOIN_FIRST_PAUSE = 0.1
REJOIN_MAX_PAUSE = 5.0
#: A checkpoint starts once the log has grown, since the last one began, by the larger
#: of the live image bytes and a sixteenth of the log's retention, at most this many
#: bytes (this many when the log has no retention) ...
CHECKPOINT_BYTES = 64_000_000
#: ... or by this many entries (which bounds the replay of a new scheduler).
CHECKPOINT_ENTRIES = 100_000
#: Live records re-appended per operation of a checkpoint (one append each, interleaved
#: with the requests).
CHECKPOINT_CHUNK = 1000
#: Bytes counted per record image beyond its id, payload, headers and last error (its
#: numbers and msgpack's framing), for the live image bytes a put is weighed against.
IMAGE_OVERHEAD = 48
#: Seconds a scheduler reads its log for the begin entry of the checkpoint it points
#: at (beyond: it points a little before it, which a replay skips).
LOCATE_TIMEOUT = 5.0
#: Seconds an elected hot standby waits for its reader of the log to bring anything
#: on its way to the reign's entry (beyond: the reader is taken for stuck, and the
#: scheduler stops; the next election replays).
FOLLOW_STALL = 5.0
#: A hot standby collects its garbage once its reader of the log brought nothing for
#: STANDBY_IDLE s after it folded at least STANDBY_SWEEP_BYTES of entries (and a
#: quarter of what it folded before): the full collection the fold's objects call for
#: (seconds at a million records) runs while it waits, not when it is elected.
STANDBY_IDLE = 0.5
STANDBY_SWEEP_BYTES = 1_000_000
#: Clients whose last folded intake message the scheduler remembers (the newest are
#: kept): a request of a client it does not know waits for a marker appended to the
#: intake to be read back (a sweep) instead.
CLIENTS_KEPT = 100_000
#: While requests wait for their clients' intake messages to be folded (read your
#: writes), the scheduler tells each such client every FOLDING_EVERY s in which the fold
#: advanced, in a reply of kind FOLDING with no request id (its body the ids of those
#: requests): the client then waits a request timeout more from that word instead of
#: giving up (a client before it ignores the reply, as one of no request it knows). A
#: purge whose far records' deletions are logged a piece at a time says the same.
FOLDING = "folding"
FOLDING_EVERY = 1.0
#: Seconds between two ``full`` announcements while fast puts come past the live
#: bytes' limit.
FULL_EVERY = 0.1
#: Seconds a close waits at most for the link's fast puts to be folded (none runs:
#: they stay in the intake, folded by the next scheduler).
CLOSE_SETTLE = 2.0

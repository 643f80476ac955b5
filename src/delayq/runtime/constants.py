"""Defaults of the worker, cron and the backend-outage backoff."""

from __future__ import annotations

from ..durable.constants import TICK_HEADER

__all__ = [
    "BACKEND_RETRY_MAX",
    "CRON_ACK_GUARD",
    "CRON_PRODUCER_MAX_SLEEP",
    "CRON_TICK_HEADER",
    "DEFAULT_WORKER_CONCURRENCY",
    "DEFAULT_WORKER_GRACE",
    "DEFAULT_WORKER_PREFETCH_PER_HANDLER",
    "LATENESS_BUCKETS",
    "METRICS_PUSH_EVERY",
    "RUN_SECONDS_BUCKETS",
    "SUPERVISOR_HEALTH_BEAT",
    "SUPERVISOR_HEALTH_STALE",
    "SUPERVISOR_RESTART_FIRST",
    "SUPERVISOR_RESTART_MAX",
    "SUPERVISOR_STABLE",
    "WORKER_BURST_LIMIT",
    "WORKER_ERROR_BACKOFF",
    "WORKER_EXTEND_DIVISOR",
    "WORKER_IDLE_WAIT",
    "WORKER_PREFETCH_AHEAD",
    "WORKER_PREFETCH_MAX_PER_HANDLER",
]

#: Default number of handlers one :class:`~delayq.Worker` runs at once.
DEFAULT_WORKER_CONCURRENCY = 8

#: Default prefetch of a Worker, per handler it runs at once: messages reserved ahead of
#: free handlers, so that bigger reserve batches cost the loop less per message.
DEFAULT_WORKER_PREFETCH_PER_HANDLER = 4

#: A Worker of sync handlers on the default prefetch reserves further ahead while its
#: handlers are quick: up to this many messages per handler, as long as those waiting
#: stand for at most WORKER_PREFETCH_AHEAD seconds of its handlers' work. Each claim,
#: ack batch and hand-over costs the loop about the same whatever its size, and the
#: loop must win the GIL back from the busy handler threads at every step.
WORKER_PREFETCH_MAX_PER_HANDLER = 16
WORKER_PREFETCH_AHEAD = 0.05

#: Default seconds running handlers get to finish after SIGTERM/SIGINT or ``stop()``.
DEFAULT_WORKER_GRACE = 30.0

#: A held message's lease (a Worker's job, a dispatcher's callback) is renewed every
#: ``lease / WORKER_EXTEND_DIVISOR`` seconds.
WORKER_EXTEND_DIVISOR = 3.0

#: Longest single blocking ``reserve`` of an idle worker (s); it then simply reserves again.
WORKER_IDLE_WAIT = 5.0

#: Most runs of one :meth:`~delayq.Worker.burst` while messages are still due.
WORKER_BURST_LIMIT = 10_000

#: Pause (s) after a backend error in the reserve loop before trying again: the first
#: step of the backoff, doubled at each failure in a row up to BACKEND_RETRY_MAX.
WORKER_ERROR_BACKOFF = 1.0

#: Longest pause (s) between two tries of a worker or dispatcher that lost its backend:
#: how late it may notice the backend is back, and the log's pace during an outage.
BACKEND_RETRY_MAX = 10.0

#: Header that marks a cron tick; its value is the tick time in epoch ms.
CRON_TICK_HEADER = TICK_HEADER

#: A cron run is acked at least this long (s) after its tick, so that an on-time put of
#: the same tick id can never land in the millisecond of the ack (see delayq.runtime._cron).
CRON_ACK_GUARD = 0.002

#: Longest sleep (s) of a cron producer; it re-puts its next tick (a no-op) after it.
CRON_PRODUCER_MAX_SLEEP = 60.0

#: First pause (s) before a supervised worker process that died is started again;
#: doubled for each death in a row of a child that lived less than SUPERVISOR_STABLE.
SUPERVISOR_RESTART_FIRST = 0.5

#: Longest pause (s) before a supervised worker process is started again.
SUPERVISOR_RESTART_MAX = 30.0

#: A supervised child that lived this long (s) before dying is restarted after the
#: first pause again: it was not a crash at start-up.
SUPERVISOR_STABLE = 10.0

#: Seconds between two beats of a supervised child's loop (its readiness, for the
#: supervisor's ``/readyz``).
SUPERVISOR_HEALTH_BEAT = 0.25

#: A supervised child whose loop has not beaten for this long (s) is stuck: the
#: supervisor's ``/healthz`` fails.
SUPERVISOR_HEALTH_STALE = 10.0

#: The upper bounds (s) of the buckets of ``delayq_lateness_seconds``, the Worker's and
#: ``delayq serve``'s alike (one histogram adds up across them): from 0.1 ms (a run
#: on time, fire-ahead held to its due time) to 15 minutes (a backlog, an outage).
LATENESS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)  # fmt: skip

#: The upper bounds (s) of the buckets of ``delayq_run_seconds``, a handler's run time:
#: from 0.1 ms (a counter's increment) to 15 minutes (a batch job).
RUN_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)  # fmt: skip

#: Seconds between two reports of a supervised child's metrics to its supervisor (the
#: most its ``/metrics`` lags behind the children), and one more as the child stops.
METRICS_PUSH_EVERY = 0.5

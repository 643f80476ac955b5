"""The broker contract every durable backend implements, in a sync and an async face.

:class:`AsyncBackend` is written by hand in :mod:`delayq.durable._async.backend`;
:class:`Backend` is generated from it into :mod:`delayq.durable._sync.backend` by
``scripts/unasync.py``, as every face is. The guarantees below hold on both.

:class:`~delayq.Queue` and :class:`~delayq.AsyncQueue` validate arguments, serialize
payloads and apply the retry policy; then they call a backend, which stores
:class:`~delayq.durable.message.Record` objects (payload as bytes) and runs the state
machine of :mod:`delayq.durable.message`. A backend never sees user objects and
never validates user input (the facade did); it must guarantee:

* **Atomicity per operation.** Each call below is one atomic step on the server (one
  SQL transaction, one Lua script, one lock hold): ``put`` of a whole batch, a claim
  of up to ``limit`` messages, an ack, an ``ack_many`` batch (per shard of a sharded
  queue), a nack, a cancel, a reschedule, a lease expiry. Nothing is decided by a read
  in one round trip and a write in another. A call that raises has changed nothing.
* **The server's clock decides "now".** Due times, lease expiries and "is it due"
  use the clock of the store (Redis ``TIME``, ``clock_timestamp()``, the SQLite
  process's wall clock, the memory backend's clock), in epoch milliseconds; a
  :class:`PutRequest` carries ``delay_ms`` *relative* to that now, or an absolute
  ``at_ms``. A past ``at_ms`` or a delay <= 0 means "due now".
* **Never early.** A message is never reserved before its delay has passed, to the
  microsecond. The facade rounds ``delay_ms``/``at_ms``/``lease_ms`` *up* to the
  millisecond; the backend reads its clock once per operation and uses that one
  reading both ways (:class:`~delayq.durable.message.Now`): a time it *computes* as
  now plus a positive duration (``delay_ms`` of put/nack/reschedule, the lease
  expiry ``now + lease_ms`` of reserve/extend) starts from the **ceiling** of now
  in ms, while every *check* ("is it due": ``due_at <= now``; "has the lease
  expired": ``lease_until <= now``; the lag) and "due now" itself (no delay or a
  delay of 0, a past ``at_ms``, retry_dead) use the **floor**. A message put at
  1000.3 ms with ``delay=0.005`` is due at 1006 and reserved at 1006.0 at the
  earliest (never at 1005.x); one put at 1000.3 without a delay is due at 1000, so
  a reserve right after the put finds it; a lease never ends before ``lease_ms``.
* **Order.** Among due messages, earliest ``due_at`` first; among equal due times,
  the order of their ``seq``, an increasing sequence given on every put, nack,
  reschedule and retry_dead: that is, put order. A lease expiry keeps the
  message's ``seq`` (:func:`~delayq.durable.message.settle`).
* **Lease fencing.** ``reserve`` counts an attempt and gives each message a new,
  unique lease token, valid until ``lease_until``. ``ack``/``nack``/``extend``/
  ``release`` succeed only while that token holds an unexpired lease; otherwise
  (expired, reserved again, acked, nacked, released, cancelled, purged, dead) they
  raise :class:`~delayq.LeaseLost` and change nothing.
* **Lease expiry.** An expired lease makes the message scheduled again, due at its
  ``lease_until`` and with the attempt counted, and ``last_error`` set to
  ``"lease expired"``; or dead once ``attempts`` has reached ``max_attempts``
  (:func:`~delayq.durable.message.settle`). It may be applied lazily, but every
  operation must observe it as if it had happened at ``lease_until``.
* **Observed states.** Returned records carry the state at the server's now:
  ``READY`` for a scheduled message that is due (:func:`~delayq.durable.message.observe`).
* **Waiting.** ``reserve(wait=...)`` sleeps until the earliest due time (or lease
  expiry), or until a put/nack/release/reschedule/retry_dead makes something due
  earlier,
  or ``wait`` seconds pass; no busy polling. A put through the same backend object
  must wake a waiter at once. ``close()`` wakes every waiter of this backend
  object, which then raises :class:`~delayq.QueueClosed`.
* **Fire ahead** (optional: :class:`AsyncFiresAhead`). A backend may let a *waiting*
  reserve claim a message shortly before its due time, so that the claim's round trip is
  not added to its lateness: ``reserve_ahead`` claims, when nothing is due, the messages
  of the earliest due time if that is at most ``fire_ahead_ms`` after the store's now
  (its floor), each leased until ``due_at + lease_ms`` (the caller's lease is whole),
  and answers with the store's now in microseconds; its waiting claim wakes
  ``fire_ahead_ms`` before the next due time (at a lease expiry itself). The facade
  (:func:`delayq.durable._async.hold.reserve_held`, the one holder) then waits
  ``due_at - store now``, counted from when the answer arrived, on the precise timer,
  so a message still reaches the caller at or after its due time by the store's clock (never
  early holds exactly); ``AsyncQueue.reserve_ahead`` hands the messages over at once
  with that instant instead, to a caller that holds them itself (the Worker's lane
  threads, each on its own timer); a caller that gives up while it holds releases the
  messages (no attempt charged), and one that dies leaves an expired lease, due again at
  ``due_at + lease_ms`` with the attempt counted. ``reserve(wait=0)`` never fires ahead.
  What other callers can see: for at most ``fire_ahead_ms`` before its due time, a
  message claimed ahead is in flight (``cancel`` and ``reschedule`` return False,
  ``get`` shows it active); before that window it is scheduled to every operation. A
  message put (or made due) while another is held is free to any reserve at once; the
  holder's own next reserve takes it after handing over the held one, at most
  ``fire_ahead_ms`` after it. How far ahead: above the claim's round trip at p99
  measured on a loaded 2-vCPU machine, so it leaves the lateness, and no longer than the
  backend's own timing noise, so the window stays small; a killed holder costs what a
  consumer killed after any claim costs (the lease, counted from the due time). The
  window per backend: ``memory://`` 1 ms (system clock only; none on another clock),
  ``redis://`` 2 ms, ``sqlite:///`` 2 ms, ``postgresql://`` 4 ms; ``amqp://`` 2 ms (its
  scheduler claims 10 ms ahead but gives a message back to any operation until its held
  reply leaves, 2 ms before: docs/rabbitmq.md), a sharded Redis queue (``shards=``,
  Cluster) 2 ms. The conformance suite checks each of these
  (``tests/conformance/test_fire_ahead.py``).
* **Threads and tasks.** A sync backend is safe to call from many threads at once;
  an async backend from many tasks of one event loop, and never blocks the loop.
* **Isolation.** Queues are namespaces: ``queue`` is part of every key. The same
  id may exist in two queues.

A backend package (``delayq.backends.<name>``) exports its ``DESCRIPTOR``
(:mod:`delayq.durable.descriptor`), whose driver holds two openers, found through
the registry of :mod:`delayq.durable.registry`::

    def open_backend(url: str, **options: Any) -> Backend: ...
    def open_async_backend(url: str, **options: Any) -> AsyncBackend: ...

``url`` is the full URL as the user gave it; ``options`` are the extra keyword
arguments of ``Queue``/``AsyncQueue`` (an unknown one raises ``TypeError``; an
unknown query parameter of ``url``, :class:`~delayq.errors.UnsupportedURL`, by
:func:`~delayq.durable.descriptor.check_url_options`).
Opening must not block for long: async backends connect lazily on first use.
"""

from ._async.backend import AsyncBackend, AsyncFiresAhead
from ._sync.backend import Backend, FiresAhead

__all__ = ["AsyncBackend", "AsyncFiresAhead", "Backend", "FiresAhead"]

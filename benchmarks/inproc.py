"""Benchmark of delayq's in-process engine against the standard library (issue 2).

Run with ``make bench`` (or ``.venv/bin/python benchmarks/inproc.py``); ``--quick``
makes every section smaller, ``--only a,c,h`` picks sections. Everything runs in
one process, side by side, so the ratios compare numbers taken on the same machine
at the same time. Micro-benchmarks keep the best of several runs, garbage is
collected between runs and sections (the collector stays enabled while timing).
The script prints a table (measure, target, PASS/MISS) and writes JSON to
``benchmarks/results/inproc.json`` (``inproc-quick.json`` with ``--quick``). It
never asserts: a missed target is reported.

Sections

a. The floor: raw :mod:`heapq` of ``(deadline, seq, item)`` tuples, the deadline
   read from :func:`time.monotonic`, ``seq`` from :func:`itertools.count`. A pair
   is a push and a pop of the head once it is due (the due check reads the clock
   again, as any delay queue must).
b. :class:`queue.PriorityQueue`: ``put((deadline, seq, item))`` + ``get_nowait()``.
c. ``DelayQueue(HeapStore())``: ``put(item)`` (due now) + ``get_nowait()``.
   Extra rows show ``put(item, delay=0.0)`` and ``put(item, delay=-1)``, the
   keyword path users write (a delay <= 0 is due at once, so it can be taken back
   at once); c_delay/a holds the put with a delay to the target of c/a.
d. The same with ``WheelStore()`` (1 ms tick).
   (a)-(d) run with 1k and with 1M far-future items pending (1-2 h away, random
   order, so every due push climbs to the top of the heap); the result is
   nanoseconds per push+get pair and the ratios c/a, b/c and d/a. The four run
   in turn, round after round, so load from elsewhere hits them alike; the
   pre-filled items are frozen out of the collector (:func:`gc.freeze`). A run
   is timed in this thread's CPU time (:func:`time.thread_time`), not wall time,
   so that the other work of a shared machine does not land on one run.
   Every put in (c)/(d) is due at once, so a store that keeps due-now items
   apart from the heap skips the sift that (a) pays: read (c) together with
   the mixed workloads of (g) and (h).
e. Threads: 2 producers put 200k due items in total, 2 consumers take them with
   a blocking ``get()`` (a sentinel per consumer ends the run): ``DelayQueue``
   against ``PriorityQueue`` in items per second.
f. Memory: bytes per pending timer with 1M pending, measured with
   :mod:`tracemalloc` (the item is ``None``, so it costs nothing), both stores;
   asyncio's ``TimerHandle`` is measured the same way for reference.
g. Keep-alive: 100k timers of 30 s, 2M resets of a random timer to now + 30 s,
   then every timer cancelled; heap against wheel in seconds (put + resets +
   cancel; the collector stays on, since garbage from resets is part of the
   cost). A second pass under tracemalloc (500k resets: the heap compacts about
   every 100k, so its peak recurs) reports the tracemalloc peak (not RSS) of
   the queue above the benchmark's own lists, against the memory of the
   settled 100k timers, and (heap) the largest number of entries per live
   timer, sampled every 1000 resets: lazy deletion must stay within 2x.
h. asyncio: 1M timers due 1-2 s ahead, half cancelled, the rest fired.
   ``loop.call_at`` with a callback that counts, against ``AsyncDelayQueue``
   with a consumer draining ``get_many(max=1000)`` until all fired. The cost is
   CPU nanoseconds per scheduled timer over the whole lifecycle (idle waiting
   for the first deadline costs no CPU and is not counted; wall time is shown
   too). One run each (a run is ~10 s); ``AsyncDelayQueue(WheelStore)`` is
   shown for information.
i. Lateness: 10k items due over 2 s (random, put while one consumer thread
   blocks in ``get()``); lateness = the consumer's clock when ``get`` returns
   minus the handle's deadline: p50, p99 and max in ms, and the count of items
   that came out early (must be 0). Both stores.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import itertools
import queue
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sized
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from _common import (
    RESULTS_DIR,
    Measure,
    console,
    environment,
    fresh_heap,
    gc_frozen,
    gc_paused,
    load_average,
    parse_sections,
    print_table,
    write_json,
)
from delayq import AsyncDelayQueue, DelayQueue, HeapStore, WheelStore
from delayq.inproc.store import TimerStore

SECTIONS = "abcdefghi"
R = TypeVar("R")
FAR_MIN, FAR_SPAN = 3600.0, 3600.0  # pre-filled items are due 1-2 h from now


@dataclass(frozen=True)
class Sizes:
    """How big each section is (full run, or ``--quick``)."""

    repeat: int = 5
    small_pending: int = 1_000
    big_pending: int = 1_000_000
    pairs_small: int = 200_000
    pairs_big: int = 100_000
    threads_items: int = 200_000
    threads_repeat: int = 3
    memory_pending: int = 1_000_000
    keepalive_timers: int = 100_000
    keepalive_resets: int = 2_000_000
    keepalive_traced_resets: int = 500_000
    keepalive_repeat: int = 1
    async_timers: int = 1_000_000
    async_repeat: int = 1
    lateness_items: int = 10_000
    lateness_span: float = 2.0


QUICK = Sizes(
    repeat=3,
    big_pending=100_000,
    pairs_small=50_000,
    pairs_big=50_000,
    threads_items=50_000,
    threads_repeat=2,
    memory_pending=100_000,
    keepalive_timers=20_000,
    keepalive_resets=200_000,
    keepalive_traced_resets=100_000,
    keepalive_repeat=1,
    async_timers=100_000,
    async_repeat=1,
    lateness_items=2_000,
    lateness_span=0.5,
)


def human(n: int) -> str:
    """1000 -> '1k', 1000000 -> '1M'."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def far_delays(n: int, seed: int) -> list[float]:
    """``n`` delays between 1 and 2 hours, in random order."""
    rng = random.Random(seed)
    return [FAR_MIN + rng.random() * FAR_SPAN for _ in range(n)]


# -- a-d: push + get pairs ------------------------------------------------------------


Run = Callable[[], float]  # one timed run: returns seconds

#: What (a)-(d) time with: the CPU time of this thread, so that a run the scheduler
#: pauses for another process (the machine is shared) is not charged for the pause.
clock = time.thread_time


def pairs_heapq(pending: int, pairs: int) -> Run:
    """(a) heappush + due-checked heappop, ``pending`` far items below."""
    now = time.monotonic()
    heap = [(now + d, -i, None) for i, d in enumerate(far_delays(pending, 1))]
    heapq.heapify(heap)
    monotonic = time.monotonic
    seq = itertools.count().__next__
    push, pop = heapq.heappush, heapq.heappop
    item = None

    def run() -> float:
        t0 = clock()
        for _ in range(pairs):
            push(heap, (monotonic(), seq(), item))
            if heap[0][0] <= monotonic():
                pop(heap)
        elapsed = clock() - t0
        assert len(heap) == pending
        return elapsed

    return run


def pairs_priority_queue(pending: int, pairs: int) -> Run:
    """(b) ``PriorityQueue.put`` + ``get_nowait``."""
    pq: queue.PriorityQueue[tuple[float, int, None]] = queue.PriorityQueue()
    now = time.monotonic()
    pq.queue.extend((now + d, -i, None) for i, d in enumerate(far_delays(pending, 2)))
    heapq.heapify(pq.queue)
    monotonic = time.monotonic
    seq = itertools.count().__next__
    put, get = pq.put, pq.get_nowait
    item = None

    def run() -> float:
        t0 = clock()
        for _ in range(pairs):
            put((monotonic(), seq(), item))
            get()
        elapsed = clock() - t0
        assert pq.qsize() == pending
        return elapsed

    return run


def filled_queue(store: TimerStore[Any], pending: int, seed: int) -> DelayQueue[Any]:
    """A DelayQueue over ``store`` holding ``pending`` far-future items."""
    q: DelayQueue[Any] = DelayQueue(store)
    put = q.put
    for delay in far_delays(pending, seed):
        put(None, delay)
    return q


def pairs_delay_queue(
    store: TimerStore[Any], pending: int, pairs: int, *, delay: float | None = None
) -> Run:
    """(c)/(d) ``DelayQueue.put(item)`` (or ``put(item, delay=delay)``, a delay <= 0)
    + ``get_nowait()``."""
    q = filled_queue(store, pending, 3)
    put, get = q.put, q.get_nowait
    item = None

    def run() -> float:
        t0 = clock()
        if delay is not None:
            for _ in range(pairs):
                put(item, delay=delay)
                get()
        else:
            for _ in range(pairs):
                put(item)
                get()
        elapsed = clock() - t0
        assert len(q) == pending
        return elapsed

    return run


def interleaved(runs: dict[str, Callable[[], R]], repeat: int) -> dict[str, list[R]]:
    """Every run once per round, ``repeat`` rounds, so that load from elsewhere on the
    machine hits all of them alike; returns each run's results."""
    results: dict[str, list[R]] = {key: [] for key in runs}
    for _ in range(repeat):
        for key, run in runs.items():
            fresh_heap()
            results[key].append(run())
    return results


PAIR_LABELS = {
    "a": "heapq push + due-checked pop (the floor)",
    "b": "PriorityQueue put + get_nowait",
    "c": "DelayQueue(HeapStore) put(x) + get_nowait",
    "c_kw": "DelayQueue(HeapStore) put(x, delay=0.0) + get_nowait",
    "c_delay": "DelayQueue(HeapStore) put(x, delay=-1) + get_nowait",
    "d": "DelayQueue(WheelStore) put(x) + get_nowait",
}


def section_pairs(sizes: Sizes, chosen: list[str], out: list[Measure]) -> None:
    """(a)-(d) at both pending sizes, and the ratios between them."""
    for pending, pairs in (
        (sizes.small_pending, sizes.pairs_small),
        (sizes.big_pending, sizes.pairs_big),
    ):
        tag = f"[{human(pending)} pending]"
        runs: dict[str, Run] = {}
        with gc_paused():
            if "a" in chosen or "c" in chosen or "d" in chosen:
                runs["a"] = pairs_heapq(pending, pairs)
            if "b" in chosen or "c" in chosen:
                runs["b"] = pairs_priority_queue(pending, pairs)
            if "c" in chosen:
                runs["c"] = pairs_delay_queue(HeapStore(), pending, pairs)
                if pending == sizes.small_pending:
                    runs["c_kw"] = pairs_delay_queue(HeapStore(), pending, pairs, delay=0.0)
                    runs["c_delay"] = pairs_delay_queue(HeapStore(), pending, pairs, delay=-1)
            if "d" in chosen:
                runs["d"] = pairs_delay_queue(WheelStore(), pending, pairs)
        with gc_frozen():  # the pre-filled items stay out of every collection
            times = interleaved(runs, sizes.repeat)
        del runs
        fresh_heap()
        ns = {key: min(values) / pairs * 1e9 for key, values in times.items()}
        for key, value in ns.items():
            if key in chosen or key in {"c_kw", "c_delay"}:
                out.append(
                    Measure(
                        key[0],
                        f"{PAIR_LABELS[key]} {tag}",
                        value,
                        "ns/pair",
                        note=f"best of {sizes.repeat}",
                        extra={"seconds": times[key], "pairs": pairs, "pending": pending},
                    )
                )
        if "a" in ns and "c" in ns:
            limit = 2.0 if pending == sizes.small_pending else 1.5
            ratio = ns["c"] / ns["a"]
            out.append(Measure("c", f"c/a {tag}", ratio, "x", f"<= {limit}x", ratio <= limit))
            if "c_delay" in ns:
                ratio = ns["c_delay"] / ns["a"]
                out.append(
                    Measure(
                        "c",
                        f"c_delay/a: put(x, delay=-1) + get_nowait vs heapq {tag}",
                        ratio,
                        "x",
                        f"<= {limit}x",
                        ratio <= limit,
                    )
                )
        if "b" in ns and "c" in ns:
            speedup = ns["b"] / ns["c"]
            out.append(
                Measure("c", f"b/c: c faster than b {tag}", speedup, "x", ">= 2.0x", speedup >= 2)
            )
        if "a" in ns and "d" in ns:
            out.append(Measure("d", f"d/a {tag}", ns["d"] / ns["a"], "x", note="no target"))


# -- e: threads ---------------------------------------------------------------------


_STOP = object()


def move_through_threads(
    put_one: Callable[[], None],
    take_until_stop: Callable[[], int],
    stop: Callable[[], object],
    n: int,
) -> float:
    """Seconds for 2 producers (``n / 2`` calls of ``put_one`` each) and 2 consumers
    (``take_until_stop`` returns how many items it took) to move ``n`` items."""
    per_producer = n // 2
    barrier = threading.Barrier(5)
    taken: list[int] = []

    def producer() -> None:
        barrier.wait()
        for _ in range(per_producer):
            put_one()

    def consumer() -> None:
        barrier.wait()
        taken.append(take_until_stop())

    producers = [threading.Thread(target=producer) for _ in range(2)]
    consumers = [threading.Thread(target=consumer) for _ in range(2)]
    for thread in producers + consumers:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in producers:
        thread.join()
    stop()  # one sentinel per consumer, behind every item
    stop()
    for thread in consumers:
        thread.join()
    elapsed = time.perf_counter() - t0
    if sum(taken) != 2 * per_producer:
        raise RuntimeError(f"threads moved {sum(taken)} items, expected {2 * per_producer}")
    return elapsed


def threads_delay_queue(n: int) -> float:
    """(e) seconds for DelayQueue to move ``n`` due items through 2+2 threads."""
    q: DelayQueue[object] = DelayQueue()
    put, get = q.put, q.get
    item = None

    def put_one() -> None:
        put(item)

    def take_until_stop() -> int:
        count = 0
        while get() is not _STOP:
            count += 1
        return count

    return move_through_threads(put_one, take_until_stop, lambda: put(_STOP), n)


def threads_priority_queue(n: int) -> float:
    """(e) seconds for PriorityQueue to move ``n`` (deadline, seq, item) tuples."""
    pq: queue.PriorityQueue[tuple[float, int, object]] = queue.PriorityQueue()
    put, get = pq.put, pq.get
    seq = itertools.count().__next__
    monotonic = time.monotonic
    item = None

    def put_one() -> None:
        put((monotonic(), seq(), item))

    def take_until_stop() -> int:
        count = 0
        while get()[2] is not _STOP:
            count += 1
        return count

    def stop() -> None:
        put((monotonic(), seq(), _STOP))

    return move_through_threads(put_one, take_until_stop, stop, n)


def section_threads(sizes: Sizes, out: list[Measure]) -> None:
    """(e) DelayQueue vs PriorityQueue, 2 producers + 2 consumers."""
    n = sizes.threads_items
    rates: dict[str, float] = {}
    runs: dict[str, Run] = {
        "PriorityQueue": partial(threads_priority_queue, n),
        "DelayQueue": partial(threads_delay_queue, n),
    }
    for name, seconds in interleaved(runs, sizes.threads_repeat).items():
        best = min(seconds)
        rates[name] = n / best
        out.append(
            Measure(
                "e",
                f"{name}, 2+2 threads, {human(n)} items",
                n / best,
                "items/s",
                note=f"best of {sizes.threads_repeat}",
                extra={"seconds": seconds},
            )
        )
    ratio = rates["DelayQueue"] / rates["PriorityQueue"]
    out.append(
        Measure("e", "DelayQueue / PriorityQueue items/s", ratio, "x", ">= 1.0x", ratio >= 1.0)
    )


# -- f: memory ----------------------------------------------------------------------


def traced_bytes(
    build: Callable[[], object], n: int, cleanup: Callable[[Any], object] | None = None
) -> float:
    """Bytes per element that ``build()`` keeps alive, by tracemalloc."""
    fresh_heap()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with gc_paused():  # nothing is garbage here; the collector only slows the fill
            kept = build()
        fresh_heap()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    if cleanup is not None:
        cleanup(kept)
    del kept
    fresh_heap()
    return (after - before) / n


def section_memory(sizes: Sizes, out: list[Measure]) -> None:
    """(f) bytes per pending timer: HeapStore, WheelStore, asyncio TimerHandle."""
    n = sizes.memory_pending
    delays = far_delays(n, 4)

    def fill(store: TimerStore[None]) -> object:
        q: DelayQueue[None] = DelayQueue(store)
        put = q.put
        for delay in delays:
            put(None, delay)
        return q

    heap_bytes = traced_bytes(partial(fill, HeapStore()), n)
    out.append(
        Measure(
            "f",
            f"HeapStore bytes per pending timer, {human(n)} pending",
            heap_bytes,
            "B",
            "<= 150 B",
            heap_bytes <= 150,
        )
    )
    wheel_bytes = traced_bytes(partial(fill, WheelStore()), n)
    out.append(
        Measure(
            "f",
            f"WheelStore bytes per pending timer, {human(n)} pending",
            wheel_bytes,
            "B",
            note="no target",
        )
    )

    def asyncio_timers() -> object:
        loop = asyncio.new_event_loop()
        now = loop.time()
        call_at = loop.call_at
        for delay in delays:
            call_at(now + delay, print)  # never runs: the loop never runs
        return loop

    timer_bytes = traced_bytes(asyncio_timers, n, cleanup=lambda loop: loop.close())
    out.append(
        Measure(
            "f",
            f"asyncio TimerHandle bytes per timer, {human(n)} pending",
            timer_bytes,
            "B",
            note="reference",
        )
    )


# -- g: keep-alive --------------------------------------------------------------------


def heap_entries(store: object) -> int | None:
    """Entries a HeapStore holds, dead ones included (a diagnostic that reads its
    private containers; None for stores without them)."""
    containers = [getattr(store, name, None) for name in ("_heap", "_lane")]
    sized = [c for c in containers if isinstance(c, Sized)]
    return sum(len(c) for c in sized) if sized else None


def keepalive_run(
    make_store: Callable[[], TimerStore[Any]], sizes: Sizes, *, traced: bool
) -> dict[str, float]:
    """One keep-alive run; with ``traced`` it measures memory instead of time."""
    rng = random.Random(5)
    n = sizes.keepalive_timers
    conn = object()
    # Precomputed outside the timed/traced part: which timer each reset hits.
    resets = sizes.keepalive_traced_resets if traced else sizes.keepalive_resets
    picks_idx = [rng.randrange(n) for _ in range(resets)]
    fresh_heap()
    if traced:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if traced else 0
    t0 = time.perf_counter()
    q: DelayQueue[object] = DelayQueue(make_store())
    put = q.put
    handles = [put(conn, 30.0) for _ in range(n)]
    t1 = time.perf_counter()
    settled = (tracemalloc.get_traced_memory()[0] - base) if traced else 0
    if traced:
        tracemalloc.reset_peak()
    picks = [handles[i] for i in picks_idx]
    del picks_idx
    picks_bytes = (tracemalloc.get_traced_memory()[0] - base - settled) if traced else 0
    reschedule = q.reschedule
    max_entries = 0.0
    t2 = time.perf_counter()
    if traced:
        store = q._store
        for chunk in range(0, len(picks), 1000):
            for handle in picks[chunk : chunk + 1000]:
                reschedule(handle, 30.0)
            entries = heap_entries(store)
            if entries is not None:
                max_entries = max(max_entries, entries / len(store))
    else:
        for handle in picks:
            reschedule(handle, 30.0)
    t3 = time.perf_counter()
    cancel = q.cancel
    for handle in handles:
        cancel(handle)
    t4 = time.perf_counter()
    result = {
        "setup_s": t1 - t0,
        "resets_s": t3 - t2,
        "cancel_s": t4 - t3,
        "total_s": (t1 - t0) + (t3 - t2) + (t4 - t3),
    }
    if traced:
        peak = tracemalloc.get_traced_memory()[1] - base - picks_bytes
        tracemalloc.stop()
        result.update(
            settled_bytes=settled,
            peak_bytes=peak,
            peak_over_settled=peak / settled,
            max_entries_per_live=max_entries,
        )
    if len(q):
        raise RuntimeError("keep-alive: timers left after cancelling all")
    return result


def section_keepalive(sizes: Sizes, out: list[Measure]) -> None:
    """(g) heap vs wheel on keep-alive resets: time, then traced memory."""
    tag = f"{human(sizes.keepalive_timers)} timers, {human(sizes.keepalive_resets)} resets"
    timings: dict[str, dict[str, float]] = {}
    variants: dict[str, Callable[[], dict[str, float]]] = {
        "heap": partial(keepalive_run, HeapStore, sizes, traced=False),
        "wheel": partial(keepalive_run, WheelStore, sizes, traced=False),
    }
    for name, runs in interleaved(variants, sizes.keepalive_repeat).items():
        best = min(runs, key=lambda r: r["total_s"])
        timings[name] = best
        out.append(
            Measure(
                "g",
                f"{name}: put + resets + cancel all, {tag}",
                best["total_s"],
                "s",
                note=f"resets {best['resets_s'] / sizes.keepalive_resets * 1e9:,.0f} ns each",
                extra={"runs": runs},
            )
        )
    fresh_heap()
    speedup = timings["heap"]["total_s"] / timings["wheel"]["total_s"]
    out.append(Measure("g", "wheel faster than heap", speedup, "x", ">= 3.0x", speedup >= 3.0))
    resets_speedup = timings["heap"]["resets_s"] / timings["wheel"]["resets_s"]
    out.append(Measure("g", "  resets alone", resets_speedup, "x", note="no target"))
    for name, make in (("heap", HeapStore), ("wheel", WheelStore)):
        mem = keepalive_run(make, sizes, traced=True)
        fresh_heap()
        out.append(
            Measure(
                "g",
                f"{name}: tracemalloc peak, {human(sizes.keepalive_traced_resets)} traced resets",
                mem["peak_bytes"] / 1e6,
                "MB",
                note=f"{mem['peak_over_settled']:.2f}x the settled "
                f"{mem['settled_bytes'] / 1e6:.1f} MB",
                extra=mem,
            )
        )
        if name == "heap":
            ratio = mem["max_entries_per_live"]
            out.append(
                Measure(
                    "g",
                    "heap: max entries per live timer",
                    ratio,
                    "x",
                    "<= 2.0x",
                    ratio <= 2.0 + 16 / sizes.keepalive_timers,  # + its small constant slack
                    "sampled every 1000 resets",
                )
            )


# -- h: asyncio ------------------------------------------------------------------------


def async_offsets(n: int) -> list[float]:
    """Due times 1-2 s ahead, random order."""
    rng = random.Random(6)
    return [1.0 + rng.random() for _ in range(n)]


def asyncio_lifecycle(n: int) -> dict[str, float]:
    """``loop.call_at`` n timers, cancel every other one, let the rest fire."""
    offsets = async_offsets(n)
    expected = n - (n + 1) // 2

    async def main() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        fired = 0

        def tick() -> None:
            nonlocal fired
            fired += 1
            if fired == expected:
                done.set_result(None)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        base = loop.time()
        call_at = loop.call_at
        handles = [call_at(base + offset, tick) for offset in offsets]
        for handle in handles[::2]:
            handle.cancel()
        del handles
        await done
        return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}

    return asyncio.run(main())


def delayq_async_lifecycle(n: int, make_store: Callable[[], TimerStore[Any]]) -> dict[str, float]:
    """``AsyncDelayQueue.put`` n items, cancel every other one, drain the rest."""
    offsets = async_offsets(n)
    expected = n - (n + 1) // 2

    async def main() -> dict[str, float]:
        q: AsyncDelayQueue[None] = AsyncDelayQueue(make_store())
        cpu0, wall0 = time.process_time(), time.perf_counter()
        put = q.put
        handles = [put(None, offset) for offset in offsets]
        cancel = q.cancel
        for handle in handles[::2]:
            cancel(handle)
        del handles
        fired = 0
        get_many = q.get_many
        while fired < expected:
            fired += len(await get_many(1000))
        return {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}

    return asyncio.run(main())


def section_async(sizes: Sizes, out: list[Measure]) -> None:
    """(h) AsyncDelayQueue vs asyncio's own timers, whole lifecycle per timer."""
    n = sizes.async_timers
    tag = f"{human(n)} timers"
    results: dict[str, dict[str, float]] = {}
    variants: dict[str, Callable[[], dict[str, float]]] = {
        "loop.call_at": partial(asyncio_lifecycle, n),
        "AsyncDelayQueue(HeapStore)": partial(delayq_async_lifecycle, n, HeapStore),
        "AsyncDelayQueue(WheelStore)": partial(delayq_async_lifecycle, n, WheelStore),
    }
    for name, runs in interleaved(variants, sizes.async_repeat).items():
        best = min(runs, key=lambda r: r["cpu_s"])
        results[name] = best
        out.append(
            Measure(
                "h",
                f"{name}: schedule, cancel half, fire, {tag}",
                best["cpu_s"] / n * 1e9,
                "ns/timer",
                note=f"CPU; wall {best['wall_s']:.2f} s",
                extra={"runs": runs},
            )
        )
    reference = results["loop.call_at"]["cpu_s"]
    for name in ("AsyncDelayQueue(HeapStore)", "AsyncDelayQueue(WheelStore)"):
        ratio = reference / results[name]["cpu_s"]
        judged = name.endswith("(HeapStore)")
        out.append(
            Measure(
                "h",
                f"{name} speed vs loop.call_at",
                ratio,
                "x",
                ">= 1.0x" if judged else "",
                (ratio >= 1.0) if judged else None,
                "" if judged else "no target",
            )
        )


# -- i: lateness ----------------------------------------------------------------------


def lateness_run(make_store: Callable[[], TimerStore[Any]], n: int, span: float) -> list[float]:
    """Seconds late of each item (negative = early), one consumer thread in ``get()``."""
    rng = random.Random(7)
    delays = [0.05 + rng.random() * span for _ in range(n)]
    q: DelayQueue[int] = DelayQueue(make_store())
    deadlines = [0.0] * n
    late = [0.0] * n
    monotonic = time.monotonic

    def consume() -> None:
        get = q.get
        for _ in range(n):
            index = get()
            late[index] = monotonic() - deadlines[index]

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.01)  # let it block in get() on an empty queue
    with_handles = [q.put(index, delay) for index, delay in enumerate(delays)]
    for index, handle in enumerate(with_handles):
        deadlines[index] = handle.deadline
    consumer.join()
    return late


def section_lateness(sizes: Sizes, out: list[Measure]) -> None:
    """(i) p50 / p99 / max lateness and early items, both stores."""
    n, span = sizes.lateness_items, sizes.lateness_span
    for name, make in (("HeapStore", HeapStore), ("WheelStore", WheelStore)):
        fresh_heap()
        late = lateness_run(make, n, span)
        ms = sorted(x * 1e3 for x in late)
        p50 = statistics.median(ms)
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        worst = ms[-1]
        early = sum(1 for x in late if x < 0)
        tag = f"{name}, {human(n)} items over {span:g} s"
        out.append(Measure("i", f"{tag}: p50 lateness", p50, "ms", note="no target"))
        out.append(Measure("i", f"{tag}: p99 lateness", p99, "ms", "<= 2 ms", p99 <= 2.0))
        out.append(Measure("i", f"{tag}: max lateness", worst, "ms", "<= 10 ms", worst <= 10.0))
        out.append(Measure("i", f"{tag}: early items", early, "count", "0", early == 0))


# -- main -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the chosen sections, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--only", metavar="a,b,...", help=f"sections to run (of {SECTIONS})")
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    chosen = parse_sections(args.only, SECTIONS)
    path: Path = args.json or RESULTS_DIR / ("inproc-quick.json" if args.quick else "inproc.json")

    measures: list[Measure] = []
    timings: dict[str, float] = {}
    env = environment()
    if env["loadavg"] and env["loadavg"][0] > 0.5:
        console.print(
            f"[yellow]load average {env['loadavg'][0]:.2f}: other work shares the CPUs, "
            "expect noisy numbers[/yellow]"
        )
    started = time.perf_counter()
    plan: list[tuple[str, str, Callable[[], None]]] = []
    if any(s in chosen for s in "abcd"):
        plan.append(("abcd", "push+get pairs", lambda: section_pairs(sizes, chosen, measures)))
    if "e" in chosen:
        plan.append(("e", "threads", lambda: section_threads(sizes, measures)))
    if "f" in chosen:
        plan.append(("f", "memory", lambda: section_memory(sizes, measures)))
    if "g" in chosen:
        plan.append(("g", "keep-alive", lambda: section_keepalive(sizes, measures)))
    if "h" in chosen:
        plan.append(("h", "asyncio", lambda: section_async(sizes, measures)))
    if "i" in chosen:
        plan.append(("i", "lateness", lambda: section_lateness(sizes, measures)))
    for key, title, run in plan:
        t0 = time.perf_counter()
        # No spinner: a rendering thread would steal the GIL from the timed code.
        console.print(f"section {key}: {title} ...", style="dim")
        run()
        timings[key] = time.perf_counter() - t0
        console.log(f"section {key} ({title}) took {timings[key]:.1f} s")
        fresh_heap()
    total = time.perf_counter() - started

    mode = "quick" if args.quick else "full"
    load = load_average()
    print_table(
        f"delayq in-process benchmark ({mode}, {total:.0f} s, load {env['loadavg']} -> {load})",
        measures,
    )
    write_json(
        path,
        {
            "benchmark": "inproc",
            "mode": mode,
            "sections": chosen,
            "sizes": asdict(sizes),
            "environment": env,
            "loadavg_end": load,
            "section_seconds": timings,
            "total_seconds": total,
            "gc_enabled": gc.isenabled(),
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

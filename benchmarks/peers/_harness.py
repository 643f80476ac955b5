"""What the peer benchmarks share: sizes, the lateness plan, Redis housekeeping,
the worker subprocess, and the statistics.

The measurements mirror ``benchmarks/durable.py`` (delayq's own benchmark) so the
numbers compare; :func:`run_benchmark` runs them all on a peer's :class:`Peer`:

1. enqueue: ``enqueues`` no-op jobs one by one, jobs per second; then the rest of
   ``drain_jobs`` through the peer's batch API (``batch`` jobs a call), jobs per
   second, where it has one (else one by one again, not reported);
2. drain those ``drain_jobs`` due jobs with one worker started on them: each job is
   one ``INCR`` of :data:`DONE_KEY` (the job the machine's floor runs in 8 threads);
   jobs per second from the first job finished to the last, so the worker's
   start-up is left out;
3. lateness: 2000 jobs put over 10 s (one every 5 ms), each deferred by a delay
   drawn from 0, 1 ms, 10 ms, 50 ms, 200 ms and 1 s with the same seeded draw as
   durable.py; the worker runs them; each job records ``time.time()`` when it
   starts; lateness = start - due, where due = ``time.time()`` read by the
   producer just before the enqueue call plus the delay (durable.py section e);
   then the same at light load (100 jobs over 10 s).

It runs in each peer's own venv (it needs only ``redis``) and never imports delayq
(``delayq_bench.py`` imports it beside delayq in delayq's own venv).
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
#: Worker logs and each peer's own JSON go here (git-ignored).
LOCAL_RESULTS = HERE / "results"
#: The list every ``record`` job pushes "<seq> <start epoch seconds>" onto.
RECORD_KEY = "peers-bench:started"
#: The delays of durable.py's lateness sections, drawn with the same seed.
DELAYS = (0.0, 0.001, 0.01, 0.05, 0.2, 1.0)
SEED = 7
#: The counter every drain job increments (the drain's count of finished jobs).
DONE_KEY = "peers-bench:done"
#: The worker finds its Redis database's URL here (set for its process).
URL_ENV = "PEERS_REDIS_URL"
#: How often the harness looks at Redis while it waits (drain, records).
POLL_SECONDS = 0.005


@dataclass
class Sizes:
    """How much each measurement does (the full run mirrors durable.py)."""

    enqueues: int = 2_000
    #: Due jobs the worker drains (the first ``enqueues`` of them put one by one).
    drain_jobs: int = 20_000
    #: Jobs per call of a batch API.
    batch: int = 1_000
    late_jobs: int = 2_000
    late_seconds: float = 10.0
    light_jobs: int = 100
    light_seconds: float = 10.0
    drain_timeout: float = 300.0
    #: Waiting for lateness records gives up after this long without a new one...
    stall_seconds: float = 10.0
    #: ... or this long after the last enqueue, whichever comes first.
    cap_seconds: float = 120.0


QUICK = Sizes(
    enqueues=500,
    drain_jobs=2_000,
    late_jobs=400,
    late_seconds=2.0,
    light_jobs=20,
    light_seconds=2.0,
)


def lateness_plan(jobs: int, seconds: float, seed: int = SEED) -> list[tuple[float, float]]:
    """``(offset from the start in seconds, delay in seconds)`` per job, paced
    evenly over ``seconds``; the delays are drawn like durable.py's."""
    rng = random.Random(seed)
    step = seconds / jobs
    return [(i * step, rng.choice(DELAYS)) for i in range(jobs)]


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the worker and
    clean Redis when run.py gives up on a benchmark."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


# -- Redis ------------------------------------------------------------------------------


@contextmanager
def private_db(url: str) -> Iterator[redis.Redis]:
    """A client on ``url``'s database, which must be empty; flushed on the way out,
    so the server is left as it was found. Refuses a database that holds keys."""
    client = redis.Redis.from_url(url)
    try:
        size = client.dbsize()
    except redis.RedisError as exc:
        raise SystemExit(f"cannot reach Redis at {url}: {exc}") from exc
    if size:
        client.close()
        raise SystemExit(
            f"{url} holds {size} keys; the benchmark needs an empty database of its own "
            "(choose another with --db)"
        )
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def commands_processed(client: redis.Redis) -> int:
    """The server's ``total_commands_processed`` (all databases, all clients)."""
    return int(client.info("stats")["total_commands_processed"])


@contextmanager
def server_load(client: redis.Redis, into: dict[str, Any]) -> Iterator[None]:
    """Store in ``into["server_commands_per_second"]`` how many commands per second
    the server processed meanwhile, from every client: a shared server busy with
    someone else's work skews the numbers, and this shows it."""
    before = commands_processed(client)
    started = time.monotonic()
    try:
        yield
    finally:
        after = commands_processed(client)
        # A CONFIG RESETSTAT by another client meanwhile makes the difference meaningless.
        into["server_commands_per_second"] = (
            (after - before) / (time.monotonic() - started) if after >= before else float("nan")
        )


# -- the worker subprocess -------------------------------------------------------------


class WorkerProcess:
    """A peer's worker, started through its own entry point in a session of its own
    (so it and whatever it forks can be stopped as a group); the output goes to a
    log file. Use it as a context manager: it is stopped on the way out, on errors
    too (SIGTERM to the group, then SIGKILL after ``grace`` seconds)."""

    def __init__(
        self, command: Sequence[str], log: Path, env: dict[str, str], grace: float = 10.0
    ) -> None:
        self.command = list(command)
        self.log = log
        self.env = env
        self.grace = grace
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> WorkerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                self.command,
                cwd=HERE,
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The worker's process id (and process group id)."""
        assert self.process is not None
        return self.process.pid

    def check_alive(self) -> None:
        """Raise if the worker has exited (its log says why)."""
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"the worker exited with {code}; log tail:\n" + "\n".join(tail))

    def stop(self) -> None:
        """SIGTERM the worker's process group, wait, then SIGKILL what is left."""
        if self.process is None:
            return
        group = self.process.pid
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=self.grace)
        with suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def cpu_seconds(self) -> float:
        """CPU time used so far by the worker's process group (Linux ``/proc``): every
        live member's user+system time plus that of its reaped children (so the
        forked per-job processes of rq count too). NaN where /proc is missing."""
        group = self.pid
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        try:
            entries = os.listdir("/proc")
        except OSError:
            return float("nan")
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            # fields[0] is field 3 of proc(5): state; pgrp is field 5; utime..cstime 14..17.
            if int(fields[2]) != group:
                continue
            total += sum(int(value) for value in fields[11:15])
        return total / ticks


# -- measuring --------------------------------------------------------------------------


def measure_drain(
    worker: WorkerProcess, finished: Callable[[], int], total: int, timeout: float
) -> dict[str, Any]:
    """Poll ``finished()`` (the peer's own count of finished jobs) until it reaches
    ``total``; the rate runs from the first job finished to the last, so the worker's
    start-up is left out (it is reported separately)."""
    first = last = None
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline:
        done = finished()
        now = time.monotonic()
        if done >= 1 and first is None:
            first = now
        if done >= total:
            last = now
            break
        worker.check_alive()
        time.sleep(POLL_SECONDS)
    if first is None or last is None or last <= first:
        return {"jobs_per_second": float("nan"), "finished": done, "total": total}
    return {
        "jobs_per_second": (total - 1) / (last - first),
        "finished": done,
        "total": total,
        "seconds_first_to_last": last - first,
        "seconds_from_worker_start": last - worker.started,
    }


def wait_for_records(
    client: redis.Redis, worker: WorkerProcess, count: int, stall: float, cap: float
) -> list[tuple[int, float]]:
    """Wait until ``count`` records are in, or none came for ``stall`` seconds, or
    ``cap`` seconds passed; return them all as ``(seq, start epoch seconds)``."""
    started = last_change = time.monotonic()
    seen = -1
    while True:
        now = time.monotonic()
        have = client.llen(RECORD_KEY)
        if have >= count:
            break
        if have != seen:
            seen, last_change = have, now
        if now - last_change > stall or now - started > cap:
            break
        worker.check_alive()
        time.sleep(0.02)
    out = []
    for raw in client.lrange(RECORD_KEY, 0, -1):
        seq, started_at = raw.split()
        out.append((int(seq), float(started_at)))
    return out


def warm_up(client: redis.Redis, worker: WorkerProcess, enqueue: Callable[[], object]) -> None:
    """Let the worker come up: ``enqueue()`` one deferred ``record`` job (seq -1),
    wait until it ran, then forget it."""
    enqueue()
    if not wait_for_records(client, worker, 1, stall=30.0, cap=30.0):
        raise RuntimeError("the worker did not run the warm-up job within 30 s")
    client.delete(RECORD_KEY)


def measure_lateness(
    client: redis.Redis,
    worker: WorkerProcess,
    produce: Callable[[list[tuple[float, float]]], dict[int, float]],
    plan: list[tuple[float, float]],
    sizes: Sizes,
) -> dict[str, Any]:
    """Run ``produce(plan)`` (which enqueues the ``record`` jobs on schedule and
    returns their due times), wait for the records, and compute the statistics and
    the worker's CPU share over the whole run (production and wait)."""
    cpu = worker.cpu_seconds()
    wall = time.monotonic()
    due = produce(plan)
    records = wait_for_records(client, worker, len(due), sizes.stall_seconds, sizes.cap_seconds)
    elapsed = time.monotonic() - wall
    stats = lateness_stats(due, records)
    stats["by_delay_ms"] = lateness_by_delay(plan, due, records)
    stats["worker_cpu_percent"] = 100.0 * (worker.cpu_seconds() - cpu) / elapsed
    stats["seconds"] = elapsed
    stats["offered_jobs_per_second"] = (len(plan) - 1) / plan[-1][0] if len(plan) > 1 else 0.0
    client.delete(RECORD_KEY)
    return stats


def lateness_stats(due: dict[int, float], records: list[tuple[int, float]]) -> dict[str, Any]:
    """p50/p99/max/min lateness in ms, plus lost, duplicates and early (start < due),
    computed like durable.py's ``lateness_measures``."""
    seen: dict[int, int] = {}
    late: list[float] = []
    for seq, started in records:
        if seq not in due:
            continue
        seen[seq] = seen.get(seq, 0) + 1
        late.append((started - due[seq]) * 1000.0)
    late.sort()
    nan = float("nan")
    return {
        "p50_ms": statistics.median(late) if late else nan,
        "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))] if late else nan,
        "max_ms": late[-1] if late else nan,
        "min_ms": late[0] if late else nan,
        "lost": sum(1 for seq in due if seq not in seen),
        "duplicates": sum(n - 1 for n in seen.values()),
        "early": sum(1 for value in late if value < 0),
        "received": len(late),
        "jobs": len(due),
    }


def lateness_by_delay(
    plan: list[tuple[float, float]], due: dict[int, float], records: list[tuple[int, float]]
) -> dict[str, dict[str, Any]]:
    """:func:`lateness_stats` per delay (due-now jobs and deferred ones take different
    paths in both peers), keyed by the delay in ms."""
    out: dict[str, dict[str, Any]] = {}
    for delay in sorted({d for _, d in plan}):
        seqs = {seq for seq, (_, d) in enumerate(plan) if d == delay and seq in due}
        stats = lateness_stats(
            {seq: due[seq] for seq in seqs}, [r for r in records if r[0] in seqs]
        )
        out[f"{delay * 1000:g}"] = {
            key: stats[key] for key in ("jobs", "p50_ms", "max_ms", "min_ms", "early")
        }
    return out


_JOB_CLIENT: list[redis.Redis] = []


def job_redis() -> redis.Redis:
    """The worker process's client for the jobs of sync peers (made on first use; a
    forked child gets fresh connections from redis-py's pool)."""
    if not _JOB_CLIENT:
        _JOB_CLIENT.append(redis.Redis.from_url(os.environ[URL_ENV]))
    return _JOB_CLIENT[0]


def noop_job() -> None:
    """The drain job of sync peers: one ``INCR``."""
    job_redis().incr(DONE_KEY)


def record_job(seq: int) -> None:
    """The lateness job of sync peers: push its sequence number and start time."""
    started = time.time()
    job_redis().rpush(RECORD_KEY, record_line(seq, started))


_ASYNC_JOB_CLIENTS: dict[object, Any] = {}


def async_job_redis() -> Any:
    """The ``redis.asyncio`` client of the jobs of async peers, one per event loop
    (made on first use in that loop; a worker process runs one loop)."""
    import asyncio  # noqa: PLC0415 (async peers only)

    import redis.asyncio  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    client = _ASYNC_JOB_CLIENTS.get(loop)
    if client is None:
        client = _ASYNC_JOB_CLIENTS[loop] = redis.asyncio.Redis.from_url(os.environ[URL_ENV])
    return client


async def noop_job_async() -> None:
    """The drain job of async peers: one awaited ``INCR``."""
    await async_job_redis().incr(DONE_KEY)


async def record_job_async(seq: int) -> None:
    """The lateness job of async peers: push its sequence number and start time."""
    started = time.time()
    await async_job_redis().rpush(RECORD_KEY, record_line(seq, started))


def record_line(seq: int, started: float) -> str:
    """What a ``record`` job pushes: its sequence number and start time."""
    return f"{seq} {started!r}"


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write one peer's report as JSON (NaN stays NaN, as in the delayq reports)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def sizes_dict(sizes: Sizes) -> dict[str, Any]:
    """The sizes, for the report."""
    return asdict(sizes)


# -- one peer, every measure --------------------------------------------------------------


class Peer:
    """What :func:`run_benchmark` needs of a framework: enqueue its two jobs (``noop``:
    one ``INCR`` of :data:`DONE_KEY`; ``record``: push :func:`record_line`) and start
    its worker. Subclasses live in ``<name>_bench.py``, beside the jobs their worker
    imports; ``variants`` maps each variant (``defaults``, ``tuned``...) to the
    settings it changes, as the report shows them."""

    name = ""
    version = ""
    #: The framework's defaults that matter here, as the report shows them.
    defaults: dict[str, Any] = {}  # noqa: RUF012 (read-only, overridden per subclass)
    #: Per variant: what it sets, as the report shows it ({} for the defaults).
    variants: dict[str, dict[str, Any]] = {"defaults": {}}  # noqa: RUF012
    #: The batch API's name, or "" where the peer has none.
    batch_api = ""

    def __init__(self, url: str, variant: str) -> None:
        self.url = url
        self.variant = variant

    def open(self) -> None:
        """Connect the producer (after the database was checked empty)."""

    def close(self) -> None:
        """Disconnect the producer."""

    def enqueue_noops(self, count: int) -> None:
        """Enqueue ``count`` no-op jobs, one call each."""
        raise NotImplementedError

    def enqueue_noop_batch(self, count: int) -> None:
        """Enqueue ``count`` no-op jobs in one call of the batch API."""
        raise NotImplementedError

    def enqueue_record(self, seq: int, delay: float) -> float:
        """Enqueue ``record(seq)`` due ``delay`` seconds from now; its due time (epoch
        seconds, ``time.time()`` read just before the enqueue call plus ``delay``)."""
        raise NotImplementedError

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        """The worker's command, its extra environment, and how the report names it."""
        raise NotImplementedError


def produce_records(
    enqueue: Callable[[int, float], float], plan: list[tuple[float, float]]
) -> dict[int, float]:
    """Enqueue the lateness jobs on schedule with ``enqueue(seq, delay)`` (which
    returns the job's due time, as :meth:`Peer.enqueue_record`); each one's due time
    (epoch s)."""
    due: dict[int, float] = {}
    started = time.monotonic()
    for seq, (offset, delay) in enumerate(plan):
        pause = started + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        due[seq] = enqueue(seq, delay)
    return due


def measure_enqueue(peer: Peer, sizes: Sizes) -> dict[str, Any]:
    """Enqueue ``drain_jobs`` no-op jobs: the first ``enqueues`` one by one, the rest
    through the batch API where there is one; the rate of each. The very first job
    is left out of the timing: it pays for the producer's first connection and, for
    some, its first imports."""
    peer.enqueue_noops(1)
    started = time.perf_counter()
    peer.enqueue_noops(sizes.enqueues - 1)
    out: dict[str, Any] = {
        "one_by_one_per_second": (sizes.enqueues - 1) / (time.perf_counter() - started)
    }
    rest = max(0, sizes.drain_jobs - sizes.enqueues)
    started = time.perf_counter()
    if peer.batch_api:
        for start in range(0, rest, sizes.batch):
            peer.enqueue_noop_batch(min(sizes.batch, rest - start))
        out["batch_per_second"] = rest / (time.perf_counter() - started) if rest else None
        out["batch_api"] = f"{peer.batch_api} x{sizes.batch}"
    else:
        peer.enqueue_noops(rest)
        out["batch_per_second"] = None
        out["batch_api"] = None
    return out


def run_benchmark(peer: Peer, sizes: Sizes) -> dict[str, Any]:
    """Every measure of ``peer`` on its empty database, flushed afterwards."""
    command, env, described = peer.worker()
    report: dict[str, Any] = {
        "peer": peer.name,
        "variant": peer.variant,
        "version": peer.version,
        "url": peer.url,
        "defaults": peer.defaults,
        "settings": peer.variants[peer.variant],
        "worker": described,
        "sizes": sizes_dict(sizes),
    }
    tag = f"{peer.name} {peer.variant}"
    with private_db(peer.url) as client, server_load(client, report):
        peer.open()
        try:
            print(f"{tag}: enqueue {sizes.drain_jobs} ...", file=sys.stderr)
            report["enqueue"] = measure_enqueue(peer, sizes)
            report["enqueue_per_second"] = report["enqueue"]["one_by_one_per_second"]
            log = LOCAL_RESULTS / f"{peer.name}-{peer.variant}-worker.log"
            worker = WorkerProcess(command, log, {"PYTHONPATH": str(HERE), **env})
            with worker:
                print(f"{tag}: drain ...", file=sys.stderr)
                report["drain"] = measure_drain(
                    worker,
                    lambda: int(client.get(DONE_KEY) or 0),
                    sizes.drain_jobs,
                    sizes.drain_timeout,
                )
                warm_up(client, worker, lambda: peer.enqueue_record(-1, 0.2))
                for key, jobs, seconds in (
                    ("lateness", sizes.late_jobs, sizes.late_seconds),
                    ("lateness_light", sizes.light_jobs, sizes.light_seconds),
                ):
                    print(f"{tag}: {key} ...", file=sys.stderr)
                    report[key] = measure_lateness(
                        client,
                        worker,
                        lambda plan: produce_records(peer.enqueue_record, plan),
                        lateness_plan(jobs, seconds),
                        sizes,
                    )
        finally:
            peer.close()
    return report


def main(peer_class: type[Peer], argv: list[str] | None = None) -> int:
    """The command line of every ``<name>_bench.py``: ``--url`` (an empty Redis
    database), ``--variant``, ``--quick``, ``--json``."""
    import argparse  # noqa: PLC0415 (only the command line needs it)

    parser = argparse.ArgumentParser(description=f"{peer_class.name} on Redis (benchmarks/peers)")
    parser.add_argument("--url", required=True, help="an empty Redis database")
    parser.add_argument("--variant", default="defaults", choices=sorted(peer_class.variants))
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_sigterm()
    path = args.json or LOCAL_RESULTS / f"{peer_class.name}-{args.variant}.json"
    write_report(
        path, run_benchmark(peer_class(args.url, args.variant), QUICK if args.quick else Sizes())
    )
    return 0

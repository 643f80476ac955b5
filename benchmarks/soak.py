"""An hour at steady load (issue 41, point 4): puts, cancels, reschedules and a Worker
at a steady rate on one backend, sampled every minute, and whether anything grows.

    .venv/bin/python benchmarks/soak.py --url URL [--minutes 60] [--rate 200]

``URL`` is taken as ``scale.py`` takes it (a fresh store of the scheme: a temporary
SQLite file, a unique Redis prefix or PostgreSQL schema, a private RabbitMQ node with
``delayq scheduler`` in a process of its own; ``--private`` runs PostgreSQL on a server of
its own, with PostgreSQL's default autovacuum).

Three kinds of process run for ``--minutes``:

- a producer (this script with ``--producer``) sends ``--rate`` task messages a second
  with ``App.send_many`` (a batch every 10 ms), each due in a delay drawn from 0 to
  ``--max-delay`` seconds; a second after a put due in more than 3 s, it cancels a tenth
  of those and reschedules another tenth (to a new delay drawn the same way), one call
  each;
- ``delayq worker`` (``--processes`` of them under its supervisor when more than one)
  runs the task, which writes its lateness (the run's start minus the message's due
  time) to a file of its process;
- on ``amqp://``, the ``delayq scheduler`` that ``scale.py``'s store starts.

Every ``--sample`` seconds (60) it prints a row: the runs and their lateness p50 / p99 /
max in that interval, the resident set of every delayq process, the store's bytes, the
open file descriptors and the sockets among them. After the producer stops it waits
for what is still scheduled to run, stops the Worker with SIGTERM and counts: every
put that was not cancelled ran exactly once (lost, duplicated, early). Then each
series' slope: a least-squares line over the samples of the run's second half, its
change over the run against the series' mean there; a series grows when that change
is above ``FLAT_SHARE`` of its mean and above the series' own small absolute bound
(``FLAT_FLOOR``: a few file descriptors, a few MiB). What fills to a bound and then
stays (a cache, a table bounded by age, the allocator's arenas: the amqp scheduler
took 28 minutes to reach its plateau) is not growth, and a leak grows in the second
half as in the first; the line over the whole run after its first interval is shown
beside it. A fall is shown, not counted as
growth (lateness falls when the machine's other load does). It writes
``benchmarks/results/soak-<scheme>.json``; it never asserts (``tests/e2e/test_soak.py``
runs a two-minute version and holds it to the counts and the bounds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _common import RESULTS_DIR, console, environment, percentile
from scale import STORES, private_postgres

#: A tick of the producer: ``rate / 100`` messages every 10 ms.
TICK_S = 0.01
#: A put due in more than this is a candidate for a cancel or a reschedule...
CHANGE_AFTER_S = 3.0
#: ... made this long after its put, by a tenth each.
CHANGE_DELAY_S = 1.0
CHANGE_SHARE = 0.1
#: A series grows when its fitted change over the run is above this share of its mean
#: and above its floor below.
FLAT_SHARE = 0.10
FLAT_FLOOR = {
    "rss": 8 * 1024 * 1024,
    "fds": 4,
    "sockets": 4,
    "store": 1024 * 1024,
    "late_p50": 1.0,
    "late_p99": 5.0,
}
APP = """
import os, time
from delayq import App, current_message

app = App(os.environ["SOAK_URL"])
_runs = open(os.path.join(os.environ["SOAK_DIR"], f"runs-{os.getpid()}.txt"), "a", buffering=1)


@app.task(queue="soak", max_attempts=1)
def soak(n: int) -> None:
    message = current_message()
    _runs.write(f"{time.time() * 1000.0 - message.due_at:.3f} {message.id}\\n")
"""


# -- the producer (a process of its own) -------------------------------------------------


def produce(args: argparse.Namespace) -> int:
    """Send at ``args.rate`` for ``args.seconds``; the counts to ``args.counts`` (JSON,
    rewritten every second and at the end)."""
    sys.path.insert(0, args.dir)
    from soakapp import app, soak  # type: ignore[import-not-found]  # noqa: PLC0415

    rng = random.Random(os.getpid())
    per_tick = max(1, round(args.rate * TICK_S))
    counts = {"put": 0, "cancelled": 0, "rescheduled": 0, "changes_refused": 0, "n": 0}
    changes: deque[tuple[float, str, str]] = deque()  # (when, what, id)
    end = time.monotonic() + args.seconds
    next_tick = time.monotonic()
    next_write = next_tick + 1.0
    queue = app.queue("soak")
    while time.monotonic() < end:
        batch = []
        delays = []
        for _ in range(per_tick):
            delay = rng.uniform(0.0, args.max_delay)
            delays.append(delay)
            batch.append(soak.message(counts["n"], delay=delay))
            counts["n"] += 1
        ids = app.send_many(batch)
        counts["put"] += len(ids)
        now = time.monotonic()
        for id, delay in zip(ids, delays, strict=True):
            if delay > CHANGE_AFTER_S:
                draw = rng.random()
                if draw < CHANGE_SHARE:
                    changes.append((now + CHANGE_DELAY_S, "cancel", id))
                elif draw < 2 * CHANGE_SHARE:
                    changes.append((now + CHANGE_DELAY_S, "reschedule", id))
        while changes and changes[0][0] <= now:
            _, what, id = changes.popleft()
            if what == "cancel":
                done = queue.cancel(id)
                counts["cancelled"] += done
            else:
                done = queue.reschedule(id, delay=rng.uniform(0.0, args.max_delay))
                counts["rescheduled"] += done
            counts["changes_refused"] += not done
        if now >= next_write:
            _write_counts(Path(args.counts), counts)
            next_write += 1.0
        next_tick += TICK_S
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_tick = time.monotonic()  # behind: never a burst to catch up
    _write_counts(Path(args.counts), {**counts, "done": True})
    app.close()
    return 0


def _write_counts(path: Path, counts: dict[str, Any]) -> None:
    part = path.with_suffix(".part")
    part.write_text(json.dumps(counts))
    part.replace(path)


# -- what is read of the processes -------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _process(pid: int) -> dict[str, int] | None:
    """The resident set (bytes), open descriptors and sockets among them of ``pid``."""
    try:
        rss = None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    if rss is None:  # a zombie: it has ended
        return None
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return {"rss": rss, "fds": len(fds), "sockets": sockets}


class Runs:
    """The run files the task writes, read as they grow."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.ids: dict[str, int] = {}
        self.early = 0

    def read(self) -> list[float]:
        """The lateness (ms) of every run written since the last read."""
        late: list[float] = []
        for path in sorted(self.directory.glob("runs-*.txt")):
            with path.open() as f:
                f.seek(self.offsets.get(path, 0))
                text = f.read()
            complete = text.rfind("\n") + 1  # a line half written is read next time
            self.offsets[path] = self.offsets.get(path, 0) + len(text[:complete].encode())
            for line in text[:complete].splitlines():
                value, id = line.split()
                late.append(float(value))
                self.ids[id] = self.ids.get(id, 0) + 1
                self.early += float(value) < 0
        return late


# -- the run -----------------------------------------------------------------------------


def _slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(x, y)`` points (0 with fewer than two x)."""
    if len({x for x, _ in points}) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def growth(samples: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """Each series' fitted change over ``seconds`` and whether it grows: fitted over
    the second half of the run (``change``: what fills a bounded store and then stays,
    a cache, a table bounded by age, the allocator's arenas, is not growth; a leak
    grows in the second half as in the first), and over the whole run after its
    first interval (``whole``, shown)."""
    series: dict[str, list[tuple[float, float]]] = {}
    half = samples[-1]["t"] / 2 if samples else 0.0
    for sample in samples[1:]:  # the first interval is the warm-up
        t = sample["t"]
        for key in ("late_p50", "late_p99"):
            if sample[key] is not None:
                series.setdefault(key, []).append((t, sample[key]))
        series.setdefault("store", []).append((t, sample["store"]))
        for name, proc in sample["processes"].items():
            for key in ("rss", "fds", "sockets"):
                series.setdefault(f"{name} {key}", []).append((t, proc[key]))
    out = []
    for name, points in series.items():
        kind = name.rsplit(" ", 1)[-1]
        late = [(t, y) for t, y in points if t >= half]
        if len(late) < 2:
            late = points[-2:]
        mean = statistics.fmean(y for _, y in late)
        change = _slope(late) * seconds
        bound = max(FLAT_SHARE * abs(mean), FLAT_FLOOR[kind])
        out.append(
            {
                "series": name,
                "first": points[0][1],
                "last": points[-1][1],
                "mean": mean,
                "whole": _slope(points) * seconds,
                "change": change,
                "bound": bound,
                "grows": change > bound,
            }
        )
    return out


def _shown(kind: str, value: float) -> str:
    if kind == "rss" or kind == "store":
        return f"{value / 1048576:.1f} MiB"
    if kind.startswith("late"):
        return f"{value:.2f} ms"
    return f"{value:.1f}"


def soak(args: argparse.Namespace) -> dict[str, Any]:
    scheme = urlsplit(args.url).scheme.lower().split("+")[0]
    if scheme not in STORES:
        raise SystemExit(f"soak.py: no store for {scheme}:// (one of {', '.join(STORES)})")
    seconds = args.minutes * 60.0
    with ExitStack() as stack:
        url = stack.enter_context(private_postgres(args.private, args.url))
        store = stack.enter_context(STORES[scheme](url))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="delayq-soak-")))
        (tmp / "soakapp.py").write_text(APP)
        env = {**os.environ, "SOAK_URL": store.url, "SOAK_DIR": str(tmp)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp), env.get("PYTHONPATH")]))
        delayq = str(Path(sys.executable).with_name("delayq"))
        worker_cmd = [delayq, "worker", "soakapp:app", "--log-level", "warning"]
        if args.processes > 1:
            worker_cmd += ["--processes", str(args.processes)]
        log = (tmp / "worker.log").open("ab")
        stack.callback(log.close)
        worker = subprocess.Popen(worker_cmd, env=env, cwd=tmp, stdout=log, stderr=log)
        counts_path = tmp / "counts.json"
        producer = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--producer",
                "--dir",
                str(tmp),
                "--counts",
                str(counts_path),
                "--rate",
                str(args.rate),
                "--max-delay",
                str(args.max_delay),
                "--seconds",
                str(seconds),
            ],
            env=env,
        )
        runs = Runs(tmp)
        samples: list[dict[str, Any]] = []
        started = time.monotonic()
        try:
            # The producer runs ``seconds`` from its own start, a little after this one:
            # every sample falls while it runs.
            for k in range(1, int(seconds / args.sample + 1e-9) + 1):
                time.sleep(max(0.0, started + k * args.sample - time.monotonic()))
                samples.append(_sample(time.monotonic() - started, runs, store, worker, producer))
                _print_sample(samples[-1])
                if producer.poll() is not None:
                    raise SystemExit(f"soak.py: the producer exited with {producer.returncode}")
            if producer.wait(args.sample + 60.0) != 0:
                raise SystemExit(f"soak.py: the producer exited with {producer.returncode}")
            counts = json.loads(counts_path.read_text())
            expected = counts["put"] - counts["cancelled"]
            deadline = time.monotonic() + args.max_delay + 30.0
            while len(runs.ids) < expected and time.monotonic() < deadline:
                time.sleep(0.5)
                runs.read()
        finally:
            for process in (producer, worker):
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in (producer, worker):
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        runs.read()
    ran = len(runs.ids)
    total_runs = sum(runs.ids.values())
    return {
        "url_scheme": scheme,
        "minutes": args.minutes,
        "rate": args.rate,
        "max_delay_s": args.max_delay,
        "processes": args.processes,
        "counts": counts,
        "expected_runs": expected,
        "ran": ran,
        "lost": max(0, expected - ran),
        "duplicated": total_runs - ran,
        "early": runs.early,
        "samples": samples,
        "growth": growth(samples, seconds),
    }


def _sample(
    t: float,
    runs: Runs,
    store: Any,
    worker: subprocess.Popen[bytes],
    producer: subprocess.Popen[bytes],
) -> dict[str, Any]:
    late = sorted(runs.read())
    processes: dict[str, dict[str, int]] = {}
    named = [("producer", producer.pid), ("worker", worker.pid)]
    named += [(f"worker child {i}", pid) for i, pid in enumerate(_children(worker.pid))]
    named += list(store.pids().items())
    for name, pid in named:
        found = _process(pid)
        if found is not None:
            processes[name] = found
    return {
        "t": round(t, 1),
        "runs": len(late),
        "late_p50": percentile(late, 0.5) if late else None,
        "late_p99": percentile(late, 0.99) if late else None,
        "late_max": late[-1] if late else None,
        "early": runs.early,
        "store": store.live_bytes(),
        "processes": processes,
    }


def _print_sample(sample: dict[str, Any]) -> None:
    late = (
        "-"
        if sample["late_p50"] is None
        else f"{sample['late_p50']:.2f} / {sample['late_p99']:.2f} / {sample['late_max']:.2f} ms"
    )
    procs = "  ".join(
        f"{name} {p['rss'] / 1048576:.1f} MiB {p['fds']} fd {p['sockets']} sock"
        for name, p in sample["processes"].items()
    )
    console.print(
        f"t={sample['t']:7.1f}s runs {sample['runs']:6d}  late p50/p99/max {late}  "
        f"store {sample['store'] / 1048576:.2f} MiB  {procs}"
    )


def report(result: dict[str, Any]) -> None:
    from rich.table import Table  # noqa: PLC0415

    table = Table(
        title=f"soak: {result['url_scheme']}, {result['minutes']} min, {result['rate']}/s",
        title_justify="left",
        header_style="bold",
    )
    columns = ("series", "first", "last", "fitted, whole run", "fitted, 2nd half", "bound")
    for column in (*columns, "grows"):
        table.add_column(column, justify="left" if column == "series" else "right")
    for row in result["growth"]:
        kind = row["series"].rsplit(" ", 1)[-1]
        table.add_row(
            row["series"],
            _shown(kind, row["first"]),
            _shown(kind, row["last"]),
            _shown(kind, row["whole"]),
            _shown(kind, row["change"]),
            _shown(kind, row["bound"]),
            "[bold red]YES[/bold red]" if row["grows"] else "no",
        )
    console.print(table)
    counts = result["counts"]
    console.print(
        f"put {counts['put']}, cancelled {counts['cancelled']}, rescheduled "
        f"{counts['rescheduled']}; expected runs {result['expected_runs']}, ran "
        f"{result['ran']}: lost {result['lost']}, duplicated {result['duplicated']}, "
        f"early {result['early']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the backend (its scheme chooses the store)")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=200.0, help="puts a second")
    parser.add_argument("--max-delay", type=float, default=60.0, help="seconds")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between rows")
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--private", action="store_true", help="PostgreSQL of its own")
    parser.add_argument("--json", type=Path, help="where to write the result")
    parser.add_argument("--producer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--counts", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.producer:
        return produce(args)
    if not args.url:
        parser.error("--url is required")
    if args.rate <= 0 or args.minutes <= 0 or args.sample <= 0 or args.max_delay < 0:
        parser.error("--rate, --minutes and --sample must be positive, --max-delay not negative")
    # A SIGTERM ends the run as Ctrl-C does: the producer, the Worker and the store's
    # processes and server are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = soak(args)
    report(result)
    result["environment"] = environment()
    path = args.json or RESULTS_DIR / f"soak-{result['url_scheme']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark of ``delayq serve`` (issue 6): HTTP put rate and callback lateness.

Run ``.venv/bin/python benchmarks/serve.py`` (sqlite in a temporary directory and
redis on ``$DELAYQ_BENCH_REDIS``, default ``redis://127.0.0.1:6379/0``, under a
unique key prefix removed afterwards), or ``--url URL`` for one backend; ``--quick``
makes every section smaller. For each backend it starts ``delayq serve`` as a
subprocess on a free port and measures:

a. HTTP put rate: 16 concurrent clients over keep-alive connections ``POST
   /v1/queues/{q}/messages`` with ``{"payload": {...}, "delay": 60}``: messages per
   second. The client is ``wrk`` (one thread, 16 connections, a Lua script for the
   body) when it is on PATH, else the lean client: raw HTTP/1.1 over 16 asyncio
   stream connections in a separate process (``--lean-client``), so that the client
   is not what is measured. The table says which one ran.
b. Callback lateness: 2,000 messages with a callback to a receiver in this process
   (a small asyncio HTTP server on a free port), due one every 5 ms over 10 s, put
   through the API (by the lean client) ahead of their due time. Lateness = the
   receiver's clock when the request arrives minus the message's due time (``at``,
   exact to the ms): p50, p99 and max in ms; lost, duplicates and early must all be 0.
c. Dispatch throughput: 5,000 callbacks all due at the same instant (put ahead of it)
   to a receiver in this process that answers 200 at once, by a fresh ``delayq
   serve`` with the default ``--dispatch-prefetch`` and again with
   ``--dispatch-prefetch 0`` (no prefetch) when this tree has the option: callbacks
   per second from the first arrival to the last, and the CPU time of the serve
   process (every thread) per callback over that window (the "CPU/job" column).

It prints a table (measure, target, PASS/MISS) and writes JSON to
``benchmarks/results/serve[-<scheme>][-quick].json``. It never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from _common import (
    Measure,
    bench_urls,
    console,
    environment,
    gc_frozen,
    parse_sections,
    percentile,
    print_table,
    result_path,
    shown,
    write_json,
)
from delayq._duration import seconds_to_ms

#: Targets from the issue: puts/s over HTTP on redis; callback p99 lateness (ms).
PUT_TARGETS = {"redis": 3_000.0}
P99_TARGET_MS = 20.0
CLIENTS = 16
STARTUP_TIMEOUT = 30.0
SERVE_COMMAND = [sys.executable, "-c", "from delayq.cli import main; main()", "serve"]


@dataclass
class Sizes:
    """How much each section does."""

    puts: int = 10_000
    put_seconds: float = 5.0
    callbacks: int = 2_000
    callback_seconds: float = 10.0
    dispatch: int = 5_000


QUICK = Sizes(puts=2_000, put_seconds=2.0, callbacks=400, callback_seconds=2.0, dispatch=1_000)


# -- the server under test ------------------------------------------------------------


@dataclass
class Served:
    """A running ``delayq serve``: its base URL and its callback queue."""

    base: str
    callback_queue: str
    process: subprocess.Popen[str]


@contextmanager
def delayq_serve(url: str, *options: str) -> Iterator[Served]:
    """Start ``delayq serve`` on a free port (loopback callbacks allowed, with
    ``options``) and stop it with SIGTERM afterwards."""
    callback_queue = f"bench-cb-{uuid.uuid4().hex[:8]}"
    command = [
        *SERVE_COMMAND,
        "--url", url, "--port", "0", "--callback-queue", callback_queue,
        "--allow-loopback-callbacks", "--signing-secret", secrets.token_hex(16), *options,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()
    log: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.append(line)
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    base = None
    while base is None:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            raise SystemExit("delayq serve did not start:\n" + "".join(log)) from None
        found = re.search(r"dashboard: (http://\S+?)/?$", line.strip())
        if found:
            base = found.group(1)
    try:
        yield Served(base, callback_queue, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the clients ------------------------------------------------------------------------


async def _lean_connection(
    host: str, port: int, path: str, bodies: Iterator[bytes], failures: list[str]
) -> None:
    """One keep-alive connection: POST the next body, read the answer, repeat."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()
    try:
        for body in bodies:
            writer.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))
            answer = await reader.readuntil(b"\r\n\r\n")
            status = int(answer[9:12])
            found = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", answer)
            if found is None:
                raise SystemExit(f"answer without Content-Length: {answer[:200]!r}")
            text = await reader.readexactly(int(found.group(1)))
            if status not in (200, 201):
                failures.append(f"{status} {text[:200]!r}")
    finally:
        writer.close()


async def _lean_put_all(base: str, path: str, bodies: list[bytes]) -> dict[str, Any]:
    parts = urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    cursor = iter(bodies)
    failures: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(_lean_connection(host, port, path, cursor, failures) for _ in range(CLIENTS))
    )
    return {"seconds": time.perf_counter() - started, "failures": failures}


def lean_client_main() -> int:
    """``--lean-client``: read ``{"base", "path", "bodies"}`` (JSON) from stdin, POST
    every body over CLIENTS keep-alive connections, print ``{"seconds", "failures"}``."""
    job = json.load(sys.stdin)
    bodies = [json.dumps(body, separators=(",", ":")).encode() for body in job["bodies"]]
    try:
        import uvloop  # noqa: PLC0415

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    print(json.dumps(runner(_lean_put_all(job["base"], job["path"], bodies))))
    return 0


def lean_put_all(base: str, path: str, bodies: list[dict[str, Any]]) -> float:
    """POST every body with the lean client in its own process; the seconds it took."""
    job = json.dumps({"base": base, "path": path, "bodies": bodies})
    done = subprocess.run(
        [sys.executable, __file__, "--lean-client"],
        input=job,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the lean client failed:\n{done.stderr}")
    result = json.loads(done.stdout)
    if result["failures"]:
        failures = result["failures"]
        raise SystemExit(f"{len(failures)} puts failed, e.g. {failures[0]}")
    return float(result["seconds"])


_WRK_SCRIPT = """wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
"""


def wrk_put_rate(base: str, path: str, body: dict[str, Any], seconds: float) -> tuple[int, float]:
    """``wrk`` for ``seconds`` (one thread, CLIENTS connections): (puts, seconds)."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    with tempfile.TemporaryDirectory(prefix="delayq-bench-wrk-") as tmp:
        script = Path(tmp) / "put.lua"
        script.write_text(_WRK_SCRIPT % json.dumps(body))
        command = [wrk, "-t1", f"-c{CLIENTS}", f"-d{seconds:g}s", "-s", str(script)]
        done = subprocess.run([*command, base + path], capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    counted = re.search(r"(\d+) requests in ([\d.]+)(m?s)", output)
    if done.returncode != 0 or counted is None:
        raise SystemExit(f"wrk failed:\n{output}")
    if "Non-2xx" in output or "Socket errors" in output:
        raise SystemExit(f"wrk saw failed puts:\n{output}")
    took = float(counted.group(2)) / (1000.0 if counted.group(3) == "ms" else 1.0)
    return int(counted.group(1)), took


# -- a: put rate ------------------------------------------------------------------------


def section_put_rate(served: Served, scheme: str, sizes: Sizes) -> list[Measure]:
    """Section a."""
    name = f"bench-put-{uuid.uuid4().hex[:8]}"
    path = f"/v1/queues/{name}/messages"
    httpx.get(f"{served.base}/healthz", timeout=30)
    if shutil.which("wrk"):
        client = "wrk"
        body = {"payload": {"n": 1, "kind": "bench"}, "delay": 60}
        puts, seconds = wrk_put_rate(served.base, path, body, sizes.put_seconds)
    else:
        client = "lean client"
        bodies = [{"payload": {"n": i, "kind": "bench"}, "delay": 60} for i in range(sizes.puts)]
        puts, seconds = sizes.puts, lean_put_all(served.base, path, bodies)
    httpx.post(f"{served.base}/v1/queues/{name}/purge", json={}, timeout=30)
    rate = puts / seconds
    target = PUT_TARGETS.get(scheme)
    return [
        Measure(
            "a",
            f"HTTP put, {CLIENTS} clients, keep-alive ({client})",
            rate,
            "items/s",
            f">= {target:,.0f}/s" if target else "",
            None if target is None else rate >= target,
            note=f"{puts:,} puts in {seconds:.2f} s",
            extra={"client": client},
        )
    ]


# -- b: callback lateness ---------------------------------------------------------------


class Receiver:
    """Records when each callback arrives (epoch ms, per message id); answers 200."""

    def __init__(self) -> None:
        self.received: dict[str, list[float]] = {}
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._connections:  # idle keep-alive connections
                writer.close()
            await asyncio.gather(*self._connections.values(), return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[writer] = task
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                now_ms = time.time() * 1000.0
                length, message_id = 0, ""
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    key = name.strip().lower()
                    if key == "content-length":
                        length = int(value)
                    elif key == "x-delayq-message-id":
                        message_id = value.strip()
                if length:
                    await reader.readexactly(length)
                self.received.setdefault(message_id, []).append(now_ms)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.pop(writer, None)
            writer.close()


async def run_callbacks(served: Served, sizes: Sizes, put_rate: float) -> dict[str, Any]:
    """Put the callbacks (ahead of time: the first falls due once all are put, at the
    put rate of section a with room to spare) and wait for them all."""
    receiver = Receiver()
    await receiver.start()
    step = sizes.callback_seconds / sizes.callbacks
    # Section a's rate may be wrk's, faster than the lean client's: count 1,000/s at most.
    lead = 1.0 + 1.5 * sizes.callbacks / min(put_rate, 1_000.0)
    first_due = time.time() + lead
    bodies, due_by_id = [], {}
    for i in range(sizes.callbacks):
        at = round(first_due + i * step, 3)
        message_id = f"cb-{i}-{uuid.uuid4().hex[:8]}"
        due_by_id[message_id] = seconds_to_ms(at)
        bodies.append(
            {
                "id": message_id,
                "payload": {"n": i},
                "at": at,
                "callback": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
            }
        )
    path = f"/v1/queues/{served.callback_queue}/messages"
    put_seconds = await asyncio.to_thread(lean_put_all, served.base, path, bodies)
    slack = first_due - time.time()
    give_up = time.monotonic() + lead + sizes.callback_seconds + 30.0
    while len(receiver.received) < len(bodies) and time.monotonic() < give_up:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # duplicates would come now
    await receiver.stop()
    return {"received": receiver.received, "due": due_by_id, "put_seconds": put_seconds,
            "slack": slack}  # fmt: skip


def section_callbacks(served: Served, sizes: Sizes, put_rate: float) -> list[Measure]:
    """Section b."""
    # The receiver's process is the measuring tool, not delayq: frozen, its collector
    # does not stop it mid-run and stamp callbacks late (delayq serve freezes its own).
    with gc_frozen():
        report = asyncio.run(run_callbacks(served, sizes, put_rate))
    received: dict[str, list[float]] = report["received"]
    due: dict[str, int] = report["due"]
    late = sorted(t - due[id] for id, times in received.items() if id in due for t in times)
    lost = sum(1 for id in due if id not in received)
    duplicates = sum(len(times) - 1 for times in received.values())
    early = sum(1 for value in late if value < 0)
    p50 = statistics.median(late) if late else float("nan")
    p99 = percentile(late, 0.99)
    worst = late[-1] if late else float("nan")
    slack = report["slack"]
    note = (
        f"puts ended {slack:.1f} s before the first due"
        if slack >= 0
        else f"puts ran {-slack:.1f} s into the due window"
    )
    tag = f"callback lateness ({sizes.callbacks:,} over {sizes.callback_seconds:g} s)"
    return [
        Measure("b", f"{tag}: p50", p50, "ms", note=note),
        Measure("b", f"{tag}: p99", p99, "ms", f"<= {P99_TARGET_MS:g} ms", p99 <= P99_TARGET_MS),
        Measure("b", f"{tag}: max", worst, "ms"),
        Measure("b", "callbacks lost", lost, "count", "0", lost == 0),
        Measure("b", "callbacks delivered twice", duplicates, "count", "0", duplicates == 0),
        Measure("b", "callbacks early", early, "count", "0", early == 0),
    ]


# -- c: dispatch throughput --------------------------------------------------------------


def has_prefetch_option() -> bool:
    """Whether this tree's ``delayq serve`` has ``--dispatch-prefetch``."""
    done = subprocess.run([*SERVE_COMMAND, "--help"], capture_output=True, text=True, check=False)
    return "--dispatch-prefetch" in done.stdout


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def run_dispatch(served: Served, count: int) -> dict[str, Any]:
    """Put ``count`` callbacks due at one instant (after the puts), wait for them all;
    the receiver's arrivals and the serve process's CPU seconds over the drain."""
    receiver = Receiver()
    await receiver.start()
    lead = 1.0 + 1.5 * count / 1_000.0
    due = round(time.time() + lead, 3)
    url = f"http://127.0.0.1:{receiver.port}/hook"
    bodies = [{"id": f"tp-{i}-{uuid.uuid4().hex[:8]}", "payload": {"n": i}, "at": due,
               "callback": {"url": url}} for i in range(count)]  # fmt: skip
    path = f"/v1/queues/{served.callback_queue}/messages"
    await asyncio.to_thread(lean_put_all, served.base, path, bodies)
    slack = due - time.time()
    await asyncio.sleep(max(0.0, slack - 0.2))
    cpu_before = process_cpu(served.process.pid)
    give_up = time.monotonic() + slack + 60.0
    while len(receiver.received) < count and time.monotonic() < give_up:
        await asyncio.sleep(0.01)
    cpu = process_cpu(served.process.pid) - cpu_before
    await asyncio.sleep(0.5)  # duplicates would come now
    await receiver.stop()
    return {"received": receiver.received, "cpu": cpu, "slack": slack}


def section_dispatch(url: str, sizes: Sizes) -> list[Measure]:
    """Section c."""
    settings = [("default prefetch", ())]
    if has_prefetch_option():
        settings.append(("--dispatch-prefetch 0", ("--dispatch-prefetch", "0")))
    measures = []
    for label, options in settings:
        with delayq_serve(url, *options) as served, gc_frozen():
            report = asyncio.run(run_dispatch(served, sizes.dispatch))
        received: dict[str, list[float]] = report["received"]
        times = sorted(t for ts in received.values() for t in ts)
        span = (times[-1] - times[0]) / 1000.0 if len(times) > 1 else float("nan")
        rate = (len(times) - 1) / span if span > 0 else 0.0
        lost = sizes.dispatch - len(received)
        duplicates = len(times) - len(received)
        note = f"{len(times):,} in {span:.2f} s; lost {lost}, twice {duplicates}"
        if report["slack"] < 0:
            note += f"; puts ran {-report['slack']:.1f} s late"
        measures.append(
            Measure("c", f"dispatch, {sizes.dispatch:,} due at once ({label})", rate, "items/s",
                    note=note, cpu_per_job=report["cpu"] / max(1, len(times)) * 1e6)
        )  # fmt: skip
    return measures


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the sections per backend, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="one backend URL to measure (default: sqlite and redis)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--sections", help="a (with b), c; default all")
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    parser.add_argument("--lean-client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lean_client:
        return lean_client_main()
    sizes = QUICK if args.quick else Sizes()
    chosen = parse_sections(args.sections, ("a", "c"))
    path: Path = args.json or result_path("serve", args.url, args.quick)
    env = environment()
    started = time.perf_counter()
    measures: list[Measure] = []
    runs: list[dict[str, Any]] = []
    with bench_urls(args.url, "serve") as urls:
        for url in urls:
            scheme = urlsplit(url).scheme.lower()
            t0 = time.perf_counter()
            found: list[Measure] = []
            if "a" in chosen:
                console.print(f"{scheme}: starting delayq serve ...", style="dim")
                with delayq_serve(url) as served:
                    console.print(f"{scheme}: a. put rate ...", style="dim")
                    found += section_put_rate(served, scheme, sizes)
                    console.print(f"{scheme}: b. callback lateness ...", style="dim")
                    found += section_callbacks(served, sizes, found[0].value)
            if "c" in chosen:
                console.print(f"{scheme}: c. dispatch throughput ...", style="dim")
                found += section_dispatch(url, sizes)
            for measure in found:
                measure.section = f"{measure.section} {scheme}"
            measures.extend(found)
            runs.append({"url": shown(url), "seconds": time.perf_counter() - t0})
    total = time.perf_counter() - started
    print_table(f"delayq serve benchmark ({total:.0f} s)", measures)
    write_json(
        path,
        {
            "benchmark": "serve",
            "runs": runs,
            "mode": "quick" if args.quick else "full",
            "sizes": asdict(sizes),
            "clients": CLIENTS,
            "environment": env,
            "total_seconds": total,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

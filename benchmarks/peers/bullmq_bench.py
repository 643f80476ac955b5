"""BullMQ (Node.js) on Redis, defaults and tuned (see ``_harness`` for what is
measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv`` after ``npm ci`` in ``bullmq/``
(from its pinned ``package-lock.json``); by hand::

    (cd benchmarks/peers/bullmq && npm ci)
    benchmarks/peers/.venv/bin/python benchmarks/peers/bullmq_bench.py \\
        --url redis://127.0.0.1:6379/7 [--variant tuned] [--quick] [--json out.json]

``bullmq/peer.mjs`` does BullMQ's side: a producer process this script drives over
its stdin (``Queue.add``, ``Queue.add(..., {delay})`` and the batch API
``Queue.addBulk``; the producer reads the due time itself, just before the add,
from ``performance.timeOrigin + performance.now()``) and the worker, ``new
Worker(...)`` with its defaults (``concurrency`` 1; delayed jobs wait in a sorted
set, the worker blocks until the next one is due, in whole milliseconds of the
producer's clock), or ``concurrency`` 50 for ``tuned`` (the docs' example for I/O-bound jobs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any, ClassVar

from _harness import HERE, URL_ENV, Peer, main

NODE_DIR = HERE / "bullmq"


def bullmq_version() -> str:
    import json  # noqa: PLC0415

    package = NODE_DIR / "node_modules" / "bullmq" / "package.json"
    return str(json.loads(package.read_text())["version"]) if package.exists() else "?"


class Bullmq(Peer):
    name = "bullmq"
    version = bullmq_version()
    defaults: ClassVar[dict[str, Any]] = {
        "concurrency": 1,
        "removeOnComplete": "false (completed jobs are kept)",
        "delayed jobs": "a sorted set; the worker blocks until the next due one",
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"concurrency": 50},
    }
    batch_api = "Queue.addBulk"

    def node(self) -> str:
        node = shutil.which("node")
        if node is None:
            raise SystemExit("bullmq needs Node.js (node on PATH)")
        return node

    def open(self) -> None:
        env = {URL_ENV: self.url, "PEERS_VARIANT": self.variant}
        import os  # noqa: PLC0415

        self.producer = subprocess.Popen(
            [self.node(), "peer.mjs", "producer"],
            cwd=NODE_DIR,
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def ask(self, line: str) -> str:
        assert self.producer.stdin is not None
        assert self.producer.stdout is not None
        self.producer.stdin.write(line + "\n")
        answer = self.producer.stdout.readline().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"bullmq producer: {line!r} -> {answer!r}")
        return answer

    def close(self) -> None:
        assert self.producer.stdin is not None
        self.producer.stdin.close()
        try:
            self.producer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.producer.kill()
            self.producer.wait()

    def enqueue_noops(self, count: int) -> None:
        self.ask(f"noops {count}")

    def enqueue_noop_batch(self, count: int) -> None:
        self.ask(f"bulk {count}")

    def enqueue_record(self, seq: int, delay: float) -> float:
        return float(self.ask(f"record {seq} {delay!r}"))

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        command = [self.node(), str(NODE_DIR / "peer.mjs"), "worker"]
        env = {URL_ENV: self.url, "PEERS_VARIANT": self.variant}
        concurrency = 50 if self.variant == "tuned" else 1
        return command, env, f"node peer.mjs worker (new Worker, concurrency {concurrency})"


if __name__ == "__main__":
    sys.exit(main(Bullmq))

"""A private RabbitMQ node and a ``delayq scheduler`` process, shared by the benchmarks
that measure ``amqp://`` on a node of their own (``amqp_memory.py``, ``scale.py``).

The node comes from ``tests/backends/_rabbitmq_nodes.py`` (its own ports, data
directory and cookie, in a temporary directory), so the shared node is neither filled
nor measured with other work's queues.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from backends._rabbitmq_nodes import RabbitNodes  # noqa: E402
from delayq.backends.amqp import NoScheduler  # noqa: E402
from delayq.durable import Queue  # noqa: E402

__all__ = [
    "CTL",
    "Node",
    "RabbitNodes",
    "cpu_seconds",
    "rss",
    "start_scheduler",
    "stop",
    "tree_bytes",
]

CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss(pid: int) -> int:
    """The resident set of process ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def tree_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory`` (their sizes, not their blocks)."""
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            try:
                total += (Path(parent) / name).stat().st_size
            except FileNotFoundError:
                continue  # a segment or a temporary file gone meanwhile
    return total


class Node:
    """The private node and what is read of it."""

    def __init__(self, nodes: RabbitNodes) -> None:
        self.nodes = nodes
        self.home = nodes.directory / "node0"

    def beam(self) -> int:
        return int((self.home / "pid").read_text().strip())

    def erlang_memory(self) -> int | None:
        """``erlang:memory(total)`` of the node, bytes (None: rabbitmqctl failed)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        env["LANG"] = "C.UTF-8"
        done = subprocess.run(
            [CTL, "-n", self.nodes.names[0], "eval", "erlang:memory(total)."],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        try:
            return int(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"rabbitmqctl: {done.stdout}{done.stderr}", file=sys.stderr)
            return None

    def disk(self) -> int:
        return tree_bytes(self.home / "mnesia")


def start_scheduler(url: str, log: Path) -> subprocess.Popen[bytes]:
    """``delayq scheduler`` on ``url``, once it answers a request."""
    command = [str(Path(sys.executable).with_name("delayq")), "scheduler", "--url", url]
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 60
    with Queue(f"{url}&scheduler=off", name="ready") as probe:
        while True:
            try:
                probe.stats()
                return process
            except NoScheduler:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"delayq scheduler did not start: see {log}") from None


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

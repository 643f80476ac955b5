"""A ``redis-server`` of one test alone, for tests that crash and restart it.

:class:`RedisProcess` runs the ``redis-server`` binary on a free port of 127.0.0.1 with
its data in a directory of the test, with whatever persistence settings the test asks
for. It can be stopped gracefully, killed with SIGKILL (no shutdown, no final fsync),
and started again on the same port and directory, so the restarted server loads what the
killed one left on disk. It never touches the shared Redis on port 6379.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis

from _ports import free_port
from delayq.durable import AsyncQueue, Queue

__all__ = ["RedisProcess", "WaitingConsumer", "free_port", "unavailable", "wait_ready"]

#: How long a server may take to accept commands (loading its AOF included).
READY_TIMEOUT = 10.0


def unavailable(reason: str) -> NoReturn:
    """Skip (no server can be run), or fail when ``$DELAYQ_REQUIRE`` lists redis."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if "redis" in required or "all" in required:
        pytest.fail(f"redis is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"redis unavailable: {reason}")


def wait_ready(process: subprocess.Popen[bytes], url: str, log_tail: Callable[[], str]) -> None:
    """Return once the ``redis-server`` of ``process`` answers PING at ``url`` (its
    data loaded); RuntimeError (with ``log_tail()``) when it exited first."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start:\n{log_tail()}")
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    finally:
        client.close()


#: How far above a Redis Cluster node's port its cluster bus listens.
CLUSTER_BUS = 10000


class RedisProcess:
    """One private ``redis-server``: ``start``, ``kill`` (SIGKILL), ``start`` again.

    ``options`` are extra command-line settings (``("--appendonly", "yes", ...)``); the
    port, the bind address and ``--dir`` are set here, and logs go to ``redis.log`` in
    the directory (shown by :meth:`log_tail` when something fails).
    """

    def __init__(self, directory: Path, options: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("no redis-server binary on PATH")
        self.binary = binary
        self.directory = directory
        self.options = list(options)
        # A cluster node also binds its bus, its port + 10000: drawn free and below the
        # ephemeral range too (a bus port there was once taken by an outgoing connection).
        self.port = free_port(companion=CLUSTER_BUS if "--cluster-enabled" in options else 0)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Run the server and return once it answers PING (its data loaded)."""
        if self.process is not None:
            raise RuntimeError("the server is already running")
        command = [
            self.binary,
            *("--port", str(self.port), "--bind", "127.0.0.1"),
            *("--dir", str(self.directory), "--logfile", str(self.log)),
            *self.options,
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(self.process, self.url, self.log_tail)
        except RuntimeError:
            self.process = None
            raise

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        """Stop the server if it runs (SIGTERM, then SIGKILL if it lingers)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        """A plain redis-py client of this server (close it after use)."""
        return redis.Redis.from_url(self.url)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class WaitingConsumer:
    """One ``reserve(wait=wait)`` on queue ``name`` of ``url`` through the ``face``
    ("sync" or "async"), in a daemon thread started at once: what it got, what it raised."""

    def __init__(self, url: str, name: str, face: str, wait: float) -> None:
        self.got: list[Any] = []
        self.errors: list[BaseException] = []
        self._url, self._name, self._face, self._wait = url, name, face, wait
        self.thread = threading.Thread(target=self._consume, daemon=True)
        self.thread.start()

    def _consume(self) -> None:
        try:
            if self._face == "sync":
                with Queue(self._url, name=self._name) as q:
                    self.got.extend(q.reserve(wait=self._wait))
            else:

                async def main() -> None:
                    async with AsyncQueue(self._url, name=self._name) as q:
                        self.got.extend(await q.reserve(wait=self._wait))

                asyncio.run(main())
        except BaseException as exc:
            self.errors.append(exc)

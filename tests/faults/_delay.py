"""A slow link made in user space: a TCP proxy that delays what it forwards.

This kernel has no ``netem`` queueing discipline, so a link's latency is made here:
:class:`DelayProxy` listens on 127.0.0.1 and forwards each connection to ``target``,
holding every chunk it reads ``delay`` seconds, plus or minus ``jitter``, in each
direction (order kept, as TCP keeps it: a chunk never overtakes the one before). A
request and its reply thus take one round trip of about ``2 * delay`` more. Packet
loss cannot be made this way (TCP below the proxy hides it).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import deque

__all__ = ["DelayProxy"]

_CHUNK = 65536


class DelayProxy:
    """A proxy to ``target`` (host, port) adding ``delay`` +- ``jitter`` seconds each
    way; a context manager (it runs on a thread and event loop of its own)."""

    def __init__(
        self, target: tuple[str, int], delay: float, jitter: float, seed: int = 21
    ) -> None:
        self.target, self.delay, self.jitter = target, delay, jitter
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.port = future.result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the target."""
        return f"127.0.0.1:{self.port}"

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        # Stopping cancels this task: it ends quietly (asyncio's stream server asks a
        # cancelled handler for its exception, and that would raise).
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(
                self._pump(reader, upstream_writer),
                self._pump(upstream_reader, writer),
                return_exceptions=True,
            )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward ``reader`` to ``writer``, each chunk held its delay."""
        loop = asyncio.get_running_loop()
        held: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        done = False

        async def release() -> None:
            while held or not done:
                if not held:
                    arrived.clear()
                    await arrived.wait()
                    continue
                at, data = held[0]
                await asyncio.sleep(max(0.0, at - loop.time()))
                held.popleft()
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(release())
        last = 0.0
        try:
            while data := await reader.read(_CHUNK):
                spread = self._random.uniform(-self.jitter, self.jitter)
                last = max(last, loop.time() + self.delay + spread)
                held.append((last, data))
                arrived.set()
            done = True
            arrived.set()
            await sender
        finally:
            sender.cancel()
            with contextlib.suppress(Exception):
                writer.close()

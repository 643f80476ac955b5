"""A slow link made in user space: a TCP proxy that delays what it forwards.

This kernel has no ``netem`` queueing discipline, so a link's latency is made here:
:class:`DelayProxy` listens on 127.0.0.1 and forwards each connection to ``target``,
holding every chunk it reads ``delay`` seconds, plus or minus ``jitter``, in each
direction (order kept, as TCP keeps it: a chunk never overtakes the one before). A
request and its reply thus take one round trip of about ``2 * delay`` more. Packet
loss cannot be made this way (TCP below the proxy hides it).

The proxy runs in a process of its own (this file run as a script), as a link would:
on a thread of the test's process it waited for the GIL behind the clients it carries,
and on a loaded machine that made the slow link slower than its delay by hundreds of
milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import sys
from collections import deque

__all__ = ["DelayProxy"]

_CHUNK = 65536


class DelayProxy:
    """A proxy to ``target`` (host, port) adding ``delay`` +- ``jitter`` seconds each
    way; a context manager (it runs in a process of its own, stopped by its PID)."""

    def __init__(
        self, target: tuple[str, int], delay: float, jitter: float, seed: int = 21
    ) -> None:
        self.target, self.delay, self.jitter, self.seed = target, delay, jitter, seed
        self._process: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> DelayProxy:
        argv = [sys.executable, __file__, self.target[0], str(self.target[1])]
        argv += [repr(self.delay), repr(self.jitter), str(self.seed)]
        self._process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # its port, once it listens
        if not line.strip().isdigit():
            self.__exit__()
            raise RuntimeError(f"the delay proxy did not start: {line!r}")
        self.port = int(line)
        return self

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the target."""
        return f"127.0.0.1:{self.port}"


class _Relay:
    """The proxy's work, in its own process: each connection forwarded both ways, each
    chunk held its delay."""

    def __init__(self, target: tuple[str, int], delay: float, jitter: float, seed: int) -> None:
        self.target, self.delay, self.jitter = target, delay, jitter
        self._random = random.Random(seed)

    async def run(self) -> None:
        """Listen on a free port of 127.0.0.1, say which on stdout, serve until
        SIGTERM."""
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

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


if __name__ == "__main__":
    host, port, delay, jitter, seed = sys.argv[1:6]
    relay = _Relay((host, int(port)), float(delay), float(jitter), int(seed))
    asyncio.run(relay.run())

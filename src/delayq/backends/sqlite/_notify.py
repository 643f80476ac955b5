"""Wake-ups across processes: one datagram socket per waiting backend object, beside
the database file.

A backend object whose consumers wait binds a Unix datagram socket in the directory
``<file>-wake`` (:class:`Listener`), and beside it (``<socket>.q``) the names of the
queues its consumers have waited for; every commit that can make a message due in a
queue sends its name, after the commit, to each socket there that asked for that
queue (:class:`Notifier`), so a consumer in another process wakes within a context
switch instead of at its next ``data_version`` poll, and a busy queue does not wake
the consumers of the others (a send that wakes a process costs the writer tens of
microseconds). A notification is only a hint: a lost one (no such socket on this
platform, a path too long for one, the directory removed, a full socket buffer, a
writer of an older delayq or with ``notify=off``) leaves the waiter to that poll.

A socket left by a killed process refuses the next datagram (``ECONNREFUSED``); the
sender that sees this removes its file, so a stale socket costs one put one failed
send.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time

__all__ = ["Listener", "Notifier", "wake_directory"]

#: The longest queue name a datagram carries (in UTF-8 bytes); a longer one is sent
#: as an empty datagram, which wakes every waiter.
_NAME_BYTES = 200
#: The suffix of the file of a listener's queue names, beside its socket.
_WANTS = ".q"
#: A directory changed this recently (ns) may have changed again within the same
#: timestamp tick of its file system: list it again rather than trust the cache.
_RECENT_NS = 2_000_000_000
_AF_UNIX = getattr(socket, "AF_UNIX", None)


def wake_directory(path: str) -> str:
    """The directory of the wake-up sockets of the database file ``path``."""
    return f"{path}-wake"


def _socket() -> socket.socket:
    if _AF_UNIX is None:
        raise OSError("no Unix sockets on this platform")
    sock = socket.socket(_AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    return sock


def _remove(path: str) -> None:
    """Remove a socket's files, and its directory if they were the last ones."""
    for name in (path, path + _WANTS):
        with contextlib.suppress(OSError):
            os.unlink(name)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


class Listener:
    """The socket a watcher thread sleeps on (the thread's own; not thread safe)."""

    def __init__(self, directory: str) -> None:
        """Bind a fresh socket in ``directory`` (created if missing); OSError when
        the platform or the path does not allow it."""
        self.path = os.path.join(directory, f"{os.getpid()}-{secrets.token_hex(6)}")
        self._pid = os.getpid()
        sock = _socket()
        try:
            for _ in range(3):  # another process may remove the empty directory meanwhile
                os.makedirs(directory, exist_ok=True)
                try:
                    sock.bind(self.path)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise OSError(f"cannot bind a socket in {directory!r}")
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # if this made it, and nobody else is in it
            raise
        self._sock = sock

    def want(self, queues: set[str]) -> None:
        """Ask writers for the notifications of ``queues`` (all of them, from now
        on): one file, replaced whole."""
        temporary = os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(sorted(queues), file)
        os.replace(temporary, self.path + _WANTS)

    def wait(self, timeout: float) -> set[bytes]:
        """Sleep until datagrams come or ``timeout`` seconds passed; return what came
        (the queue names, an empty name for any queue; nothing after the timeout)."""
        sock = self._sock
        sock.settimeout(timeout)
        try:
            got = {sock.recv(_NAME_BYTES + 1)}
        except (TimeoutError, BlockingIOError):  # the latter for a timeout of 0
            return set()
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            while True:
                got.add(sock.recv(_NAME_BYTES + 1))
        return got

    def poke(self) -> None:
        """Wake :meth:`wait` now (from any thread: closing the backend)."""
        with contextlib.suppress(OSError), _socket() as sock:
            sock.sendto(b"", self.path)

    def close(self) -> None:
        """Close the socket, remove its file, and the directory once it is empty.
        In a forked child the file is the parent's: only the descriptor closes."""
        self._sock.close()
        if os.getpid() == self._pid:
            _remove(self.path)


class Notifier:
    """Sends a datagram to every listener of a database that wants the queue
    (thread safe). The directory's listing is cached while its modification time
    stays put, with one connected socket and the wanted queues per listener, so a
    commit with nobody listening for its queue costs one ``stat``, and each listener
    for it a ``send`` more. A listener that has not said what it wants gets all."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._lock = threading.Lock()
        self._mtime = -1
        self._peers: dict[str, tuple[socket.socket, frozenset[str] | None]] = {}
        self.own: str | None = None
        """The socket of this backend object's own listener (woken directly)."""

    def notify(self, queue: str) -> None:
        """Tell the listeners of other backend objects that ``queue`` changed; never
        raises."""
        try:
            mtime = os.stat(self._directory).st_mtime_ns
        except OSError:  # nobody listens (the common case of a lone process)
            if self._peers:
                with self._lock:
                    self._forget()
            return
        payload = queue.encode("utf-8", "surrogatepass")
        if len(payload) > _NAME_BYTES:
            payload = b""
        with self._lock:
            if mtime != self._mtime or time.time_ns() - mtime < _RECENT_NS:
                self._rescan(mtime)
            for name, (sock, wants) in list(self._peers.items()):
                if wants is not None and queue not in wants:
                    continue
                try:
                    sock.send(payload)
                except (BlockingIOError, InterruptedError):
                    pass  # its buffer is full: it has wake-ups to read already
                except OSError as exc:
                    self._drop(name, stale=isinstance(exc, ConnectionRefusedError))

    def _rescan(self, mtime: int) -> None:
        try:
            names = {n for n in os.listdir(self._directory) if not n.startswith(".")}
        except OSError:
            names = set()
        sockets = {n for n in names if not n.endswith(_WANTS)}
        for name in set(self._peers) - sockets:
            self._drop(name, stale=False)
        for name in sockets:
            path = os.path.join(self._directory, name)
            if path == self.own:
                continue
            wants = _read_wants(path) if name + _WANTS in names else None
            if name in self._peers:
                self._peers[name] = (self._peers[name][0], wants)
                continue
            try:
                sock = _socket()
            except OSError:
                return
            try:
                sock.connect(path)
            except OSError as exc:
                sock.close()
                if isinstance(exc, ConnectionRefusedError):
                    _remove(path)  # left by a process that died
                continue
            self._peers[name] = (sock, wants)
        self._mtime = mtime

    def _drop(self, name: str, *, stale: bool) -> None:
        sock, _ = self._peers.pop(name)
        sock.close()
        if stale:
            _remove(os.path.join(self._directory, name))

    def _forget(self) -> None:
        for name in list(self._peers):
            self._drop(name, stale=False)
        self._mtime = -1

    def after_fork(self) -> None:
        """In a child process: a fresh lock, and sockets of its own."""
        self._lock = threading.Lock()
        for sock, _ in self._peers.values():
            sock.close()  # the child's descriptors only: the parent's stay connected
        self._peers = {}
        self._mtime = -1
        self.own = None


def _read_wants(path: str) -> frozenset[str] | None:
    """The queues the listener at ``path`` wants (None: all, when unreadable)."""
    try:
        with open(path + _WANTS, encoding="utf-8") as file:
            names = json.load(file)
    except (OSError, ValueError):
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)

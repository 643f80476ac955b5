"""The sync face's short path to the server: one connection per thread, no pool.

A script call through ``redis.Redis`` costs 60-70 us of Python per call on top of the
round trip (pool checkout and return, argument encoding, response callbacks,
observability hooks): more than the server spends running a put. :class:`Link` keeps one
redis-py ``Connection`` per thread (and per process: a forked child opens its own),
packs ``FCALL`` with hiredis, sends it and reads the reply itself.

Errors and retries, which decide whether a write may run twice:

* a failure while connecting or sending means the server never got the whole command
  (Redis runs only complete commands), so the call is retried on a fresh connection,
  with backoff, up to :data:`REDIS_RETRIES` times;
* a failure while reading the reply leaves it unknown whether the script ran: only the
  scripts in :data:`~._scripts.RESEND_SAFE` (their second run changes nothing and answers
  the same; the list every face uses) are sent again; any other raises the connection
  error (a put, a claim, an ack... may or may not have happened, as for any call cut off
  in flight);
* a connection the server closed while it sat idle (a restart) is seen before sending
  (it reads as end of file) and replaced, so nothing is lost to it; a ``LOADING`` reply
  (a restarted server still reading its data) ran nothing and is retried too.

The library is loaded (``FUNCTION LOAD REPLACE``) when the server says the function is
missing, then the call is sent again (it did not run). A server without ``FCALL`` (Redis
before 7.0) hands every call to :class:`~._functions.Functions`, which runs EVALSHA.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import ExponentialBackoff

from ..._constants import REDIS_RETRIES, REDIS_RETRY_BASE, REDIS_RETRY_CAP
from ._functions import Functions, function_missing, functions_unsupported
from ._listen import CONNECTION_ERRORS
from ._scripts import RESEND_SAFE, SCRIPT_NAMES, function_name, library_source

__all__ = ["Link"]

Packer = Callable[[tuple[Any, ...]], bytes]


def _packer() -> Packer | None:
    try:
        import hiredis  # noqa: PLC0415 (optional: redis-py works without it)
    except ImportError:
        return None
    pack: Packer = hiredis.pack_command
    return pack


class _Local(threading.local):
    connection: Any = None
    pid: int = 0


class Link:
    """Runs the library's functions for one ``redis.Redis`` client's server, on a
    connection per thread made from the client's pool settings (``max_connections``
    does not apply to them)."""

    def __init__(self, client: redis.Redis, functions: Functions) -> None:
        pool = client.connection_pool
        self._connection_class: Any = pool.connection_class
        self._connection_kwargs = dict(pool.connection_kwargs)
        self._functions = functions
        self._names = {name: function_name(name).encode() for name in SCRIPT_NAMES}
        self._code = library_source()[1]
        self._local = _Local()
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self._pack = _packer()
        self._backoff = ExponentialBackoff(REDIS_RETRY_CAP, REDIS_RETRY_BASE)

    def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args``; its raw reply."""
        if self._functions.evalsha:
            return self._functions(script, keys, args)
        command = (b"FCALL", self._names[script], len(keys), *keys, *args)
        safe = script in RESEND_SAFE
        try:
            return self._exchange(command, safe)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):
                return self._functions(script, keys, args)  # switches it to EVALSHA
            if not function_missing(exc):
                raise
        self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
        return self._exchange(command, safe)

    def close(self) -> None:
        """Close every thread's connection; later calls open new ones."""
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            connection.disconnect()

    def _connection(self) -> Any:
        local = self._local
        connection = local.connection
        if connection is None or local.pid != os.getpid():
            connection = self._connection_class(**self._connection_kwargs)
            local.connection, local.pid = connection, os.getpid()
            with self._lock:
                self._open.add(connection)
        return connection

    def _packed(self, connection: Any, command: tuple[Any, ...]) -> list[bytes]:
        if self._pack is not None:
            return [self._pack(command)]
        packed: list[bytes] = connection.pack_command(*command)
        return packed

    @staticmethod
    def _ready(connection: Any) -> None:
        """Connect if needed; replace a connection that reads as ready before anything
        was sent: the server closed it while idle (a restart), or stray bytes."""
        try:
            stale = connection.can_read(0)
        except CONNECTION_ERRORS:
            stale = True
        if stale:
            connection.disconnect()
        connection.connect()

    def _exchange(self, command: tuple[Any, ...], resend_safe: bool) -> Any:
        """Send ``command`` and read its reply, retrying as the module docstring says."""
        failures = 0
        while True:
            connection = self._connection()
            sent = False
            try:
                self._ready(connection)
                connection.send_packed_command(self._packed(connection, command), False)
                sent = True
                return connection.read_response()
            except redis.BusyLoadingError:
                # The server refused the command while it loads its data: retry.
                connection.disconnect()
                failures += 1
                if failures > REDIS_RETRIES:
                    raise
            except redis.ResponseError:
                raise  # an error reply: the connection is in step
            except CONNECTION_ERRORS:
                connection.disconnect()
                failures += 1
                if (sent and not resend_safe) or failures > REDIS_RETRIES:
                    raise
            except BaseException:
                if not sent:
                    raise
                connection.disconnect()  # the reply may still come: out of step
                raise
            time.sleep(self._backoff.compute(failures))

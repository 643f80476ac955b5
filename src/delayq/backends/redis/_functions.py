"""Running the scripts: as functions of the delayq library (``FCALL``), which the server
compiles once, rather than as EVALSHA scripts whose prelude is run on every call.

The library (:func:`~._scripts.library_source`) is loaded with ``FUNCTION LOAD REPLACE``
when a call finds its function missing: on first use against a server, and again after
a restart without persistence, ``FLUSHALL`` or ``FUNCTION FLUSH``; on a cluster, redis-py
sends ``FUNCTION LOAD`` to every primary. A server without functions (before Redis 7.0)
gets the same scripts by EVALSHA instead. On a cluster each FCALL is sent to the node
that serves the slot of its KEYS (one hash tag), found in redis-py's map of the cluster
(``get_node_from_key``) and passed as ``target_nodes``: redis-py would otherwise ask a
node for an FCALL's keys (``COMMAND GETKEYS``, a round trip more per call), and EVALSHA,
which redis-py routes by its keys, runs the whole prelude on every call (three times the
server's time of an FCALL). A slot that moved meanwhile is redis-py's to follow.

A call lost to a connection error is sent again only as :func:`._resend.again` says (the
client is made without redis-py's own retries): always for a script of
:data:`~._scripts.RESEND_SAFE`, otherwise only when it surely did not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis

from ._io._async.retry import call_async
from ._io._async.scan import scan_queues_async
from ._io._sync.retry import call
from ._io._sync.scan import scan_queues
from ._resend import not_cancelled
from ._scripts import RESEND_SAFE, SCRIPT_NAMES, function_name, library_source, script_source

__all__ = [
    "AsyncFunctions",
    "Functions",
    "FunctionsBase",
    "function_missing",
    "functions_unsupported",
]


def function_missing(exc: redis.ResponseError) -> bool:
    """The function (so the library) is not on the server."""
    return "function not found" in str(exc).lower()


def functions_unsupported(exc: redis.ResponseError) -> bool:
    """The server has no FCALL (Redis before 7.0)."""
    return "unknown command" in str(exc).lower() and "fcall" in str(exc).lower()


class FunctionsBase:
    """What both faces' runners hold: the client, the library, the EVALSHA scripts.

    ``cluster``: the client is a ``RedisCluster``, whose pipeline :meth:`Functions.many`
    does not use (each run goes alone to its node). ``evalsha``: run EVALSHA scripts from
    the start, as a server before Redis 7.0 ends up doing."""

    def __init__(self, client: Any, *, cluster: bool = False, evalsha: bool = False) -> None:
        self._client = client
        self._cluster = cluster
        self._code = library_source()[1]
        self._names = {name: function_name(name) for name in SCRIPT_NAMES}
        #: The EVALSHA scripts, when asked for or once FCALL turned out to be unknown.
        self._scripts: dict[str, Any] | None = self._use_scripts() if evalsha else None

    @property
    def evalsha(self) -> bool:
        """True once calls run as EVALSHA scripts (asked for, or FCALL is unknown)."""
        return self._scripts is not None

    def _fcall_args(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """The positional and keyword arguments of ``execute_command`` for an FCALL of
        ``script`` (see the module docstring for a cluster's ``target_nodes``)."""
        command = ("FCALL", self._names[script], len(keys), *keys, *args)
        if self._cluster and keys:
            return command, {"target_nodes": self._client.get_node_from_key(keys[0])}
        return command, {}

    def _use_scripts(self) -> dict[str, Any]:
        scripts = {name: self._client.register_script(script_source(name)) for name in SCRIPT_NAMES}
        self._scripts = scripts
        return scripts


class Functions(FunctionsBase):
    """Runs a script by name on a ``redis.Redis`` or ``redis.cluster.RedisCluster``."""

    def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        return call(lambda _: self._once(script, keys, args), script in RESEND_SAFE, script)

    def _once(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        if self._scripts is not None:
            return self._scripts[script](keys=keys, args=args)
        command, options = self._fcall_args(script, keys, args)
        try:
            return self._client.execute_command(*command, **options)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):
                return self._use_scripts()[script](keys=keys, args=args)
            if not function_missing(exc):
                raise
        self._client.function_load(self._code, replace=True)
        command, options = self._fcall_args(script, keys, args)
        return self._client.execute_command(*command, **options)

    def queues(self, prefix: str) -> list[str]:
        """The queues under ``prefix`` (:mod:`._io._async.scan`)."""
        return scan_queues(self._client, prefix)

    def command(self, *args: Any) -> Any:
        """A plain command that may run twice (``INCRBY``, ``ZCARD``), through the
        client, sent again as :func:`._resend.again` says."""
        return call(lambda _: self._client.execute_command(*args), True, str(args[0]))

    def many(self, runs: Sequence[tuple[str, Sequence[bytes], Sequence[Any]]]) -> list[Any]:
        """Run several ``(script, keys, args)`` in one pipeline (not a transaction) and
        return their replies in order; the first error is raised. A cluster, and EVALSHA
        clients (Redis < 7), run them one by one."""
        if self._cluster or self._scripts is not None or len(runs) < 2:
            return [self(script, keys, args) for script, keys, args in runs]
        safe = all(script in RESEND_SAFE for script, _, _ in runs)
        return call(lambda _: self._pipelined(runs), safe, runs[0][0])

    def _pipelined(self, runs: Sequence[tuple[str, Sequence[bytes], Sequence[Any]]]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for script, keys, args in runs:
            pipe.fcall(self._names[script], len(keys), *keys, *args)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        for index, reply in enumerate(replies):
            if isinstance(reply, redis.ResponseError):
                if not (function_missing(reply) or functions_unsupported(reply)):
                    raise reply
                replies[index] = self._once(*runs[index])  # loads the library (or falls back)
        return replies


class AsyncFunctions(FunctionsBase):
    """:class:`Functions` for ``redis.asyncio.Redis`` or ``RedisCluster``."""

    async def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        run = call_async(lambda _: self._once(script, keys, args), script in RESEND_SAFE, script)
        return await not_cancelled(run)

    async def queues(self, prefix: str) -> list[str]:
        """:meth:`Functions.queues` on an asyncio client."""
        return await scan_queues_async(self._client, prefix)

    async def command(self, *args: Any) -> Any:
        """:meth:`Functions.command` on an asyncio client."""
        return await call_async(lambda _: self._client.execute_command(*args), True, str(args[0]))

    async def many(self, runs: Sequence[tuple[str, Sequence[bytes], Sequence[Any]]]) -> list[Any]:
        """Run several ``(script, keys, args)`` at once (each on its own, as
        :meth:`__call__`) and return their replies in order; the first error is raised."""
        return list(await asyncio.gather(*(self(*run) for run in runs)))

    async def _once(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        if self._scripts is not None:
            return await self._scripts[script](keys=keys, args=args)
        command, options = self._fcall_args(script, keys, args)
        try:
            return await self._client.execute_command(*command, **options)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):
                return await self._use_scripts()[script](keys=keys, args=args)
            if not function_missing(exc):
                raise
        await self._client.function_load(self._code, replace=True)
        command, options = self._fcall_args(script, keys, args)
        return await self._client.execute_command(*command, **options)

"""The sync and async faces stay twins: same methods, same parameters, async where it must be.

Every sync face is generated from its asyncio source (``scripts/unasync.py``, checked by
``make lint``); this test checks what generation cannot: that the rewrite table and the
hand-written I/O pairs still give twins with the protocol's members. A user switching
from ``Queue`` to ``AsyncQueue`` (or a backend author reading one face) can count on
every call existing on the other face, taking the same arguments with the same defaults.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import delayq
from delayq import durable
from delayq.durable import queue as queue_module
from delayq.durable.backend import AsyncBackend, Backend

# (label, sync class, async class), as "module:Class"; imported inside the tests so
# that a missing optional dependency (redis-py) skips its pairs instead of failing
# the collection.
PAIRS = [
    ("protocol", "delayq.durable.backend:Backend", "delayq.durable.backend:AsyncBackend"),
    (
        "memory",
        "delayq.backends.memory:MemoryBackend",
        "delayq.backends.memory:AsyncMemoryBackend",
    ),
    (
        "sqlite",
        "delayq.backends.sqlite:SQLiteBackend",
        "delayq.backends.sqlite:AsyncSQLiteBackend",
    ),
    (
        "postgres",
        "delayq.backends.postgres:PostgresBackend",
        "delayq.backends.postgres:AsyncPostgresBackend",
    ),
    (
        "redis",
        "delayq.backends.redis:RedisBackend",
        "delayq.backends.redis:AsyncRedisBackend",
    ),
    (
        "redis-sharded",
        "delayq.backends.redis:ShardedRedisBackend",
        "delayq.backends.redis:AsyncShardedRedisBackend",
    ),
    (
        "amqp",
        "delayq.backends.amqp:AmqpBackend",
        "delayq.backends.amqp:AsyncAmqpBackend",
    ),
    ("queue", "delayq.durable.queue:Queue", "delayq.durable.queue:AsyncQueue"),
]
BACKEND_PAIRS = [pair for pair in PAIRS if pair[0] not in ("protocol", "queue")]

# The Redis pairs below the faces that stay hand-written, and what truly differs in
# each; the pairs of the same shape are generated (backends/redis/_io/_async/).
_R = "delayq.backends.redis."
REDIS_HAND_WRITTEN = [
    (
        _R + "_link:Link",
        _R + "_link_async:AsyncLink",
        "a socket read: one connection per "
        "thread read in turn, or one pipelined connection per loop read by a task",
    ),
    (_R + "_listen:Listener", _R + "_listen:AsyncListener", "a thread or a task"),
    (_R + "_hub:Hub", _R + "_hub:AsyncHub", "a wait: a condition or futures"),
    (_R + "_claims:Claims", _R + "_claims:AsyncClaims", "only a task is cancelled mid-claim"),
    (
        _R + "_functions:Functions",
        _R + "_functions:AsyncFunctions",
        "a pipeline, or calls at once; a cancel that redis-py's wait_for drops",
    ),
    (
        _R + "_clients:ListenerClients",
        _R + "_clients:AsyncListenerClients",
        "a client per thread, or one shared on the loop",
    ),
    (
        _R + "_clients:_Cluster",
        _R + "_clients:_AsyncCluster",
        "redis-py's cluster clients "
        "differ: one maps at construction, one in initialize(), without connection_class",
    ),
    (_R + "_clients:sync_client", _R + "_clients:async_client", "the same two clients"),
    (
        _R + "_resend:_SyncMarks",
        _R + "_resend:_AsyncMarks",
        "an asyncio cluster node's pool does not look at an idle connection: the async one does",
    ),
    (
        _R + "_resend:no_retry",
        _R + "_resend:no_retry_async",
        "redis-py's two Retry classes live in module paths the rewrite does not map",
    ),
    (_R + "_resend:tracked_client", _R + "_resend:async_tracked_client", "one body"),
    (
        _R + "_transport:connection_settings",
        _R + "_transport:async_connection_settings",
        "one body",
    ),
    (
        _R + "_clients:blocking",
        _R + "_clients:async_blocking",
        "the faces' way to the generated Blocking pair (the rewrite maps names, not package paths)",
    ),
]
# Members on one side of a hand-written pair only.
ONE_SIDED = {"initialize": "the asyncio cluster client maps the cluster on first use"}

PAIR_IDS = [pair[0] for pair in PAIRS]
BACKEND_IDS = [pair[0] for pair in BACKEND_PAIRS]

# Public methods of an async face that are plain functions on purpose (properties
# are always allowed: they only read local state).
NOT_COROUTINES = {
    "named": "Queue.named / AsyncQueue.named returns a sibling queue and does no I/O",
}
# The context-manager methods of each face.
CONTEXT_TWINS = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _load(spec: str) -> type[Any]:
    module_name, _, class_name = spec.partition(":")
    if module_name.startswith("delayq.backends.redis"):
        pytest.importorskip("redis", reason="redis-py is not installed")
    if module_name.startswith("delayq.backends.amqp"):
        pytest.importorskip("aiormq", reason="aiormq is not installed")
    cls: type[Any] = getattr(importlib.import_module(module_name), class_name)
    return cls


def _pair(sync_spec: str, async_spec: str) -> tuple[type[Any], type[Any]]:
    return _load(sync_spec), _load(async_spec)


def _public(cls: type[Any]) -> dict[str, Any]:
    """The public attributes of ``cls`` (inherited ones too), unbound."""
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if name[0] != "_"}


def _methods(cls: type[Any]) -> dict[str, Callable[..., Any]]:
    """The public methods of ``cls`` (properties left out)."""
    return {
        name: getattr(cls, name)
        for name, value in _public(cls).items()
        if not isinstance(value, property)
    }


def _shape(function: Callable[..., Any]) -> list[tuple[str, str, object]]:
    """What a caller sees of a signature: each parameter's name, kind and default
    (annotations differ between the faces: ``Backend`` vs ``AsyncBackend``...)."""
    return [
        (parameter.name, parameter.kind.name, parameter.default)
        for parameter in inspect.signature(function).parameters.values()
    ]


@pytest.mark.parametrize(("label", "sync_spec", "async_spec"), PAIRS, ids=PAIR_IDS)
def test_both_faces_have_the_same_public_members(
    label: str, sync_spec: str, async_spec: str
) -> None:
    sync_cls, async_cls = _pair(sync_spec, async_spec)
    sync_members, async_members = _public(sync_cls), _public(async_cls)
    assert sorted(sync_members) == sorted(async_members), label
    for name, value in sync_members.items():
        assert isinstance(value, property) == isinstance(async_members[name], property), name


@pytest.mark.parametrize(("label", "sync_spec", "async_spec"), PAIRS, ids=PAIR_IDS)
def test_each_method_takes_the_same_parameters_on_both_faces(
    label: str, sync_spec: str, async_spec: str
) -> None:
    sync_cls, async_cls = _pair(sync_spec, async_spec)
    async_methods = {**_methods(async_cls), "__init__": async_cls.__init__}
    for name, method in {**_methods(sync_cls), "__init__": sync_cls.__init__}.items():
        assert name in async_methods, f"{label}: {name} has no async twin"
        assert _shape(method) == _shape(async_methods[name]), f"{label}: {name}"


@pytest.mark.parametrize(("label", "sync_spec", "async_spec"), PAIRS, ids=PAIR_IDS)
def test_the_async_face_awaits_and_the_sync_face_does_not(
    label: str, sync_spec: str, async_spec: str
) -> None:
    sync_cls, async_cls = _pair(sync_spec, async_spec)
    for name, method in _methods(async_cls).items():
        expected = name not in NOT_COROUTINES
        assert inspect.iscoroutinefunction(method) is expected, f"{label}: {name}"
    for name, method in _methods(sync_cls).items():
        assert not inspect.iscoroutinefunction(method), f"{label}: {name}"
    assert not inspect.iscoroutinefunction(async_cls.__init__)


@pytest.mark.parametrize(("label", "sync_spec", "async_spec"), PAIRS, ids=PAIR_IDS)
def test_context_managers_are_twins(label: str, sync_spec: str, async_spec: str) -> None:
    sync_cls, async_cls = _pair(sync_spec, async_spec)
    for sync_name, async_name in CONTEXT_TWINS.items():
        assert hasattr(sync_cls, sync_name) == hasattr(async_cls, async_name), label
        if hasattr(sync_cls, sync_name):
            async_method = getattr(async_cls, async_name)
            assert inspect.iscoroutinefunction(async_method), f"{label}: {async_name}"
            assert _shape(getattr(sync_cls, sync_name)) == _shape(async_method)


@pytest.mark.parametrize(("label", "sync_spec", "async_spec"), BACKEND_PAIRS, ids=BACKEND_IDS)
def test_every_backend_implements_its_protocol(label: str, sync_spec: str, async_spec: str) -> None:
    sync_cls, async_cls = _pair(sync_spec, async_spec)
    for cls, protocol in ((sync_cls, Backend), (async_cls, AsyncBackend)):
        implemented = _methods(cls)
        for name, wanted in _methods(protocol).items():
            assert name in implemented, f"{cls.__name__} lacks {protocol.__name__}.{name}"
            method = implemented[name]
            assert _shape(method) == _shape(wanted), f"{cls.__name__}.{name}"
            assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(wanted)


def test_queue_is_importable_where_it_always_was() -> None:
    assert delayq.Queue is durable.Queue is queue_module.Queue
    assert delayq.AsyncQueue is durable.AsyncQueue is queue_module.AsyncQueue
    assert queue_module.Queue.put.__doc__
    assert queue_module.Queue.put.__doc__ == queue_module.AsyncQueue.put.__doc__


def _own(cls: type[Any]) -> dict[str, Any]:
    """The members ``cls`` defines itself (public, calls, context managers), each under
    its sync name."""
    names = {"aclose": "close", **{a: s for s, a in CONTEXT_TWINS.items()}}
    keep = {"__call__", "__init__", *CONTEXT_TWINS, *CONTEXT_TWINS.values()}
    return {
        names.get(name, name): value
        for name, value in vars(cls).items()
        if (name[0] != "_" or name in keep) and name not in ONE_SIDED
    }


@pytest.mark.parametrize(
    ("sync_spec", "async_spec", "why"), REDIS_HAND_WRITTEN, ids=[p[1] for p in REDIS_HAND_WRITTEN]
)
def test_the_hand_written_redis_pairs_stay_twins(sync_spec: str, async_spec: str, why: str) -> None:
    """What generation does not check for the pairs that truly differ: the same members
    (or the same parameters), and the sync one never a coroutine."""
    sync_obj, async_obj = _pair(sync_spec, async_spec)
    assert why
    if not inspect.isclass(sync_obj):
        assert _shape(sync_obj) == _shape(async_obj)
        assert not inspect.iscoroutinefunction(sync_obj)
        return
    sync_members, async_members = _own(sync_obj), _own(async_obj)
    assert sorted(sync_members) == sorted(async_members)
    for name, member in sync_members.items():
        assert not inspect.iscoroutinefunction(member), name
        assert isinstance(member, property) == isinstance(async_members[name], property), name

"""The sync and async faces stay twins: same methods, same parameters, async where it must be.

Every sync face is generated from its asyncio source (``scripts/unasync.py``, checked by
``make lint``); this test checks what generation cannot: that the rewrite table and the
hand-written I/O pairs still give twins with the protocol's members. A user switching
from ``Queue`` to ``AsyncQueue`` (or a backend author reading one face) can count on
every call existing on the other face, taking the same arguments with the same defaults.

Below the faces, only the I/O primitives are written twice by hand: :data:`HAND_PAIRS`
lists each pair with why it cannot be generated, checks that its two members are twins,
and a scan of the sources fails on any other hand-written twin (an ``Async*`` class or
alias, an ``x_async`` beside its ``x``) until it is listed here or generated. The
public classes with both faces on one class (``App``, ``Task``, ``Harness``) follow one
naming rule, checked last: the asyncio twin of ``x`` is ``x_async``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
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
    (
        "kafka",
        "delayq.backends.kafka:KafkaBackend",
        "delayq.backends.kafka:AsyncKafkaBackend",
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
        _R + "_refused:FirstUse",
        _R + "_refused:AsyncFirstUse",
        "a socket read: a blocking socket, or asyncio's streams",
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
    if module_name.startswith("delayq.backends.kafka"):
        pytest.importorskip("aiokafka", reason="aiokafka is not installed")
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


# -- the hand-written pairs below the faces ----------------------------------------------

_L = "delayq.backends._replicated._link"
# (module, sync name, asyncio name, why it is written by hand), one pair a line; a name is
# a function, a class (or an alias of one), or "Class.method" (the two on one class, or
# each on its own: the replicated link's, whose faces share no base).
HAND_PAIRS = [
    ("delayq._timer", "sleep", "sleep_async", "time.sleep vs a timerfd on the loop"),
    ("delayq.backends.memory._store", "Store.wait", "Store.wait_async", "Condition vs future"),
    ("delayq.backends.sqlite._runner", "Runner", "AsyncRunner", "this thread vs a pool"),
    ("delayq.backends.sqlite._wakeup", "Wakeup.wait", "Wakeup.wait_async", "Condition vs future"),
    ("delayq.backends.postgres._runner", "Lock", "AsyncLock", "threading vs asyncio lock"),
    ("delayq.backends._guard", "Guard", "AsyncGuard", "cancel gives back a claim"),
    ("delayq.backends.postgres._runner", "getconn", "getconn_async", "a lost cancel raised"),
    ("delayq.backends.postgres._runner", "wait_ready", "wait_ready_async", "poll vs add_reader"),
    ("delayq.backends.postgres._wakeup", "Wakeup.wait", "Wakeup.wait_async", "Event vs future"),
    ("delayq.backends.redis._resend", "Send", "AsyncSend", "a call's type: value or awaitable"),
    (_L, "ThreadLink.call", "LoopLink.call", "read in the caller's thread vs by the loop"),
    (_L, "ThreadLink.put_fast", "LoopLink.put_fast", "appended by the thread vs a loop's task"),
]
SOURCE = Path(delayq.__file__ or "").parent


def _object(module: str, name: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _caller_shape(owner: Any, name: str) -> list[tuple[str, str, object]]:
    """:func:`_shape` as a caller of an instance sees it (no ``self``)."""
    function = getattr(owner, name)
    shape = _shape(function)
    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, name)):
        shape = shape[1:]
    return shape


@pytest.mark.parametrize(
    ("module", "sync_name", "async_name", "why"), HAND_PAIRS, ids=[p[2] for p in HAND_PAIRS]
)
def test_each_hand_written_pair_is_a_twin(
    module: str, sync_name: str, async_name: str, why: str
) -> None:
    sync_obj, async_obj = _object(module, sync_name), _object(module, async_name)
    assert why
    if not getattr(async_obj, "__module__", "").startswith("delayq"):
        return  # an alias of the standard library's own pair (threading.Lock...)
    if inspect.isclass(sync_obj):
        sync_members, async_members = _methods(sync_obj), _methods(async_obj)
        assert sorted(sync_members) == sorted(async_members), async_name
        for name in [*sync_members, "__init__"]:
            assert _caller_shape(sync_obj, name) == _caller_shape(async_obj, name), name
            assert not inspect.iscoroutinefunction(getattr(sync_obj, name)), name
        assert all(map(inspect.iscoroutinefunction, async_members.values())), async_name
        return
    if "." in sync_name:
        sync_owner, _, sync_member = sync_name.rpartition(".")
        async_owner, _, async_member = async_name.rpartition(".")
        sync_shape = _caller_shape(_object(module, sync_owner), sync_member)
        async_shape = _caller_shape(_object(module, async_owner), async_member)
    else:
        sync_shape, async_shape = _shape(sync_obj), _shape(async_obj)
    assert sync_shape == async_shape, async_name
    assert inspect.iscoroutinefunction(async_obj), async_name
    assert not inspect.iscoroutinefunction(sync_obj), sync_name


def _hand_written_twins(path: Path) -> list[str]:
    """The twins ``path`` defines: "Async*" classes and aliases, and "x_async" functions
    or methods beside an "x" (as "name" or "Class.name")."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def scope(body: list[ast.stmt], prefix: str) -> list[str]:
        names: dict[str, ast.stmt] = {}
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        found = []
        for name, node in names.items():
            if re.fullmatch(r"Async[A-Z]\w*", name) or (
                name.endswith("_async") and name.removesuffix("_async") in names
            ):
                found.append(prefix + name)
            if isinstance(node, ast.ClassDef):
                found += scope(node.body, f"{prefix}{node.name}.")
        return found

    return scope(tree.body, "")


def test_no_other_hand_written_pair_below_the_faces() -> None:
    listed = {(module, name) for module, _, name, _ in HAND_PAIRS} | {
        tuple(spec.split(":")) for _, spec, _ in REDIS_HAND_WRITTEN
    }
    faces = {(cls.__module__, cls.__qualname__) for cls in _public_classes()}
    unlisted = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE.parent).as_posix()
        if {"_async", "_sync"} & set(path.parts):
            continue
        module = relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for name in _hand_written_twins(path):
            owner = name.rpartition(".")[0] or name
            if (module, owner) not in faces and (module, name) not in listed:
                unlisted.append(f"{module}:{name}")
    assert not unlisted, (
        f"hand-written twins not in HAND_PAIRS: {unlisted}; generate them "
        "(an _async/ module, scripts/unasync.py) or list them with why"
    )


# -- one naming rule on the public classes with both faces ------------------------------

#: The names before the rule, each still working with a DeprecationWarning (tested in
#: tests/worker/test_app.py and tests/testing/test_harness.py): old -> new.
DEPRECATED = {
    "App.aclose": "App.close_async",
    "App.async_queue": "App.queue_async",
    "App.open_async_queue": "App.open_queue_async",
    "Harness.aclose": "Harness.close_async",
}
#: A name no public class may have: async_x, x_async_y, and aclose-like a<x> (below).
_FORBIDDEN = re.compile(r"async_\w+|\w+_async_\w+")


@functools.cache
def _public_classes() -> list[type[Any]]:
    """Every class in the ``__all__`` of delayq's public modules (those of optional
    dependencies that are missing left out)."""
    found: dict[type[Any], None] = {}
    for info in pkgutil.walk_packages(delayq.__path__, "delayq."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name, None)
            if inspect.isclass(value) and value.__module__.startswith("delayq"):
                found[value] = None
    return list(found)


def test_public_classes_name_the_asyncio_twin_of_x_x_async() -> None:
    classes = _public_classes()
    assert {"App", "Task", "Harness"} <= {cls.__name__ for cls in classes}
    broken = []
    for cls in classes:
        public = {name for name in dir(cls) if not name.startswith("_")}
        for name in sorted(public):
            label = f"{cls.__name__}.{name}"
            if label in DEPRECATED:
                assert DEPRECATED[label].partition(".")[2] in public, label
                continue
            if _FORBIDDEN.fullmatch(name) or (name[0] == "a" and name[1:] in public):
                broken.append(f"{label}: the asyncio twin of x is x_async")
            if name.endswith("_async"):
                twin = name.removesuffix("_async")
                if twin not in public:
                    broken.append(f"{label}: no sync twin {twin}")
                    continue
                if _caller_shape(cls, twin) != _caller_shape(cls, name):
                    broken.append(f"{label}: not {twin}'s parameters")
                if inspect.iscoroutinefunction(getattr(cls, twin)):
                    broken.append(f"{cls.__name__}.{twin}: a coroutine without _async")
            elif inspect.iscoroutinefunction(getattr(cls, name)) and any(
                other.endswith("_async") for other in public
            ):
                broken.append(f"{label}: a coroutine beside x_async twins, named without")
    assert not broken, broken

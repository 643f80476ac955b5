"""Each backend is known by its descriptor only: the registry builds its schemes from
them, and no face (cli/, server/, runtime/, durable/) names a scheme or imports a
client library (``scripts/backend_names.py``, run by ``make lint``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from delayq.durable import registry
from delayq.durable.descriptor import BackendDescriptor, BackendDriver

from ._scripts import ROOT, load_script

backend_names = load_script("backend_names")

SCHEMES = ("memory", "sqlite", "redis", "rediss", "amqp", "amqps", "postgresql", "kafka")
CLIENTS = ("sqlite3", "redis", "psycopg", "aiormq")


def test_every_backend_package_exports_its_descriptor() -> None:
    found = registry.descriptors()
    assert [d.name for d in found] == ["memory", "sqlite", "redis", "postgres", "amqp", "kafka"]
    for module, descriptor in zip(registry.BACKENDS, found, strict=True):
        assert importlib.import_module(module).DESCRIPTOR is descriptor
    assert {d.name for d in found if d.replicated} == {"amqp", "kafka"}
    assert {d.name: d.extra for d in found if d.extra} == {
        "redis": "redis",
        "postgres": "postgres",
        "amqp": "amqp",
        "kafka": "kafka",
    }


def test_a_backend_package_imports_no_client_until_a_url_of_it_is_opened() -> None:
    code = (
        "import sys\n"
        "from delayq.durable.registry import descriptors, scheme_of\n"
        "assert [d.name for d in descriptors()]\n"
        "assert scheme_of('redis://h/0') == 'redis'\n"
        "clients = ('redis', 'psycopg', 'psycopg_pool', 'aiormq', 'pamqp', 'msgpack', 'aiokafka')\n"
        "assert not [m for m in clients if m in sys.modules], sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_register_backend_serves_its_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_by_scheme", dict(registry._table()))
    module = type(sys)("test_descriptors_backend")
    memory = importlib.import_module("delayq.backends.memory").DESCRIPTOR
    module.DESCRIPTOR = BackendDescriptor(
        name="mine", schemes=("mine",), load=memory.load, consumer_options={"a": 1}
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert registry.register_backend(module.__name__) is module.DESCRIPTOR
    assert registry.consumer_options("mine://") == {"a": 1}
    assert isinstance(registry.driver("mine://"), BackendDriver)
    with pytest.raises(TypeError, match="exports no DESCRIPTOR"):
        registry.register_backend("json")


def _findings(source: str, module: str = "delayq.cli._x") -> list[str]:
    return [
        what for _, what in backend_names.findings(source, "cli/_x.py", module, SCHEMES, CLIENTS)
    ]


def test_the_lint_finds_a_face_that_knows_a_backend_by_hand() -> None:
    assert _findings("import sqlite3") == ["imports sqlite3, a backend's client library"]
    assert _findings("from redis import exceptions")
    assert _findings("from psycopg_pool import PoolTimeout") == []  # not listed here
    assert _findings("from ..backends.redis import OUTAGE_ERRORS")
    assert _findings("from .. import backends") == ["imports the backend package delayq.backends"]
    assert _findings('_REPLICATED = frozenset({"amqp", "amqps"})') == [
        "names the scheme 'amqp'",
        "names the scheme 'amqps'",
    ]
    assert _findings('x = "only amqp:// and AMQPS:// have one"') == [
        "names the scheme amqp:// in 'only amqp:// and AMQPS:// have one'"
    ]
    assert _findings('url = f"sqlite:///{path}"')
    # prose and unrelated words are not read
    assert _findings('"""Open ``redis://`` or amqp."""\nx = "memory use"') == []
    assert _findings('def f():\n    """Open redis://."""\n    return 1') == []


def test_no_face_names_a_backend() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/backend_names.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr

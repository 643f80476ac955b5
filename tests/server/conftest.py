"""Fixtures of the HTTP API tests: an app per test, its lifespan running, driven by
Starlette's TestClient (requests go through the real ASGI stack, middleware included).

``client`` serves a fresh ``memory://`` namespace; ``any_client`` runs the test once
per backend (memory, sqlite in ``tmp_path``, redis under a key prefix of its own,
postgres in a schema of its own, amqp in a namespace of its own, kafka in the test
file's namespace, its queues purged after each test; a server that is unreachable is skipped unless
``$DELAYQ_REQUIRE`` lists it). A test marked ``guarantee(name)`` is skipped on a
backend whose descriptor says it cannot give it.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

# _declared_guarantees (autouse): a test marked guarantee(name) is skipped, with the
# reason, on a backend whose descriptor declares it cannot give that guarantee.
from conformance.conftest import (
    _declared_guarantees,  # noqa: F401
    amqp_url,
    kafka_purged_url,
    memory_url,
    postgres_url,
    redis_url,
    sqlite_url,
)
from delayq.server import ServeConfig, create_app

with warnings.catch_warnings():  # starlette's note about httpx, at import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

BACKENDS: dict[str, Callable[[Path], Iterator[str]]] = {
    "amqp": amqp_url,
    "kafka": kafka_purged_url,
    "memory": memory_url,
    "postgres": postgres_url,
    "redis": redis_url,
    "sqlite": sqlite_url,
}

MakeClient = Callable[..., TestClient]


@pytest.fixture(params=sorted(BACKENDS))
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, isolated store for each backend."""
    yield from BACKENDS[request.param](tmp_path)


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    """``make_client(url=None, **config)``: a TestClient of a new app (its lifespan
    entered), over ``url`` or a fresh memory store; ``dispatch`` is off unless given."""
    stack = ExitStack()

    def make(url: str | None = None, **options: Any) -> TestClient:
        options.setdefault("dispatch", False)
        config = ServeConfig(url=url or f"memory://server-{uuid.uuid4().hex}", **options)
        return stack.enter_context(TestClient(create_app(config), base_url="http://localhost"))

    with stack:
        yield make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """A client of an app over a fresh memory store, no token."""
    return make_client()


@pytest.fixture
def any_client(backend_url: str, make_client: MakeClient) -> TestClient:
    """A client of an app over each backend in turn."""
    return make_client(backend_url)

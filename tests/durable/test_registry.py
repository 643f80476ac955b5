"""Queue URLs: the default, the scheme registry, clear errors."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys

import pytest

from delayq import UnsupportedURL
from delayq.durable import Queue, registry
from delayq.durable.registry import default_url, register_scheme, scheme_of


def test_default_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_URL", raising=False)
    assert default_url() == "sqlite:///delayq.db"
    monkeypatch.setenv("DELAYQ_URL", "")
    assert default_url() == "sqlite:///delayq.db"
    monkeypatch.setenv("DELAYQ_URL", "memory://env")
    assert default_url() == "memory://env"
    with Queue(name="from-env") as q:
        assert q.url == "memory://env"
        q.put("x")
        assert q.stats().ready == 1
        q.purge()


@pytest.mark.parametrize("url", ["ftp://host/x", "mongodb://localhost", "memory", "", "::"])
def test_unknown_or_malformed_url_names_the_supported_schemes(url: str) -> None:
    with pytest.raises(UnsupportedURL, match="memory://"):
        Queue(url)


def test_bad_port_and_non_str() -> None:
    with pytest.raises(UnsupportedURL, match="malformed"):
        scheme_of("redis://localhost:notaport/0")
    with pytest.raises(UnsupportedURL, match="str"):
        scheme_of(42)


def test_scheme_is_case_insensitive() -> None:
    assert scheme_of("MEMORY://") == "memory"


def test_memory_url_rejects_a_path() -> None:
    with pytest.raises(UnsupportedURL, match="memory://"):
        Queue("memory://ns/some/path")


def test_unsupported_url_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="scheme"):
        Queue("nope://")


@pytest.mark.parametrize("url", ["mysql://localhost/db", "mqtt://localhost"])
def test_a_backend_delayq_does_not_have_is_an_unsupported_scheme(url: str) -> None:
    with pytest.raises(UnsupportedURL, match=r"unsupported queue URL .*memory://"):
        Queue(url)


def test_register_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_by_scheme", dict(registry._table()))
    with pytest.raises(UnsupportedURL, match="unsupported queue URL"):
        Queue("mem2://")
    register_scheme("mem2", "delayq.backends.memory")
    with pytest.raises(UnsupportedURL, match="mem2://"):
        Queue("ftp://")  # the error names the new scheme among the supported ones
    with pytest.raises(UnsupportedURL, match="memory URL"):
        Queue("mem2://")  # served by the memory module, which wants memory://


def test_import_delayq_imports_no_engine_backend_or_worker() -> None:
    """``import delayq`` is cheap: each public name's module is imported on first use,
    so a program that wants a DelayQueue does not import the worker or croniter."""
    code = (
        "import sys, delayq\n"
        "heavy = ('delayq.runtime', 'croniter', 'delayq.durable', 'delayq.inproc')\n"
        "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
        "from delayq import DelayQueue\n"
        "assert 'delayq.runtime' not in sys.modules and 'croniter' not in sys.modules\n"
        "assert set(delayq.__all__) <= set(dir(delayq))\n"
        "from delayq import *\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_outage_errors_are_the_base_ones_and_the_backends_own() -> None:
    base = (OSError, TimeoutError, asyncio.TimeoutError)
    assert registry.outage_errors("memory://") == base
    assert registry.outage_errors("sqlite:///x.db") == (*base, sqlite3.OperationalError)
    redis_errors = pytest.importorskip("redis.exceptions")
    assert {redis_errors.ConnectionError, redis_errors.TimeoutError} <= set(
        registry.outage_errors("redis://localhost:6379/0")
    )

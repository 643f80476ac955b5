"""A URL query parameter that its backend does not take is one
:class:`~delayq.errors.UnsupportedURL` (a ValueError) on every backend and every face:
it names the parameter and lists the ones the backend takes, before anything connects
or is written (a sqlite file is not created; a server is not asked)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cli._helpers import Cli, one_error_line
from delayq import AsyncQueue, Queue
from delayq.errors import UnsupportedURL

_REDIS = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
_POSTGRES = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
_AMQP = os.environ.get("DELAYQ_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
_HOSTPORT = _REDIS.split("//", 1)[1].split("/", 1)[0].rpartition("@")[2]

#: backend -> (its URL with ``bogus=1`` among good parameters, what its line says it takes)
CASES = {
    "memory": ("memory://ns?bogus=1", "(it takes no options)"),
    "sqlite": ("sqlite:///{tmp}/q.db?bogus=1", "busy_timeout, notify, poll_interval, synchronous)"),
    "redis": (f"{_REDIS}?prefix=p&bogus=1", "max_connections, password, prefix, protocol, "),
    "rediss": (
        f"rediss://{_HOSTPORT}/0?bogus=1&ssl_cert_reqs=none",
        "socket_timeout, ssl_ca_certs, ssl_ca_path, ssl_cert_reqs, ",
    ),
    "redis-cluster": (f"redis+cluster://{_HOSTPORT}?bogus=1", "(it takes prefix, shards)"),
    "postgres": (
        f"{_POSTGRES}?sslmode=disable&bogus=1",
        "pool_timeout, schema, and libpq's connection parameters (sslmode, ",
    ),
    "amqp": (f"{_AMQP}?bogus=1&prefix=p", "heartbeat, keyfile, no_verify_ssl, prefix, "),
    "kafka": ("kafka://127.0.0.1:9?bogus=1&prefix=p", "sasl_mechanism, scheduler, "),
}


def _case(backend: str, tmp_path: Path) -> tuple[str, str]:
    url, takes = CASES[backend]
    return url.replace("{tmp}", str(tmp_path)), takes


def _check(exc: UnsupportedURL, url: str, takes: str) -> None:
    assert isinstance(exc, ValueError)
    scheme = url.split("://", 1)[0]
    assert str(exc).startswith(f"the {scheme}:// URL has an unknown option 'bogus' (it takes ")
    assert takes in str(exc)
    assert "guest:guest" not in str(exc)


@pytest.mark.parametrize("backend", CASES)
def test_queue_names_the_option_and_the_accepted_ones(backend: str, tmp_path: Path) -> None:
    url, takes = _case(backend, tmp_path)
    with pytest.raises(UnsupportedURL) as raised, Queue(url, name="jobs") as queue:
        queue.put({"n": 1})
    _check(raised.value, url, takes)
    assert list(tmp_path.iterdir()) == []  # no sqlite file was made

    async def main() -> UnsupportedURL:
        with pytest.raises(UnsupportedURL) as raised:
            async with AsyncQueue(url, name="jobs") as queue:
                await queue.stats()
        return raised.value

    assert str(asyncio.run(main())) == str(raised.value)


@pytest.mark.parametrize("command", ["stats", "put", "serve"])
@pytest.mark.parametrize("backend", CASES)
def test_each_command_says_the_same_line(backend: str, command: str, tmp_path: Path) -> None:
    url, _ = _case(backend, tmp_path)
    with pytest.raises(UnsupportedURL) as raised:
        Queue(url, name="jobs").stats()
    args = {"stats": ["stats"], "put": ["put", "jobs", "{}"], "serve": ["serve", "--port", "0"]}
    result = Cli(url)(*args[command])
    assert result.exit_code == 2  # a usage error, as any malformed URL
    line = one_error_line(result)
    assert line.startswith(f"error: {raised.value} (see '")  # its --help
    assert list(tmp_path.iterdir()) == []

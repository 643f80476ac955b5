"""``amqp://user:pass@host:port/vhost?prefix=...`` and ``amqps://``: what the backend
takes from its URL and keyword options."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._switch import switch
from ...durable.descriptor import check_url_options
from ...errors import UnsupportedURL
from .._replicated import Candidacy
from .._replicated._options import (
    candidacy,
    hot_standby,
    request_timeout,
    retention,
    shard_count,
    standing_shards,
)
from ._constants import (
    DEFAULT_HEARTBEAT,
    DEFAULT_PREFIX,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETENTION_BYTES,
    MIN_RETENTION_BYTES,
)

__all__ = ["URL_OPTIONS", "Settings", "parse"]

_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}")
_OPTIONS = frozenset(
    {
        "prefix",
        "scheduler",
        "request_timeout",
        "deliver_exchange",
        "deliver_routing_key",
        "retention_bytes",
        "fast_put",
        "standby",
        "shards",
        "scheduler_shards",
    }
)
#: TLS parameters of an ``amqps://`` URL, passed to aiormq as they are: the CA that signs
#: the broker's certificate (``cafile`` / ``capath``), a client certificate and its key
#: (``certfile`` / ``keyfile``), and ``no_verify_ssl=1`` to skip the broker's check.
_TLS = ("cafile", "capath", "certfile", "keyfile", "no_verify_ssl")
#: The query parameters an AMQP URL may carry: delayq's options, aiormq's heartbeat and
#: the TLS ones.
URL_OPTIONS = frozenset({*_OPTIONS, "heartbeat", *_TLS})


@dataclass(frozen=True)
class Settings:
    """One backend object's settings."""

    broker_urls: tuple[str, ...]
    """The URLs aiormq connects to, one per host of the URL's list, in its order
    (without delayq's own parameters)."""
    prefix: str
    scheduler: Candidacy
    request_timeout: float
    deliver: tuple[str, str] | None
    """``(exchange, routing key)`` every message of this object's queues is published to
    at its time ("" routing key: the queue's name), or None: consumers reserve them."""
    retention_bytes: int = DEFAULT_RETENTION_BYTES
    """The log's size retention (0: none)."""
    fast_put: bool = True
    """Whether ``put()`` appends to the intake itself (docs/rabbitmq.md, "Fast put")
    rather than asking the scheduler."""
    url: str = ""
    """The queue URL as given (what an error names, its password hidden)."""
    standby: bool = False
    """Whether this object, while it stands for election, folds the log as it grows
    (``standby=hot``: a failover then reads only the log's tail) rather than at
    election (``cold``)."""
    shards: int = 1
    """The namespace's shards: each a namespace of its own (``<prefix>.<k>`` when there
    are more than one), with its own scheduler, for the queues whose names fall to it."""
    scheduler_shards: frozenset[int] | None = None
    """The shards whose election this object stands for (None: every one)."""


def parse(url: str, options: dict[str, Any]) -> Settings:
    """The settings of ``url`` and the keyword options (a keyword wins over the URL);
    UnsupportedURL or ValueError, naming it, for anything it cannot take."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise UnsupportedURL(f"an AMQP URL starts with amqp:// or amqps://, not {url!r}")
    userinfo, at, host_list = parts.netloc.rpartition("@")
    hosts = host_list.split(",")
    for host in hosts:
        _check_host(host, url)
    given = dict(parse_qsl(parts.query, keep_blank_values=True))
    passed = {key: given.pop(key) for key in ("heartbeat", *_TLS) if key in given}
    check_url_options(url, given, URL_OPTIONS)
    _check_tls(scheme, passed, url)
    extra = sorted(set(options) - _OPTIONS)
    if extra:
        raise TypeError(f"unknown option(s) for an amqp:// queue: {', '.join(extra)}")
    merged = {**given, **options}
    prefix = merged.get("prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix must be 1-101 letters, digits or _.:- (not starting with one of "
            f"_.:-), not {prefix!r}"
        )
    scheduler = candidacy(merged.get("scheduler", "auto"))
    standby = hot_standby(merged.get("standby", "cold"))
    timeout = request_timeout(merged.get("request_timeout", DEFAULT_REQUEST_TIMEOUT))
    passed.setdefault("heartbeat", str(DEFAULT_HEARTBEAT))
    query = urlencode(passed)
    brokers = tuple(
        urlunsplit((scheme, f"{userinfo}{at}{host}", parts.path, query, "")) for host in hosts
    )
    retention_bytes = retention(
        merged.get("retention_bytes", DEFAULT_RETENTION_BYTES), MIN_RETENTION_BYTES
    )
    shards = shard_count(merged.get("shards", 1))
    return Settings(
        brokers,
        prefix,
        scheduler,
        timeout,
        _deliver(merged),
        retention_bytes,
        switch("fast_put", merged.get("fast_put", True)),
        url=url,
        standby=standby,
        shards=shards,
        scheduler_shards=standing_shards(merged.get("scheduler_shards"), shards),
    )


def _check_host(host: str, url: str) -> None:
    """UnsupportedURL unless ``host`` is ``name``, ``name:port`` or ``[v6]:port``."""
    try:
        parts = urlsplit(f"//{host}")
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        raise UnsupportedURL(f"a host of an AMQP URL has a bad port: {host!r} in {url!r}") from None
    if not parts.hostname:
        raise UnsupportedURL(
            "an AMQP URL names a host, or a list of them: "
            f"amqp://user:pass@host:5672/vhost or amqp://user:pass@h1,h2:5673/vhost, not {url!r}"
        )


def _check_tls(scheme: str, passed: dict[str, str], url: str) -> None:
    tls = [key for key in _TLS if key in passed]
    if tls and scheme != "amqps":
        raise UnsupportedURL(
            f"{', '.join(tls)} {'is a TLS parameter' if len(tls) == 1 else 'are TLS parameters'}"
            f": use amqps:// (not amqp://) in {url!r}"
        )
    for key in tls:
        if not passed[key]:
            raise UnsupportedURL(f"{key} of an AMQP URL needs a value: {url!r}")
    if passed.get("no_verify_ssl", "0") not in ("0", "1"):
        raise UnsupportedURL(f"no_verify_ssl must be 0 or 1, not {passed['no_verify_ssl']!r}")
    if "keyfile" in passed and "certfile" not in passed:
        raise UnsupportedURL(f"keyfile needs certfile (the client certificate): {url!r}")


def _deliver(merged: dict[str, Any]) -> tuple[str, str] | None:
    exchange = merged.get("deliver_exchange")
    routing_key = merged.get("deliver_routing_key")
    if exchange is None:
        if routing_key is not None:
            raise ValueError("deliver_routing_key needs deliver_exchange")
        return None
    for name, value in (("deliver_exchange", exchange), ("deliver_routing_key", routing_key)):
        if value is None:
            continue
        if not isinstance(value, str) or len(value.encode()) > 255 or not value.isprintable():
            raise ValueError(f"{name} must be printable text of at most 255 bytes, not {value!r}")
    if exchange == "":
        raise ValueError("deliver_exchange must name an exchange (not the default one)")
    return exchange, routing_key or ""

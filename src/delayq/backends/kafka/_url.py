"""``kafka://user:pass@host:port,host:port?prefix=...``: what the backend takes from its
URL and keyword options (a keyword wins over the URL)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

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
    DEFAULT_FETCH_WAIT_MS,
    DEFAULT_PREFIX,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETENTION_BYTES,
    MAX_SESSION_TIMEOUT,
    MIN_RETENTION_BYTES,
    MIN_SESSION_TIMEOUT,
    SESSION_TIMEOUT_MS,
)

__all__ = ["DEFAULT_PORT", "URL_OPTIONS", "Settings", "parse"]

#: The port of a host named without one: Kafka's.
DEFAULT_PORT = 9092
#: A Kafka topic name is at most 249 of ``[A-Za-z0-9._-]``; the longest suffix a
#: namespace adds is ``.requests``.
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_SECURITY = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: TLS files, as Kafka's clients name them: the CA that signs the brokers'
#: certificates, a client certificate and its key.
_TLS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
_OPTIONS = frozenset(
    {
        "prefix",
        "scheduler",
        "request_timeout",
        "deliver_topic",
        "deliver_key",
        "retention_bytes",
        "fast_put",
        "standby",
        "shards",
        "scheduler_shards",
        "fetch_wait_ms",
        "session_timeout",
        "idempotence",
        "security_protocol",
        "sasl_mechanism",
        *_TLS,
    }
)
#: The query parameters a Kafka URL may carry (each may be a keyword option too).
URL_OPTIONS = _OPTIONS


@dataclass(frozen=True)
class Settings:
    """One backend object's settings."""

    bootstrap: tuple[str, ...]
    """``host:port`` of each broker of the URL's list, what a client bootstraps from."""
    prefix: str
    scheduler: Candidacy
    request_timeout: float
    deliver: tuple[str, str] | None
    """``(topic, key)`` every message of this object's queues is produced to at its
    time ("" key: none), or None: consumers reserve them."""
    retention_bytes: int = DEFAULT_RETENTION_BYTES
    fast_put: bool = True
    url: str = ""
    standby: bool = False
    fetch_wait_ms: int = DEFAULT_FETCH_WAIT_MS
    """``fetch.max.wait.ms`` of the readers that tail a topic."""
    idempotence: bool = True
    """Whether the producer is idempotent (Kafka's ``enable.idempotence``)."""
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    """``session.timeout.ms`` of a candidate's member of the election's group: how long
    an elected scheduler that stopped heartbeating holds the election."""
    security: dict[str, str] = field(default_factory=dict)
    """``security_protocol``, ``sasl_mechanism`` and the SASL user and password, as
    aiokafka's clients take them."""
    tls: dict[str, str] = field(default_factory=dict)
    """The TLS files (``cafile``, ``certfile``, ``keyfile``) of an SSL connection."""
    shards: int = 1
    """The namespace's shards: each a namespace of its own (``<prefix>.<k>`` when there
    are more than one), with its own scheduler, for the queues whose names fall to it."""
    scheduler_shards: frozenset[int] | None = None
    """The shards whose election this object stands for (None: every one)."""


def parse(url: str, options: dict[str, Any]) -> Settings:
    """The settings of ``url`` and the keyword options; UnsupportedURL, ValueError or
    TypeError, naming it, for anything it cannot take."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "kafka":
        raise UnsupportedURL(f"a Kafka URL starts with kafka://, not {url!r}")
    if parts.path not in ("", "/"):
        raise UnsupportedURL(f"a Kafka URL has no path (the namespace is prefix=...): {url!r}")
    userinfo, at, host_list = parts.netloc.rpartition("@")
    bootstrap = tuple(_host(host, url) for host in host_list.split(","))
    given = dict(parse_qsl(parts.query, keep_blank_values=True))
    check_url_options(url, given, URL_OPTIONS)
    extra = sorted(set(options) - _OPTIONS)
    if extra:
        raise TypeError(f"unknown option(s) for a kafka:// queue: {', '.join(extra)}")
    merged = {**given, **options}
    prefix = merged.get("prefix", DEFAULT_PREFIX)
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"prefix must be 1-200 letters, digits or _.- (not starting with _.-), not {prefix!r}"
        )
    shards = shard_count(merged.get("shards", 1))
    return Settings(
        bootstrap,
        prefix,
        candidacy(merged.get("scheduler", "auto")),
        request_timeout(merged.get("request_timeout", DEFAULT_REQUEST_TIMEOUT)),
        _deliver(merged),
        retention(merged.get("retention_bytes", DEFAULT_RETENTION_BYTES), MIN_RETENTION_BYTES),
        switch("fast_put", merged.get("fast_put", True)),
        url=url,
        standby=hot_standby(merged.get("standby", "cold")),
        fetch_wait_ms=_fetch_wait(merged.get("fetch_wait_ms", DEFAULT_FETCH_WAIT_MS)),
        session_timeout_ms=_session_timeout(
            merged.get("session_timeout", SESSION_TIMEOUT_MS / 1000)
        ),
        idempotence=switch("idempotence", merged.get("idempotence", True)),
        security=_security(merged, userinfo if at else None, url),
        tls=_tls(merged, url),
        shards=shards,
        scheduler_shards=standing_shards(merged.get("scheduler_shards"), shards),
    )


def _host(host: str, url: str) -> str:
    """``host:port`` of one host of the list (the port Kafka's when none is given)."""
    try:
        parts = urlsplit(f"//{host}")
        port = parts.port
    except ValueError:
        raise UnsupportedURL(f"a host of a Kafka URL has a bad port: {host!r} in {url!r}") from None
    if not parts.hostname:
        raise UnsupportedURL(
            "a Kafka URL names a broker, or a list of them: kafka://host:9092 or "
            f"kafka://h1:9092,h2:9092?prefix=..., not {url!r}"
        )
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{name}:{port or DEFAULT_PORT}"


def _fetch_wait(value: Any) -> int:
    try:
        wait = int(value)
    except (TypeError, ValueError):
        wait = -1
    if isinstance(value, (bool, float)) or not 0 <= wait <= 60_000:
        raise ValueError(
            f"fetch_wait_ms must be a whole number of milliseconds from 0 to 60000, not {value!r}"
        )
    return wait


def _session_timeout(value: Any) -> int:
    """``session_timeout`` (seconds) in whole milliseconds, within the bounds a Kafka
    broker takes by default (``group.min.session.timeout.ms`` 6 s, ``group.max...`` 30
    min): one it refused would leave the candidate unelected, its joins failing."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not MIN_SESSION_TIMEOUT <= seconds <= MAX_SESSION_TIMEOUT:
        raise ValueError(
            f"session_timeout must be seconds from {MIN_SESSION_TIMEOUT:g} to "
            f"{MAX_SESSION_TIMEOUT:g}, not {value!r}"
        )
    return round(seconds * 1000)


def _security(merged: dict[str, Any], userinfo: str | None, url: str) -> dict[str, str]:
    protocol = merged.get("security_protocol", "PLAINTEXT")
    if protocol not in _SECURITY:
        raise ValueError(
            f"security_protocol must be one of {', '.join(_SECURITY)}, not {protocol!r}"
        )
    sasl = protocol.startswith("SASL_")
    mechanism = merged.get("sasl_mechanism")
    if mechanism is not None and not sasl:
        raise ValueError(
            f"sasl_mechanism needs security_protocol=SASL_PLAINTEXT or SASL_SSL, not {protocol}"
        )
    if mechanism is not None and mechanism not in _MECHANISMS:
        raise ValueError(
            f"sasl_mechanism must be one of {', '.join(_MECHANISMS)}, not {mechanism!r}"
        )
    security = {"security_protocol": protocol}
    if not sasl:
        if userinfo is not None:
            raise UnsupportedURL(
                "the user and password of a Kafka URL are SASL credentials: add "
                f"security_protocol=SASL_SSL (or SASL_PLAINTEXT) to {url!r}"
            )
        return security
    user, colon, password = (userinfo or "").partition(":")
    if not user or not colon:
        raise UnsupportedURL(
            f"security_protocol={protocol} takes the SASL user and password from the URL: "
            f"kafka://user:password@host:9092?..., not {url!r}"
        )
    security.update(
        sasl_mechanism=mechanism or "PLAIN",
        sasl_plain_username=unquote(user),
        sasl_plain_password=unquote(password),
    )
    return security


def _tls(merged: dict[str, Any], url: str) -> dict[str, str]:
    given = {key: merged[key] for key in _TLS if key in merged}
    protocol = merged.get("security_protocol", "PLAINTEXT")
    if given and protocol not in ("SSL", "SASL_SSL"):
        names = ", ".join(given)
        raise UnsupportedURL(
            f"{names} {'is a TLS option' if len(given) == 1 else 'are TLS options'}: they "
            f"need security_protocol=SSL or SASL_SSL, in {url!r}"
        )
    for key, value in given.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"{key} must name a file, not {value!r}")
    if "ssl_keyfile" in given and "ssl_certfile" not in given:
        raise UnsupportedURL(f"ssl_keyfile needs ssl_certfile (the client certificate): {url!r}")
    return {key.removeprefix("ssl_"): value for key, value in given.items()}


def _deliver(merged: dict[str, Any]) -> tuple[str, str] | None:
    topic = merged.get("deliver_topic")
    key = merged.get("deliver_key")
    if topic is None:
        if key is not None:
            raise ValueError("deliver_key needs deliver_topic")
        return None
    if not isinstance(topic, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", topic):
        raise ValueError(
            f"deliver_topic must be a Kafka topic name (1-249 letters, digits or ._-), "
            f"not {topic!r}"
        )
    if topic in (".", ".."):
        raise ValueError(f"deliver_topic cannot be {topic!r}")
    if key is not None and (not isinstance(key, str) or len(key.encode()) > 1024):
        raise ValueError(f"deliver_key must be text of at most 1024 bytes, not {key!r}")
    return topic, key or ""

"""Queue URLs: which backend serves which scheme, found through its descriptor.

Each backend is a package that exports ``DESCRIPTOR``, a
:class:`~delayq.durable.descriptor.BackendDescriptor`; :data:`BACKENDS` lists
delayq's own. Their packages import no client library: the registry imports them (by
module path, as the layers want) the first time a URL is looked up, and a backend's
client the first time a URL of its scheme is opened (:func:`driver`), once per process.
A client that is not installed is :class:`~delayq.errors.BackendNotInstalled`, whose
one line names the extra to install. Every face asks here, not a backend: the schemes
(:func:`scheme_of`), the openers, :func:`outage_errors`, :func:`consumer_options`,
:func:`database_file`.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .._redact import redact_url
from ..errors import BackendNotInstalled, UnsupportedURL
from .constants import DEFAULT_QUEUE_URL, QUEUE_URL_ENV
from .descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:  # for annotations only: the queue faces import the registry
    from .backend import AsyncBackend, Backend

__all__ = [
    "BACKENDS",
    "BASE_OUTAGE_ERRORS",
    "client_errors",
    "consumer_options",
    "database_file",
    "default_url",
    "descriptor",
    "descriptors",
    "driver",
    "open_async_backend",
    "open_backend",
    "outage_errors",
    "redact_url",
    "register_backend",
    "register_scheme",
    "scheme_of",
]

#: The packages of delayq's backends, each exporting ``DESCRIPTOR``: a new backend is
#: one package and one line here (docs/backends.md).
BACKENDS: tuple[str, ...] = (
    "delayq.backends.memory",
    "delayq.backends.sqlite",
    "delayq.backends.redis",
    "delayq.backends.postgres",
    "delayq.backends.amqp",
    "delayq.backends.kafka",
)

#: scheme -> its backend, built at the first look-up (None until then).
_by_scheme: dict[str, BackendDescriptor] | None = None
#: backend -> its loaded driver.
_drivers: dict[BackendDescriptor, BackendDriver] = {}


def _import_descriptor(module: str) -> BackendDescriptor:
    found = getattr(importlib.import_module(module), "DESCRIPTOR", None)
    if not isinstance(found, BackendDescriptor):
        raise TypeError(
            f"{module} exports no DESCRIPTOR (a delayq.durable.descriptor.BackendDescriptor)"
        )
    return found


def _table() -> dict[str, BackendDescriptor]:
    global _by_scheme
    table = _by_scheme
    if table is None:
        table = {}
        for module in BACKENDS:
            found = _import_descriptor(module)
            for scheme in found.schemes:
                table.setdefault(scheme, found)
        _by_scheme = table
    return table


def register_backend(module: str) -> BackendDescriptor:
    """Serve the schemes of the backend package ``module`` (a dotted name that exports
    ``DESCRIPTOR``), before delayq's own backends of the same schemes; its descriptor."""
    global _by_scheme
    found = _import_descriptor(module)
    _by_scheme = {**_table(), **dict.fromkeys(found.schemes, found)}
    return found


def register_scheme(scheme: str, module: str) -> None:
    """Serve ``scheme://`` URLs too with the backend package ``module``, which exports
    ``DESCRIPTOR`` (``"sqlite"`` means ``delayq.backends.sqlite``; a dotted name is
    imported as is)."""
    global _by_scheme
    found = _import_descriptor(module if "." in module else f"delayq.backends.{module}")
    _by_scheme = {**_table(), scheme.lower(): found}


def descriptors() -> tuple[BackendDescriptor, ...]:
    """Every backend a URL may name, each once, in :data:`BACKENDS` order."""
    return tuple({id(found): found for found in _table().values()}.values())


def default_url() -> str:
    """``$DELAYQ_URL`` when set and not empty, else ``sqlite:///delayq.db``."""
    return os.environ.get(QUEUE_URL_ENV) or DEFAULT_QUEUE_URL


def _supported() -> str:
    return ", ".join(f"{scheme}://" for scheme in _table())


def scheme_of(url: object) -> str:
    """The lower-cased scheme of ``url``; :class:`UnsupportedURL` if it is not a
    well-formed URL of a scheme delayq knows."""
    if not isinstance(url, str):
        raise UnsupportedURL(f"a queue URL is a str, not {type(url).__name__}")
    if "://" not in url:
        raise UnsupportedURL(
            f"malformed queue URL {redact_url(url)!r}: expected scheme://..., "
            f"one of the supported schemes: {_supported()}"
        )
    failure = None
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:  # a host list (cluster) is checked by its backend
            _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        failure = _parse_failure(exc)
    if failure is not None:  # raised here, so that urllib's error is not its context
        raise UnsupportedURL(f"malformed queue URL {redact_url(url)!r}: {failure}")
    scheme = parts.scheme.lower()
    if not scheme or scheme not in _table():
        raise UnsupportedURL(
            f"unsupported queue URL {redact_url(url)!r}: the supported schemes are {_supported()}"
        )
    return scheme


def _parse_failure(exc: ValueError) -> str:
    """What urllib found wrong, in words that quote no part of the URL: its messages
    quote the port or the host as it split them, which, when a password holds ``/``,
    ``#`` or ``?``, is a piece of the password."""
    text = str(exc)
    if text.startswith("Port out of range"):
        return "its port is not in 0-65535"
    if text.startswith("Port could not be cast"):
        return "its port is not a number (a '/', '?' or '#' in a password must be %-escaped)"
    if "IPv6" in text or "IPv4" in text:
        return "its bracketed host is not an IPv6 address, or a bracket is not closed"
    return "it does not parse as scheme://[user:password@]host[:port]/..."


def descriptor(url: object) -> BackendDescriptor:
    """The backend that serves ``url``; :class:`UnsupportedURL` as :func:`scheme_of`."""
    return _table()[scheme_of(url)]


def driver(url: object) -> BackendDriver:
    """The loaded part of the backend that serves ``url`` (its client library imported
    on the first call); :class:`BackendNotInstalled` when that library is missing."""
    scheme = scheme_of(url)
    found = _table()[scheme]
    loaded = _drivers.get(found)
    if loaded is None:
        loaded = _drivers[found] = _load(found, scheme)
    return loaded


def _load(found: BackendDescriptor, scheme: str) -> BackendDriver:
    try:
        return found.load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in found.client:
            raise
        raise BackendNotInstalled(
            f"{scheme}:// needs {missing}, which is not installed: {found.install_hint}",
            found.extra,
        ) from exc


def open_backend(url: str, **options: Any) -> Backend:
    """Open the sync backend that serves ``url``."""
    return driver(url).open_backend(url, **options)


def open_async_backend(url: str, **options: Any) -> AsyncBackend:
    """Open the async backend that serves ``url``."""
    return driver(url).open_async_backend(url, **options)


#: What any backend raises when it does not answer: the network's errors and timeouts.
BASE_OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncio.TimeoutError,  # not TimeoutError before Python 3.11
)


def outage_errors(url: str) -> tuple[type[Exception], ...]:
    """The exceptions that mean "the backend of ``url`` does not answer" (Redis down, a
    SQLite file locked or gone), not a bug of delayq: an outage to wait out, or a 503
    over HTTP, never a 500. :data:`BASE_OUTAGE_ERRORS` and the backend's own (its
    driver loaded for them)."""
    return BASE_OUTAGE_ERRORS + driver(url).outage_errors


def client_errors(url: str) -> tuple[type[Exception], ...]:
    """The exceptions that mean "the store of ``url`` refused or cannot be used" (a
    wrong password, a file that is not a database), outages included: a user's
    mistake or the environment's, shown as one line, not a bug of delayq."""
    loaded = driver(url)
    return BASE_OUTAGE_ERRORS + loaded.outage_errors + loaded.errors


def consumer_options(url: str) -> dict[str, Any]:
    """Options with which a long-running consumer process (``delayq worker``, ``delayq
    serve``, ``delayq scheduler``) opens the queues of ``url``, its startup check
    included: the backend's ``consumer_options`` (a replicated backend: stand for its
    scheduler at once)."""
    return dict(descriptor(url).consumer_options)


def database_file(url: str) -> str | None:
    """The absolute path of the local file that holds the queues of ``url`` (asked of
    its backend), None for a backend that keeps no file; :class:`UnsupportedURL` for a
    malformed URL."""
    find = descriptor(url).database_file
    return None if find is None else find(url)

"""What a backend tells delayq about itself: one :class:`BackendDescriptor` per backend,
exported by its package as ``DESCRIPTOR``.

The registry (:mod:`.registry`), the CLI, the Worker, ``delayq serve`` and
``delayq scheduler`` read a backend only through it, so none of them names a scheme or
a client library. Building one imports nothing: what needs the backend's client
library (its openers and its errors) is a :class:`BackendDriver` that ``load()``
imports the first time a URL of the backend is opened. A client that is not
installed is then :class:`~delayq.errors.BackendNotInstalled`, which names the extra
that installs it.

Each backend declares the query parameters its URLs take and refuses any other with
:func:`check_url_options`: one :class:`~delayq.errors.UnsupportedURL` that names it and
lists the accepted ones, before anything connects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import UnsupportedURL

if TYPE_CHECKING:  # for annotations only: the backends import this module
    from .backend import AsyncBackend, Backend

__all__ = ["BackendDescriptor", "BackendDriver", "check_url_options"]


@dataclass(frozen=True)
class BackendDriver:
    """The part of a backend that needs its client library, built by importing it.

    ``open_backend(url, **options)`` and ``open_async_backend(url, **options)`` open its
    sync and asyncio faces. ``outage_errors``: what it raises when its store does not
    answer (a refused connection, a timeout), which a Worker and the callback
    dispatcher wait out and the server answers with a 503. ``errors``: every error of
    its client library that means the store refused or cannot be used (a wrong
    password, a file that is not a database), outages included, which the CLI shows
    as one line.
    """

    open_backend: Callable[..., Backend]
    open_async_backend: Callable[..., AsyncBackend]
    outage_errors: tuple[type[Exception], ...] = ()
    errors: tuple[type[Exception], ...] = ()


@dataclass(frozen=True, eq=False)  # one object per backend, hashed by identity
class BackendDescriptor:
    """One backend, as every face of delayq sees it.

    ``name``: how messages name it (``"redis"``). ``schemes``: the URL schemes it
    serves, lower case. ``load``: imports its client library and returns its
    :class:`BackendDriver` (called once per process). ``client``: the top-level
    modules of that library: a ``ModuleNotFoundError`` of one of them while loading
    means the library is not installed. ``extra``: the extra of delayq that installs
    it (``pip install 'delayq[<extra>]'``), None when it comes with Python.
    ``consumer_options``: the options with which a long-running consumer (``delayq
    worker``, ``delayq serve``, ``delayq scheduler``) opens its queues.
    ``not_guaranteed``: the guarantees of the contract it cannot give, each with the
    reason (the conformance suite skips a test that needs one). ``replicated``: its
    operations are answered by an elected scheduler that some delayq process must run
    (``delayq scheduler``). ``database_file(url)``: the absolute path of the local file
    that holds the queues of a URL, for a backend that keeps one.
    """

    name: str
    schemes: tuple[str, ...]
    load: Callable[[], BackendDriver]
    client: tuple[str, ...] = ()
    extra: str | None = None
    consumer_options: Mapping[str, Any] = field(default_factory=dict)
    not_guaranteed: Mapping[str, str] = field(default_factory=dict)
    replicated: bool = False
    database_file: Callable[[str], str] | None = None

    def __post_init__(self) -> None:
        if not self.schemes or any(s != s.lower() or not s for s in self.schemes):
            raise ValueError(f"{self.name}: schemes must be non-empty and lower case")
        # read-only views, so that no reader changes what every other one sees
        object.__setattr__(self, "consumer_options", MappingProxyType(dict(self.consumer_options)))
        object.__setattr__(self, "not_guaranteed", MappingProxyType(dict(self.not_guaranteed)))

    @property
    def install_hint(self) -> str:
        """How to install the client library: ``pip install 'delayq[redis]'``."""
        if self.extra is None:
            modules = ", ".join(self.client) or "its modules"
            return f"use a Python that has {modules}"
        return f"pip install 'delayq[{self.extra}]'"


def check_url_options(
    url: str,
    given: Iterable[str],
    accepted: Iterable[str],
    *,
    more: Iterable[str] = (),
    more_are: str = "",
) -> None:
    """:class:`~delayq.errors.UnsupportedURL` when a name of ``given`` (the query
    parameters of ``url``) is neither ``accepted`` nor one of ``more``: one line that
    names each unknown one and lists the accepted ones (``more``, a client library's
    long list, in the words of ``more_are``), the same for every backend."""
    allowed = sorted(set(accepted))
    unknown = sorted(set(given) - set(allowed) - set(more))
    if not unknown:
        return
    scheme = urlsplit(url).scheme.lower()
    names = ", ".join(repr(name) for name in unknown)
    what = "unknown options" if len(unknown) > 1 else "an unknown option"
    takes = ", ".join([*allowed, *([f"and {more_are}"] if more_are else [])]) or "no options"
    raise UnsupportedURL(f"the {scheme}:// URL has {what} {names} (it takes {takes})")

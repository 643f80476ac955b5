"""The HTTP/1.1 connection of ``delayq serve``: uvicorn's httptools protocol with the
two limits it lacks, applied while a request's line and headers arrive.

* **Size.** The bytes of a request's line and headers are counted as they arrive;
  past :data:`SERVE_MAX_HEADER_BYTES` the client gets a 431 and the connection is
  closed, before anything of the request is handed to the app.
* **Time.** A connection must deliver a complete request head within
  :data:`SERVE_CLIENT_TIMEOUT` seconds: of being opened (a connection that sends
  nothing), and of the first byte of each later request. Past it the connection is
  closed, with a 408 when a request had begun. A connection idle between requests is
  closed by uvicorn's keep-alive timeout, and a slow body by
  :class:`~._limits.BodyLimit`'s read timeouts.

A request's head ends where httptools says (``on_headers_complete``) and the next
begins after its body (``on_message_complete``); these are httptools' parser
callbacks, which the uvicorn protocol implements and this subclass extends.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .._constants import SERVE_CLIENT_TIMEOUT, SERVE_MAX_HEADER_BYTES

__all__ = ["GuardedHttpToolsProtocol"]


def _reply(transport: asyncio.Transport, status: bytes, text: bytes) -> None:
    if not transport.is_closing():
        transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(text)).encode() + b"\r\nconnection: close\r\n\r\n" + text
        )
    transport.close()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a cap on the size of a request's head and a
    deadline for it (see the module's docstring)."""

    max_header_bytes = SERVE_MAX_HEADER_BYTES
    header_timeout = SERVE_CLIENT_TIMEOUT

    @classmethod
    def limited(cls, *, header_timeout: float) -> type[GuardedHttpToolsProtocol]:
        """This protocol with another head deadline (``delayq serve --client-timeout``)."""
        return type(cls.__name__, (cls,), {"header_timeout": header_timeout})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start counting the first request's head, and its deadline."""
        self._delayq_in_head = True
        self._delayq_head_bytes = 0
        self._delayq_began = False
        self._delayq_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._delayq_arm()

    def _delayq_arm(self) -> None:
        if self._delayq_timer is None:
            loop = asyncio.get_running_loop()
            self._delayq_timer = loop.call_later(self.header_timeout, self._delayq_too_slow)

    def _delayq_disarm(self) -> None:
        if self._delayq_timer is not None:
            self._delayq_timer.cancel()
            self._delayq_timer = None

    def _delayq_too_slow(self) -> None:
        self._delayq_timer = None
        if self._delayq_in_head and not self.transport.is_closing():
            if self._delayq_began:
                _reply(self.transport, b"408 Request Timeout", b"request head too slow")
            else:
                self.transport.close()

    def data_received(self, data: bytes) -> None:
        """Feed the parser; refuse a head that outgrows the cap."""
        if self._delayq_in_head:
            self._delayq_began = True
            self._delayq_head_bytes += len(data)
            self._delayq_arm()
        super().data_received(data)
        if (
            self._delayq_in_head
            and self._delayq_head_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._delayq_disarm()
            _reply(
                self.transport,
                b"431 Request Header Fields Too Large",
                b"request headers too large",
            )

    def on_headers_complete(self) -> None:
        """The head is complete: its limits end here."""
        self._delayq_in_head = False
        self._delayq_disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The body is complete: what follows is the next request's head."""
        super().on_message_complete()
        self._delayq_in_head = True
        self._delayq_head_bytes = 0
        self._delayq_began = False

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._delayq_disarm()
        super().connection_lost(exc)

"""The HTTP/1.1 connection of ``delayq serve``: uvicorn's httptools protocol with the
limits it lacks, applied to the bytes as they arrive.

* **Head size.** The bytes of a request's line and headers are counted as they
  arrive; past :data:`SERVE_MAX_HEADER_BYTES` the client gets a 431 and the
  connection is closed, before anything of the request is handed to the app.
* **Head time.** A connection must deliver a complete request head within
  ``header_timeout`` seconds: of being opened (a connection that sends nothing), and
  of the first byte of each later request. Past it the connection is closed, with a
  408 when a request had begun.
* **Body time.** Each piece of a body must arrive within ``body_timeout`` seconds of
  the last, and the whole within :data:`SERVE_BODY_TIMEOUT`; past either, a 408 and
  the connection is closed. The app has not answered by then: it reads a whole body
  before it answers (:class:`~._limits.BodyLimit`).
* **Unreadable requests.** What httptools cannot parse (a malformed
  ``Content-Length``, request line or header) is a 400 ``bad_request`` in the API's
  JSON shape, not uvicorn's plain-text one (:meth:`send_400_response`, which uvicorn
  calls for each), and the connection is closed.

A connection idle between requests is closed by uvicorn's keep-alive timeout. The
deadlines cost nothing to a request that arrives in one piece: a timer is set only
when a feed of bytes leaves a head or a body incomplete. A request's head ends where
httptools says (``on_headers_complete``), its body too (``on_message_complete``);
these are httptools' parser callbacks, which the uvicorn protocol implements and this
subclass extends.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .._constants import SERVE_CLIENT_TIMEOUT
from ._constants import SERVE_BODY_TIMEOUT, SERVE_MAX_HEADER_BYTES
from ._errors import check_code

__all__ = ["GuardedHttpToolsProtocol"]


def _reply(transport: asyncio.Transport, status: bytes, code: str, message: str) -> None:
    """Answer with a JSON error (the API's shape) and close the connection."""
    check_code(int(status[:3]), code)
    if not transport.is_closing():
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
        )
    transport.close()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a cap on the size of a request's head and
    deadlines for its head and its body (see the module's docstring)."""

    max_header_bytes = SERVE_MAX_HEADER_BYTES
    header_timeout = SERVE_CLIENT_TIMEOUT
    body_timeout = SERVE_CLIENT_TIMEOUT
    body_total_timeout = SERVE_BODY_TIMEOUT

    @classmethod
    def limited(cls, *, client_timeout: float) -> type[GuardedHttpToolsProtocol]:
        """This protocol with other deadlines (``delayq serve --client-timeout``)."""
        attributes = {
            "header_timeout": client_timeout,
            "body_timeout": client_timeout,
            "body_total_timeout": max(SERVE_BODY_TIMEOUT, client_timeout),
        }
        return type(cls.__name__, (cls,), attributes)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start counting the first request's head, and its deadline."""
        self._delayq_in_head = True
        self._delayq_in_body = False
        self._delayq_head_bytes = 0
        self._delayq_began = False
        self._delayq_body_deadline = 0.0
        self._delayq_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._delayq_arm(self.header_timeout)

    def _delayq_arm(self, seconds: float) -> None:
        self._delayq_disarm()
        loop = asyncio.get_running_loop()
        self._delayq_timer = loop.call_later(seconds, self._delayq_too_slow)

    def _delayq_disarm(self) -> None:
        if self._delayq_timer is not None:
            self._delayq_timer.cancel()
            self._delayq_timer = None

    def _delayq_too_slow(self) -> None:
        self._delayq_timer = None
        if self.transport.is_closing():
            return
        if self._delayq_in_body:
            _reply(
                self.transport,
                b"408 Request Timeout",
                "body_timeout",
                "the request body did not arrive in time",
            )
        elif self._delayq_in_head and self._delayq_began:
            _reply(
                self.transport,
                b"408 Request Timeout",
                "header_timeout",
                "the request line and headers did not arrive in time",
            )
        elif self._delayq_in_head:
            self.transport.close()  # never sent a byte: nothing to answer

    def data_received(self, data: bytes) -> None:
        """Feed the parser; refuse a head that outgrows the cap; set a deadline for
        what this feed left incomplete."""
        if self._delayq_in_head:
            if not self._delayq_began:
                self._delayq_began = True
                self._delayq_arm(self.header_timeout)
            self._delayq_head_bytes += len(data)
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._delayq_in_head and self._delayq_head_bytes > self.max_header_bytes:
            self._delayq_disarm()
            _reply(
                self.transport,
                b"431 Request Header Fields Too Large",
                "headers_too_large",
                f"the request headers are larger than {self.max_header_bytes} bytes",
            )
        elif self._delayq_in_body:
            loop = asyncio.get_running_loop()
            left = self._delayq_body_deadline - loop.time()
            self._delayq_arm(max(0.0, min(self.body_timeout, left)))

    def send_400_response(self, msg: str) -> None:
        """Answer a request httptools cannot parse with a JSON 400 and close."""
        self._delayq_disarm()
        _reply(
            self.transport,
            b"400 Bad Request",
            "bad_request",
            "the request cannot be read as HTTP/1.1 (a malformed request line, header or "
            "Content-Length)",
        )

    def on_headers_complete(self) -> None:
        """The head is complete: its limits end, the body's begin."""
        self._delayq_in_head = False
        self._delayq_in_body = True
        self._delayq_body_deadline = asyncio.get_running_loop().time() + self.body_total_timeout
        self._delayq_disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The body is complete: what follows is the next request's head."""
        super().on_message_complete()
        self._delayq_in_body = False
        self._delayq_in_head = True
        self._delayq_head_bytes = 0
        self._delayq_began = False
        self._delayq_disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline with the connection."""
        self._delayq_disarm()
        super().connection_lost(exc)

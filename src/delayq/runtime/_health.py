"""``/healthz`` and ``/readyz`` of a long-running Worker, for an orchestrator's probes,
and its ``/metrics`` for Prometheus: a tiny HTTP/1.1 responder on the Worker's own
event loop (no web framework). One socket may answer all three (``--health-port`` and
``--metrics-port`` the same), or the probes or the metrics alone.

``/healthz`` is 200 while the loop turns: it is answered by the loop, so a loop that
is stuck (a handler that blocks it) leaves the probe without an answer. ``/readyz``
is 200 when ``not_ready()`` says nothing, else 503 with its reason as JSON (and so is
``/healthz`` when a ``not_alive()`` is given and says why: a supervisor's, for a child
whose loop is stuck). Strict:
GET (and HEAD) only, 405 for another method, 404 for another path, 400 for a request
that is not HTTP; the request's head is read within a deadline and a size cap, and
the connection is closed after each answer.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable

from .._timeout import within
from ._metrics import METRICS_CONTENT_TYPE

__all__ = ["HEALTH_PATHS", "METRICS_PATH", "start_health"]

#: The paths of the probes.
HEALTH_PATHS = ("/healthz", "/readyz")
#: The path of the metrics.
METRICS_PATH = "/metrics"

#: The most bytes of a request's head read; a longer one is refused.
_MAX_HEAD = 8192
#: Seconds a client has to send its request's head.
_HEAD_DEADLINE = 5.0

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(
    status: int,
    body: dict[str, object] | bytes,
    *,
    head_only: bool,
    content_type: str = "application/json",
) -> bytes:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode() + b"\n"
    reason = _REASONS.get(status, "Service Unavailable")
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(payload)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + payload


_Why = Callable[[], str | None]
_Render = Callable[[], bytes]


def _status(reason: str | None, ok: str, *, head_only: bool) -> bytes:
    if reason is None:
        return _response(200, {"status": ok}, head_only=head_only)
    return _response(503, {"status": f"not {ok}", "reason": reason}, head_only=head_only)


def _answer(
    request_line: bytes, not_ready: _Why | None, not_alive: _Why | None, metrics: _Render | None
) -> bytes:
    parts = request_line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _response(400, {"error": "bad request"}, head_only=False)
    method, target, _ = parts
    path = target.split("?", 1)[0]
    paths = (*(HEALTH_PATHS if not_ready is not None else ()), *([METRICS_PATH] if metrics else []))
    if path not in paths:
        return _response(404, {"error": f"only {' and '.join(paths)}"}, head_only=False)
    if method not in ("GET", "HEAD"):
        return _response(405, {"error": "GET only"}, head_only=False)
    head_only = method == "HEAD"
    if path == METRICS_PATH:
        assert metrics is not None
        return _response(200, metrics(), head_only=head_only, content_type=METRICS_CONTENT_TYPE)
    assert not_ready is not None
    if path == "/healthz":
        return _status(None if not_alive is None else not_alive(), "ok", head_only=head_only)
    return _status(not_ready(), "ready", head_only=head_only)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line, once the whole head arrived (None: too long, or cut)."""
    try:
        head = await within(reader.readuntil(b"\r\n\r\n"), _HEAD_DEADLINE)
    except (asyncio.LimitOverrunError, asyncio.IncompleteReadError, ValueError):
        return None
    return head.split(b"\r\n", 1)[0]


async def start_health(
    sock: socket.socket,
    not_ready: _Why | None,
    not_alive: _Why | None = None,
    *,
    metrics: _Render | None = None,
) -> asyncio.Server:
    """Serve ``/healthz`` and ``/readyz`` on the listening ``sock`` from the running
    loop; ``not_ready()`` is why the process is not ready, or None (``not_ready``
    None: no probes); ``not_alive()`` why it is not alive. With ``metrics``,
    ``/metrics`` answers what it returns (Prometheus' text format)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await _read_head(reader)
            if line is None:
                writer.write(_response(400, {"error": "bad request"}, head_only=False))
            else:
                writer.write(_answer(line, not_ready, not_alive, metrics))
            await within(writer.drain(), _HEAD_DEADLINE)
        except (OSError, TimeoutError):
            pass  # the client went, or did not read: nothing to tell it
        finally:
            writer.close()

    return await asyncio.start_server(handle, sock=sock, limit=_MAX_HEAD)

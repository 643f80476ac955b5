"""The callback dispatcher of ``delayq serve``: sends each callback message to its URL
when it falls due.

For each of ``config.callback_queues`` a reserver claims due messages: at most
``config.dispatch_concurrency`` requests are in flight (over all queues), and up to
``config.dispatch_prefetch`` more messages (default: none) are reserved
ahead of a free place, in batches, each waiting its turn with its lease renewed, so
the next request leaves without waiting for a reserve round trip. A blocking
``reserve`` wakes when the next message falls due, so a callback leaves within
milliseconds of its due time. Each message is one request:

* 2xx: ``ack`` (the acks of requests ending close together go out as one
  ``ack_many``, :mod:`delayq.runtime.ack_batch`);
* another status, a timeout or a connection error: ``nack`` with the queue's retry
  policy (``dead`` once its attempts are used up, with ``last_error`` such as
  ``HTTP 500 from https://...`` or ``timeout after 10s calling https://...``);
* no callback header, a malformed one, a payload that cannot be read (written by
  another serializer), an id that is not Unicode text (a lone surrogate), or a host
  the allowlist refuses now (the configuration may have changed since the put): dead
  at once.

``X-Delayq-Message-Id`` and ``X-Delayq-Queue`` carry the id and the queue name as
they are when a header can (printable ASCII, no space at either end), else encoded
(``UTF-8''`` then the percent-encoded UTF-8 bytes:
:func:`~delayq.server._callbacks.message_id_header`,
:func:`~delayq.server._callbacks.queue_header`); v2 signs the id's header value as
sent, and v3 the queue, attempt and content type headers too. A GET is sent without a
body (a put refuses a payload with one).

Each connection is checked when it is opened, by a network backend under httpx: the
host httpx connects to (its own IDNA encoding of the name, whatever the URL looked
like) and the port must match the allowlist, then the name is resolved there and the
connection goes only to allowed addresses, so a name that resolves to loopback,
link-local or a private range is refused even if it looked harmless at put (DNS
rebinding). ``localhost`` and the names below it (``app.localhost``) are not
resolved: they go to 127.0.0.1, then ::1 (RFC 6761 6.3), so DNS cannot send a name
the loopback flag admitted to another address. Redirects are not followed; proxies
from the environment are ignored.

The lease of a reservation is the longest callback timeout plus a margin, so a
request normally never needs it renewed; a message still held a third of the lease
after its reservation (waiting behind others, a slow receiver, or a stalled loop) has
it extended, and again every third of the lease until it is settled, as a Worker's
jobs: a failed extend is tried again before the lease runs out.
:meth:`Dispatcher.stop` stops reserving, gives the waiting messages back at once, lets
requests in flight finish for ``grace`` seconds, then gives the rest back; a message
given back is due again at once, its attempt not charged. Every outcome is counted in
the server's metrics and logged on the ``delayq`` logger as ``callback.<outcome>
key=value ...``. A backend that stops answering is tried again with a doubling pause
(``dispatch.backend_unavailable``, one line per step, then ``dispatch.backend_back``),
and the server's :attr:`~._state.ServerState.backend_up` follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
import typing
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import httpcore
import httpx

from .. import __version__
from .._log import log_event
from .._timeout import within
from ..durable import AsyncQueue, Message
from ..durable.message import State
from ..durable.serializer import JSONSerializer
from ..durable.tracing import processing, run_ids
from ..errors import LeaseLost, QueueClosed
from ..runtime.ack_batch import AckBatcher
from ..runtime.constants import WORKER_EXTEND_DIVISOR
from ..runtime.consumer import LeaseRenewer, check_prefetch, prefetch_slots, reserve_loop
from ..runtime.outage import Outage
from ..runtime.pool import Gate, Slots
from ._callbacks import (
    BODILESS_METHODS,
    Callback,
    CallbackError,
    address_refusal,
    check_host,
    connection_refusal,
    fixed_addresses,
    message_id_header,
    queue_header,
    sign,
)
from ._config import ServeConfig
from ._constants import (
    CALLBACK_HEADER,
    CALLBACK_LEASE_MARGIN,
    CALLBACK_MAX_RESPONSE_READ,
    CALLBACK_SIGNATURE_HEADER,
    DISPATCH_ERROR_BACKOFF,
    DISPATCH_GRACE,
    DISPATCH_IDLE_WAIT,
    DISPATCH_POOL_CONNECTIONS,
)
from ._state import ServerState

__all__ = ["CallbackRefused", "Dispatcher", "Resolve"]

_INFO, _WARNING, _ERROR, _DEBUG = logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG
_JSON = JSONSerializer()


class CallbackRefused(Exception):
    """A callback target the configuration does not allow (raised while connecting
    when the host or port is not allowed, or the host resolves to a refused address)."""


#: How a host name is resolved for a callback: ``(host, port)`` -> its addresses.
Resolve = Callable[[str, int], Awaitable[list[str]]]


async def _getaddrinfo(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the system resolver (``OSError`` when none)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _GuardedNetwork(httpcore.AsyncNetworkBackend):
    """Opens TCP connections only where the configuration allows: the host httpx
    connects to, and its port, must pass the allowlist (:func:`connection_refusal`)
    before the name is resolved; then it is resolved here (by ``resolve``, the system
    resolver by default) and the connection goes to a checked address, so the name
    cannot resolve differently between the check and the connect. ``localhost`` and
    the names below it go to the loopback addresses, never to a resolver."""

    def __init__(self, config: ServeConfig, resolve: Resolve = _getaddrinfo) -> None:
        self._config = config
        self._resolve = resolve
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Refuse ``host``:``port`` unless the allowlist has it; resolve ``host`` (a
        ``localhost`` name or an IP literal is not resolved: :func:`fixed_addresses`),
        refuse it if any address is refused, connect to the first address that
        answers."""
        reason = connection_refusal(host, port, self._config)
        if reason is not None:
            raise CallbackRefused(f"connection to {host}:{port} refused: {reason}")
        fixed = fixed_addresses(host)
        try:
            addresses = list(fixed) if fixed is not None else await self._resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        for address in addresses:
            reason = address_refusal(address, self._config)
            if reason is not None:
                raise CallbackRefused(f"host {host} resolves to a refused address: {reason}")
        failure: Exception = httpcore.ConnectError(f"no address for {host}")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Never: callbacks go over TCP only."""
        raise CallbackRefused("callbacks do not use unix sockets")

    async def sleep(self, seconds: float) -> None:
        """As the wrapped backend sleeps."""
        await self._inner.sleep(seconds)


# httpcore's errors as the httpx errors the dispatcher sorts outcomes by.
_ERRORS: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> typing.Iterator[None]:
    try:
        yield
    except httpcore.TimeoutException as exc:
        raise _translated(exc) from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        raise _translated(exc) from exc


def _translated(exc: Exception) -> httpx.HTTPError:
    for source, target in _ERRORS:
        if isinstance(exc, source):
            return target(str(exc))
    return httpx.TransportError(str(exc))


class _Body(httpx.AsyncByteStream):
    """An answer's body as httpx reads it, from httpcore's stream; ``closed()`` is
    called once it is closed."""

    def __init__(
        self,
        stream: typing.AsyncIterable[bytes],
        close: typing.Callable[[], typing.Awaitable[None]],
        closed: typing.Callable[[], None],
    ) -> None:
        self._stream = stream
        self._close = close
        self._closed = closed

    async def __aiter__(self) -> typing.AsyncIterator[bytes]:
        with _as_httpx_errors():
            async for chunk in self._stream:
                yield chunk

    async def aclose(self) -> None:
        try:
            await self._close()
        finally:
            closed, self._closed = self._closed, _nothing
            closed()


def _nothing() -> None:
    pass


class _GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport over httpcore's connection pools, connecting through
    :class:`_GuardedNetwork` (httpx's own transport takes no network backend).

    ``dispatch_concurrency`` connections in all, in pools of
    :data:`DISPATCH_POOL_CONNECTIONS`; a request goes to the pool with the fewest
    requests open, so none waits for a connection while fewer than
    ``dispatch_concurrency`` are open. (One pool of 64 spends milliseconds of CPU per
    request scanning its connections.)"""

    def __init__(self, config: ServeConfig, resolve: Resolve = _getaddrinfo) -> None:
        limit = config.dispatch_concurrency
        network = _GuardedNetwork(config, resolve)
        ssl_context = httpx.create_ssl_context(trust_env=False)
        sizes = [DISPATCH_POOL_CONNECTIONS] * (limit // DISPATCH_POOL_CONNECTIONS)
        if limit % DISPATCH_POOL_CONNECTIONS:
            sizes.append(limit % DISPATCH_POOL_CONNECTIONS)
        self._pools = [
            httpcore.AsyncConnectionPool(
                ssl_context=ssl_context,
                max_connections=size,
                max_keepalive_connections=size,
                keepalive_expiry=30.0,
                network_backend=network,
            )
            for size in sizes
        ]
        self._open = [0] * len(sizes)  # requests open per pool (sent, answer not closed)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on a pooled connection; the answer streams its body."""
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        index = min(range(len(self._pools)), key=self._open.__getitem__)
        self._open[index] += 1
        try:
            with _as_httpx_errors():
                answer = await self._pools[index].handle_async_request(core)
        except BaseException:
            self._open[index] -= 1
            raise
        stream = answer.stream
        assert isinstance(stream, typing.AsyncIterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(stream, answer.aclose, functools.partial(self._closed, index)),
            extensions=answer.extensions,
        )

    def _closed(self, index: int) -> None:
        self._open[index] -= 1

    async def aclose(self) -> None:
        """Close every pooled connection."""
        for pool in self._pools:
            await pool.aclose()


def _shown_url(url: str) -> str:
    """``url`` without its query (which may hold a receiver's token), for errors/logs."""
    return url.split("?", 1)[0].split("#", 1)[0]


def _sent_url(url: httpx.URL) -> str:
    """The URL as the receiver gets it (what v2 signs): the scheme, ``://``, the Host
    header httpx sends (``url.netloc``) and the request target (``url.raw_path``, path
    and query); no fragment."""
    return f"{url.scheme}://{url.netloc.decode('ascii')}{url.raw_path.decode('ascii')}"


def _body_of(msg: Message) -> tuple[bytes, str]:
    """The request body and its content type: bytes as they are, JSON otherwise."""
    if isinstance(msg.payload, (bytes, bytearray)):
        return bytes(msg.payload), "application/octet-stream"
    return _JSON.dumps(msg.payload), "application/json"


class Dispatcher:
    """Delivers the callback messages of ``state``'s callback queues (see the module).

    ``await start()`` begins reserving on the running loop; ``await stop()`` ends it
    gracefully (``grace`` seconds for requests in flight). ``counts`` tells how many
    messages ended how: ``delivered``, ``retried``, ``dead``, ``released``,
    ``lease_lost``.
    """

    def __init__(self, state: ServerState, *, grace: float = DISPATCH_GRACE) -> None:
        if not grace >= 0:
            raise ValueError(f"grace must be seconds >= 0, got {grace!r}")
        self.state = state
        self.config = state.config
        self.grace = float(grace)
        #: The lease of each reservation: the longest timeout plus a margin.
        self.lease = self.config.callback_timeout + CALLBACK_LEASE_MARGIN
        #: How many messages are reserved ahead of a free place for a request.
        self.prefetch = check_prefetch(
            self.config.dispatch_prefetch, self.config.dispatch_concurrency, "dispatch_prefetch"
        )
        self.counts: Counter[str] = Counter()
        self._client: httpx.AsyncClient | None = None
        self._slots: Slots | None = None
        self._gate: Gate | None = None
        self._ackers: dict[str, AckBatcher] = {}
        self._outage: Outage | None = None
        self._reservers: list[asyncio.Task[None]] = []
        self._running: dict[asyncio.Task[None], Message] = {}
        self._releasing = False
        self._stopped = False

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._client is not None and not self._stopped

    @property
    def in_flight(self) -> int:
        """How many callback messages it holds now: requests running, and messages
        reserved ahead waiting for a place."""
        return len(self._running)

    async def start(self) -> None:
        """Start reserving from every callback queue (on the running event loop)."""
        if self._client is not None:
            raise RuntimeError("the dispatcher was started already")
        # httpcore connects through anyio, which loads its event loop backend on its
        # first call: 45-65 ms here, which the first callbacks due would be late by.
        await anyio.sleep(0)
        config = self.config
        self._client = httpx.AsyncClient(
            transport=_GuardedTransport(config),
            follow_redirects=False,
            trust_env=False,
            timeout=config.callback_timeout,
            headers={"User-Agent": f"delayq/{__version__}"},
        )
        self._gate = gate = Gate(config.dispatch_concurrency)
        self._slots = prefetch_slots(
            config.dispatch_concurrency, self.prefetch, lambda: gate.waiting
        )
        self._outage = Outage(
            config.url,
            event_prefix="dispatch",
            first=DISPATCH_ERROR_BACKOFF,
            on_change=self.state.note_backend,
        )
        for name in config.callback_queues:
            queue = self.state.queue(name)
            self._ackers[name] = AckBatcher(queue)
            task = asyncio.create_task(self._reserve_loop(queue), name=f"delayq-dispatch-{name}")
            self._reservers.append(task)
        log_event(
            _INFO,
            "dispatch.started",
            queues=",".join(config.callback_queues),
            concurrency=config.dispatch_concurrency,
            prefetch=self.prefetch,
            lease=self.lease,
            signed=config.signing_secret is not None,
        )

    async def stop(self) -> None:
        """Stop reserving; give the messages waiting for a place back at once, let
        requests in flight finish for ``grace`` seconds, then give the rest back (due
        again at once, the attempt not charged). Idempotent."""
        if self._client is None or self._stopped:
            return
        self._stopped = True
        log_event(_INFO, "dispatch.stopping", in_flight=len(self._running), grace=self.grace)
        for task in self._reservers:
            task.cancel()
        await asyncio.gather(*self._reservers, return_exceptions=True)
        assert self._gate is not None
        self._gate.close()  # the prefetched ones go back now
        pending = set(self._running)
        if pending and self.grace > 0:
            await asyncio.wait(pending, timeout=self.grace)
        left = [task for task in self._running if not task.done()]
        if left:
            self._releasing = True
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        for acker in self._ackers.values():
            await acker.drain()
        await self._client.aclose()
        log_event(_INFO, "dispatch.stopped", **dict(self.counts))

    # -- reserving ----------------------------------------------------------------------
    def _reserve_loop(self, queue: AsyncQueue) -> typing.Coroutine[typing.Any, typing.Any, None]:
        assert self._slots is not None
        assert self._outage is not None
        return reserve_loop(
            queue,
            self._slots,
            self._running,
            self._deliver,
            lease=self.lease,
            idle_wait=DISPATCH_IDLE_WAIT,
            outage=self._outage,
            hold_all_slots=len(self.config.callback_queues) == 1,
            event_prefix="dispatch",
        )

    # -- one message ----------------------------------------------------------------------
    async def _deliver(self, queue: AsyncQueue, msg: Message) -> None:
        text = msg.headers.get(CALLBACK_HEADER)
        try:
            if msg.headers_error is not None:
                raise ValueError(f"its headers cannot be read: {msg.headers_error}")
            if text is None:
                raise CallbackError("invalid_callback", "the message has no callback header")
            callback = Callback.from_header(text)
            check_host(callback.url, self.config)
            message_id = message_id_header(msg.id)
            queue_value = queue_header(msg.queue)
            if msg.payload_error is not None:
                raise ValueError(f"its payload cannot be read: {msg.payload_error}")
            body, content_type = _body_of(msg)
        except (CallbackError, TypeError, ValueError, RecursionError) as exc:
            await self._refuse(queue, msg, f"callback refused: {exc}", run_ids(msg, None))
            return
        gate = self._gate
        assert gate is not None
        every = self.lease / WORKER_EXTEND_DIVISOR  # as a Worker's: a failed extend is tried again
        renewer = LeaseRenewer(
            queue, msg, self.counts, lease=self.lease, first=every, every=every,
            event_prefix="callback",
        )  # fmt: skip
        try:
            if not await gate.enter():  # stopping before it was sent: give it back
                renewer.stop()
                await self._give_back(queue, msg)
                return
            try:
                with processing(msg, "callback") as run:
                    trace = run.log_ids()
                    outcome, error = await self._send(
                        queue, msg, callback, body, content_type,
                        names=(message_id, queue_value), trace=run.context,
                    )  # fmt: skip
                    if outcome != "delivered":
                        run.failed(outcome, error or outcome)
            finally:
                gate.leave()
        except asyncio.CancelledError:
            renewer.stop()
            if not self._releasing:
                raise
            await self._give_back(queue, msg)
            return
        finally:
            renewer.stop()
        if outcome == "refused":
            await self._refuse(queue, msg, error or "callback refused", trace)
        elif outcome == "delivered":
            await self._ack(queue, msg, callback, trace)
        else:
            await self._retry(queue, msg, outcome, error or outcome, trace)

    async def _send(
        self,
        queue: AsyncQueue,
        msg: Message,
        callback: Callback,
        body: bytes,
        content_type: str,
        *,
        names: tuple[str, str],
        trace: dict[str, str],
    ) -> tuple[str, str | None]:
        """One request: ``(outcome, error)`` with an outcome of CALLBACK_OUTCOMES."""
        assert self._client is not None
        timeout = min(callback.timeout, self.config.callback_timeout)
        if callback.method in BODILESS_METHODS:
            body = b""  # a put refuses a payload; one stored before that is dropped
        try:
            request = self._build(
                msg, callback, body, content_type, timeout, names=names, trace=trace
            )
        except (httpx.InvalidURL, ValueError) as exc:  # a header value httpx cannot send
            return "refused", f"callback refused: the request cannot be made: {exc}"
        shown = _shown_url(callback.url)
        sent_ms = time.time() * 1000.0
        self.state.metrics.observe_lateness(queue.name, msg.due_at, sent_ms)
        log_event(
            _DEBUG, "callback.sending", queue=queue.name, id=msg.id, attempt=msg.attempts,
            url=shown, late_ms=round(sent_ms - msg.due_at, 3),
        )  # fmt: skip
        try:
            status = await within(self._request(request), timeout)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return "timeout", f"timeout after {timeout:g}s calling {shown}"
        except CallbackRefused as exc:
            return "refused", f"callback refused: {exc}"
        except httpx.HTTPError as exc:
            detail = str(exc) or type(exc).__name__
            return "connection_error", f"connection error calling {shown}: {detail}"
        if 200 <= status < 300:
            return "delivered", None
        return "http_error", f"HTTP {status} from {shown}"

    def _build(
        self,
        msg: Message,
        callback: Callback,
        body: bytes,
        content_type: str,
        timeout: float,
        *,
        names: tuple[str, str],
        trace: dict[str, str],
    ) -> httpx.Request:
        """The request of ``callback`` for ``msg``, signed (v1, v2 and v3) when the
        server has a secret: v2 signs the method, URL and ``X-Delayq-Message-Id`` as
        they are sent, v3 those and ``X-Delayq-Queue``, ``X-Delayq-Attempt`` and
        ``Content-Type`` too. ``names`` are the values of the first two headers
        (:func:`message_id_header` of the id, :func:`queue_header` of the queue)."""
        assert self._client is not None
        message_id, queue_value = names
        headers = httpx.Headers(
            {
                "X-Delayq-Message-Id": message_id,
                "X-Delayq-Queue": queue_value,
                "X-Delayq-Attempt": str(msg.attempts),
            }
        )
        if body or callback.method not in BODILESS_METHODS:
            headers["Content-Type"] = content_type
        headers.update(trace)  # the run's trace context (the callback's headers win)
        for name, value in callback.headers.items():
            headers[name] = value
        request = self._client.build_request(
            callback.method, callback.url, headers=headers, content=body, timeout=timeout
        )
        secret = self.config.signing_secret
        if secret:
            sent = request.headers
            request.headers[CALLBACK_SIGNATURE_HEADER] = sign(
                secret,
                int(time.time()),
                body,
                method=request.method,
                url=_sent_url(request.url),
                message_id=message_id,
                queue=sent["X-Delayq-Queue"],
                attempt=sent["X-Delayq-Attempt"],
                # as a receiver's parser reads it: without spaces at either end
                content_type=sent.get("Content-Type", "").strip(" \t"),
            )
        return request

    async def _request(self, request: httpx.Request) -> int:
        """Send and read (a bounded part of) the answer, so the connection is reused."""
        assert self._client is not None
        response = await self._client.send(request, stream=True)
        try:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read > CALLBACK_MAX_RESPONSE_READ:
                    break  # the rest is dropped with the connection
            return response.status_code
        finally:
            await response.aclose()

    # -- settling -------------------------------------------------------------------------
    async def _ack(
        self, queue: AsyncQueue, msg: Message, callback: Callback, trace: dict[str, str]
    ) -> None:
        metrics = self.state.metrics
        metrics.observe_callback(queue.name, "delivered")
        try:
            acked = await self._ackers[queue.name].ack(msg)
        except Exception as exc:  # the backend did not answer, or the queue closed
            log_event(_WARNING, "callback.unsettled", queue=queue.name, id=msg.id,
                      error=repr(exc), **trace)  # fmt: skip
            return
        if not acked:
            self.counts["lease_lost"] += 1
            log_event(_WARNING, "callback.unsettled", queue=queue.name, id=msg.id,
                      error="LeaseLost", **trace)  # fmt: skip
            return
        metrics.acks.labels(queue.name).inc()
        self.counts["delivered"] += 1
        log_event(
            _INFO, "callback.delivered", queue=queue.name, id=msg.id, attempt=msg.attempts,
            url=_shown_url(callback.url), **trace,
        )  # fmt: skip

    async def _retry(
        self, queue: AsyncQueue, msg: Message, outcome: str, error: str, trace: dict[str, str]
    ) -> None:
        metrics = self.state.metrics
        metrics.observe_callback(queue.name, outcome)
        try:
            state = await queue.nack(msg, error=error)
        except (LeaseLost, QueueClosed) as exc:
            self.counts["lease_lost"] += 1
            log_event(_WARNING, "callback.unsettled", queue=queue.name, id=msg.id,
                      error=repr(exc), **trace)  # fmt: skip
            return
        metrics.nacks.labels(queue.name).inc()
        dead = state is State.DEAD
        if dead:
            metrics.dead.labels(queue.name).inc()
        self.counts["dead" if dead else "retried"] += 1
        log_event(
            _ERROR if dead else _WARNING, f"callback.{outcome}", queue=queue.name, id=msg.id,
            attempt=msg.attempts, max_attempts=msg.max_attempts, state=state.value, error=error,
            **trace,
        )  # fmt: skip

    async def _refuse(
        self, queue: AsyncQueue, msg: Message, error: str, trace: dict[str, str]
    ) -> None:
        metrics = self.state.metrics
        metrics.observe_callback(queue.name, "refused")
        try:
            await queue.nack(msg, error=error, dead=True)
        except (LeaseLost, QueueClosed) as exc:
            self.counts["lease_lost"] += 1
            log_event(_WARNING, "callback.unsettled", queue=queue.name, id=msg.id,
                      error=repr(exc), **trace)  # fmt: skip
            return
        metrics.nacks.labels(queue.name).inc()
        metrics.dead.labels(queue.name).inc()
        self.counts["dead"] += 1
        log_event(_ERROR, "callback.refused", queue=queue.name, id=msg.id, error=error, **trace)

    async def _give_back(self, queue: AsyncQueue, msg: Message) -> None:
        try:
            await queue.release(msg)
        except (LeaseLost, QueueClosed) as exc:
            log_event(_WARNING, "callback.release_failed", queue=queue.name, id=msg.id,
                      error=repr(exc))  # fmt: skip
            return
        self.counts["released"] += 1
        log_event(_INFO, "callback.released", queue=queue.name, id=msg.id, attempt=msg.attempts)

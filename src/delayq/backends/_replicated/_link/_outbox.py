"""The outbox: requests of concurrent callers, made in the same turn of the loop or
while a publish is on its way, leave together as one ``batch`` message, whose parts
the scheduler takes one by one (each keeps its id, and gets its own outcome); their
replies come back the same way."""

from __future__ import annotations

import asyncio

from .._transport import Transport
from ._core import take_group
from ._state import LinkState, Outgoing

__all__ = ["Outbox"]


class Outbox(LinkState):
    """Coalescing requests into one publish."""

    async def _request(
        self, transport: Transport, op: str, request_id: str, body: bytes, ttl: int | None
    ) -> None:
        """Publish a request through the outbox, in call order: a task of the link
        (:meth:`_drain`) publishes what gathered there, so the requests of callers that
        run in the same turn of the loop, or come while a publish is on its way, leave
        as one message (16 producers on one link cost the broker one message a round,
        not 16). Returns once it is sent; an error when it was not."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append(Outgoing(transport, op, request_id, body, ttl, sent))
        if not self._publishing:
            self._publishing = True
            self._spawn(self._drain())
        await sent

    async def _drain(self) -> None:
        """Publish what waits in the outbox until it is empty: one message per run of
        requests for the same connection and time to live (a ``batch`` of them when
        there are several, up to MAX_GROUP_BYTES; a larger request goes alone)."""
        try:
            while self._outbox:
                batch = self._take_outbox()
                if not batch:
                    continue
                first = batch[0]
                op, request_id, body = self._core.message(
                    [(item.op, item.request_id, item.body) for item in batch], self._pending
                )
                try:
                    await first.transport.request(op, request_id, body, first.ttl)
                except BaseException as exc:
                    failure = exc if isinstance(exc, Exception) else None
                    for item in batch:
                        if not item.sent.done():
                            item.sent.set_exception(
                                failure or ConnectionError("the request was not sent")
                            )
                    if failure is None:
                        raise  # this link is being closed
                    continue
                for item in batch:
                    if not item.sent.done():
                        item.sent.set_result(None)
        finally:
            self._publishing = False
            self._fail_outbox()

    def _take_outbox(self) -> list[Outgoing]:
        """The outbox's first requests that leave together, for one connection and time
        to live (those whose caller gave up before they left are dropped: a cancelled
        publish need not go)."""
        return take_group(
            self._outbox,
            lambda item: len(item.body),
            gone=lambda item: item.sent.done(),
            joins=lambda first, item: item.transport is first.transport and item.ttl == first.ttl,
        )

    def _fail_outbox(self) -> None:
        """Fail what is left in the outbox once nothing drains it (a close): each caller
        sees an outage, and resends or gives up as for any failed publish."""
        outbox, self._outbox = self._outbox, []
        for item in outbox:
            if not item.sent.done():
                item.sent.set_exception(ConnectionError("the request was not sent"))

"""A claim is never lost: the hand-written pair behind the faces' ``reserve``.

A sync call cannot be cut off halfway, so :class:`Claims` has nothing to guard: it
hands back the claim the face has run. An asyncio task can be cancelled while its claim
is on the wire; :class:`AsyncClaims` runs the claim in a task of its own, and when the
caller is cancelled, gives back (``give_back``) what the claim took once its reply is in
(:mod:`.._guard`, which ``postgresql://`` shares).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ...durable.message import Record
from .._guard import AsyncGuard
from ._scripts import Claim

__all__ = ["AsyncClaims", "Claims"]


class Claims:
    """The sync face's claims: run whole, nothing to give back."""

    def __init__(self, give_back: Callable[[str, list[Record]], None]) -> None:
        self._give_back = give_back

    def claim(self, claimed: Claim, queue: str) -> Claim:
        """``claimed``, the claim the face has run on ``queue``."""
        return claimed

    def claim_all(self, claimed: list[Record], queue: str, stop: list[bool]) -> list[Record]:
        """``claimed``, the claims of several shards the face has run on ``queue``."""
        return claimed

    def settle(self) -> None:
        """Nothing is ever in flight here."""


class AsyncClaims:
    """The asyncio face's claims: one cancelled on the wire is given back, through the
    guard ``postgresql://`` shares (:class:`~.._guard.AsyncGuard`)."""

    def __init__(self, give_back: Callable[[str, list[Record]], Awaitable[None]]) -> None:
        self._give_back = give_back
        self._guard = AsyncGuard()

    async def claim(self, claiming: Awaitable[Claim], queue: str) -> Claim:
        """Await ``claiming`` (a claim on ``queue``); if the caller is cancelled
        meanwhile, what it claimed is given back once its reply is in."""
        return await self._guard.run(
            lambda: claiming, lambda claim: self._giving(queue, claim.records)
        )

    async def claim_all(
        self, claiming: Awaitable[list[Record]], queue: str, stop: list[bool]
    ) -> list[Record]:
        """Await ``claiming``, claims of several shards one after the other (each made
        with :meth:`claim`); if the caller is cancelled meanwhile, ``stop[0]`` is set,
        so that no further claim is sent, and what the earlier ones took is given back
        once the last reply is in."""
        try:
            return await self._guard.run(
                lambda: claiming, lambda records: self._giving(queue, records)
            )
        except asyncio.CancelledError:
            stop[0] = True  # before the claims' task runs again: nothing is sent
            raise

    async def _giving(self, queue: str, records: list[Record]) -> None:
        if records:
            await self._give_back(queue, records)

    async def settle(self) -> None:
        """Wait for the cancelled claims still on the wire, then their give-backs (a
        close that came first would leave what they took leased until it expired)."""
        await self._guard.settle()

"""A listener whose peer answers with bytes that are no Redis reply (another service
now at the address, as after a failover or a network change) connects again, as for a
lost connection, instead of ending: its waiting consumers would otherwise sleep on
with nobody to wake them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import redis

from delayq.backends.redis._listen import AsyncListener, Listener

KEY = b"delayq-test:{garbage:0}:wake"


class _Peer:
    """What a listener's connection meets: garbage once, then the wake-up marker."""

    def __init__(self) -> None:
        self.calls = 0

    def answer(self, keys: Sequence[bytes]) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise redis.exceptions.InvalidResponse('Protocol error, got "H" as reply type byte')
        return [keys[0], b"1"]


class _Client:
    def __init__(self, peer: _Peer) -> None:
        self.peer = peer

    def blpop(self, keys: Sequence[bytes], timeout: float) -> Any:
        return self.peer.answer(keys)

    def close(self) -> None:
        pass


class _AsyncClient(_Client):
    async def blpop(self, keys: Sequence[bytes], timeout: float) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.peer.answer(keys)

    async def aclose(self) -> None:
        pass


def test_a_thread_listener_survives_garbage_and_wakes_its_waiters() -> None:
    peer = _Peer()
    listener = Listener(lambda: _Client(peer), KEY, rewake=lambda: None)
    woken = threading.Event()

    def wait() -> None:
        with listener.session():
            generation = listener.generation
            while listener.generation == generation or peer.calls < 2:
                listener.wait(listener.generation, 5)
            woken.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        assert woken.wait(10), "the listener ended at the garbage"
        assert peer.calls >= 2
    finally:
        listener.close()
        thread.join(10)


def test_an_asyncio_listener_survives_garbage_and_wakes_its_waiters() -> None:
    peer = _Peer()

    async def rewake() -> None:
        pass

    async def main() -> None:
        listener = AsyncListener(lambda: _AsyncClient(peer), KEY, rewake)
        try:
            with listener.session():
                while peer.calls < 2:
                    await asyncio.wait_for(listener.wait(listener.generation, 5), 10)
        finally:
            await listener.close()

    asyncio.run(main())
    assert peer.calls >= 2

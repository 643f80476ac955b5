"""The client side: a request to the elected scheduler and the wait for its reply, with
the resends that make a failover invisible to the caller. :class:`LoopLink` runs on
the caller's event loop (the asyncio face); :class:`ThreadLink` (the sync face) sends
a call, a reserve and the one sent with the acks too, from its caller's thread
(``_direct``), and drives a LoopLink on a private loop thread for the candidacy and
the scheduler alone. Both have the same methods, so the two faces of the
backend read the same (the sync one is generated). One module a concern, composed by
:class:`LoopLink`: the decisions without I/O that every driver shares (``_core``),
the state and the seams (``_state``), the connection and the election
(``_election``), calls and replies (``_calls``), the outbox (``_outbox``), a reserve
sent with the acks (``_ahead``; the sync face's in ``_direct``), fast puts
(``_fast_put``).
"""

from ._loop_link import LoopLink
from ._state import Candidacy
from ._thread_link import ThreadLink

__all__ = ["Candidacy", "LoopLink", "ThreadLink"]

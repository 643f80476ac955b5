"""The elected scheduler: the namespace's whole state in memory, rebuilt from the log,
deciding every request with the pure transitions and appending what each one changed
before it replies (docs/rabbitmq.md). One module a concern, composed by
:class:`~._elected.Scheduler`: the state and the seams between the concerns
(``_state``, ``_journal``), election and replay (``_reign``), requests
(``_requests``), the intake's fold (``_intake``), group commit and replies
(``_group_commit``), checkpoints (``_checkpoints``), the dedup table's bound by age
(``_dedup``), waiting reserves and timers
(``_waiting``), delivery to a user's exchange (``_delivery``).
"""

from ._elected import Scheduler

__all__ = ["Scheduler"]

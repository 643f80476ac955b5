"""The scheduler whole: each concern's module adds its part to the shared state."""

from __future__ import annotations

from ._checkpoints import Checkpoints
from ._dedup import Dedup
from ._delivery import Delivering
from ._group_commit import GroupCommit
from ._intake import Intake
from ._reign import Reign
from ._requests import Requests
from ._waiting import Waiting

__all__ = ["Scheduler"]


class Scheduler(Reign, Requests, Intake, GroupCommit, Checkpoints, Dedup, Waiting, Delivering):
    """Elected once :meth:`run` is called: replays the log, then serves requests until
    :meth:`stop` (or an append fails: it then stops and calls ``on_stopped``)."""

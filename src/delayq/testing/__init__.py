"""Testing an app of delayq without sleeping and without a server.

A :class:`Harness` runs an :class:`~delayq.App` as its module declares it, on a
``memory://`` namespace of its own and a :class:`~delayq.FakeClock`, and drives a real
:class:`~delayq.Worker` step by step: :meth:`Harness.run_due` runs what is due now,
:meth:`Harness.advance` moves the clock and runs each message at its due time on the
way (retries with their backoff, ``@app.every`` and ``@app.cron`` ticks included).
What ran, what waits and what is dead can then be asserted::

    from delayq.testing import Harness
    from shop import app, place_order

    def test_unpaid_order_is_cancelled():
        with Harness(app) as harness:
            place_order(42)
            harness.advance("30m")
            assert [run.args for run in harness.runs] == [(42,)]

pytest fixtures (``delayq_clock``, ``delayq_harness``) come with it for a project that
opts in with ``pytest_plugins = ["delayq.testing"]`` in its ``conftest.py``; pytest is
not needed for the rest.
"""

from importlib.util import find_spec

from ..runtime import JobRun
from ._harness import Harness

if find_spec("pytest") is not None:  # the fixtures, for pytest_plugins = ["delayq.testing"]
    from ._plugin import delayq_clock, delayq_harness  # noqa: F401

__all__ = ["Harness", "JobRun"]

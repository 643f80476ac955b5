"""The suite's order: the longest files first.

`make test` runs the files in pytest-xdist processes (``--dist loadfile``), each file
whole in one of them, handed out in the order they were collected
(``--no-loadscope-reorder``: xdist would otherwise hand out the files with the most
tests first, whatever their time, and the two-minute soak, one test, came last). A long
file that comes last runs alone at the end while the other processes idle, so the files
that take longest (each is half a minute or more of mostly waiting: real servers, real
processes, real time) are put first and the many short ones fill in around them. The
order of the tests inside a file is unchanged; only the files move.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, settings

# No property test asserts a time: hypothesis' own deadline (200 ms an example) and its
# slow-generation check can only fail a run on a loaded machine (a fast constructor's
# equality test failed once beside two other suites, and passed on every rerun), so
# both are off for the whole suite.
settings.register_profile("delayq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("delayq")

#: Files by their share of the suite's time, longest first (`make test` prints the
#: slowest tests; a file's time is the sum of its tests'; `PYTEST_ARGS=--durations=0`
#: prints them all).
LONGEST_FIRST = (
    "conformance/test_model.py",
    "conformance/test_concurrency.py",
    "backends/test_amqp_sync_path.py",
    "e2e/test_soak.py",
    "faults/test_kafka_network.py",
    "conformance/test_bad_input.py",
    "conformance/test_inspect.py",
    "conformance/test_bounds.py",
    "conformance/test_send_many_envelope.py",
    "conformance/test_leases.py",
    "conformance/test_payload.py",
    "conformance/test_ack_many.py",
    "faults/test_amqp_network.py",
    "conformance/test_ordering.py",
    "conformance/test_never_early.py",
    "e2e/test_docs.py",
    "backends/test_amqp_fastput.py",
    "conformance/test_retry.py",
    "conformance/test_cancel_reschedule.py",
    "conformance/test_put_outcome.py",
    "e2e/test_worker_processes.py",
    "backends/test_amqp_faults.py",
    "backends/test_kafka.py",
    "conformance/test_put.py",
    "backends/test_amqp_checkpoint.py",
    "conformance/test_put_many_batch.py",
    "backends/test_redis_cluster.py",
    "server/test_dispatch_prefetch.py",
    "cli/test_server_refused.py",
    "cli/test_output.py",
    "backends/test_postgres_faults.py",
    "backends/test_amqp.py",
    "server/test_bounds.py",
    "e2e/test_readme.py",
    "faults/test_postgres_network.py",
    "faults/test_kafka_restart.py",
    "cli/test_scheduler_command.py",
    "cli/test_secrets.py",
    "conformance/test_fire_ahead.py",
    "backends/test_amqp_thread_put.py",
    "server/test_outage.py",
    "worker/test_worker.py",
    "server/test_budget.py",
    "contract/test_contract.py",
    "e2e/test_worker_supervisor.py",
    "durable/test_records_stats.py",
    "backends/test_amqp_purge.py",
    "server/test_guard_every_route.py",
    "backends/test_amqp_consumer_timeout.py",
)


#: The files with a test run on kafka (a parameter ``"kafka"``), read at the first
#: teardown from the session's tests.
KAFKA_FILES: set[str] = set()


def _kafka_files(items: list[pytest.Item]) -> set[str]:
    found = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "kafka" in callspec.params.values():
            found.add(str(item.path))
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = item.path.as_posix()
        for name, i in rank.items():
            if path.endswith("/tests/" + name):
                return i
        return len(rank)

    items.sort(key=key)  # stable: the rest keep their order


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Close the kafka namespace of tests/conformance/conftest.py (its scheduler held
    open, an election costs seconds on Tansu) after a file's last test, unless the
    next file has kafka tests too: consecutive files with kafka tests share it, until
    it is worn (a fresh one then, see ``renew_worn_kafka_namespace``). Last, once the
    test's fixtures (which purge its queues through that scheduler) are torn down."""
    if not KAFKA_FILES:
        KAFKA_FILES.update(_kafka_files(item.session.items) or {""})
    conformance = sys.modules.get("conformance.conftest")
    if conformance is None:
        return
    if nextitem is not None and (nextitem.path == item.path or str(nextitem.path) in KAFKA_FILES):
        if _kafka_files([item]):  # this test ran on kafka: did it wear the namespace out?
            conformance.renew_worn_kafka_namespace()
        return
    conformance.close_kafka_namespace()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the Redis Cluster and the Tansu broker the session started, if any, and
    drop the PostgreSQL schemas kept for reuse (an xdist worker may exit without running
    ``atexit``)."""
    cluster = sys.modules.get("backends._redis_cluster")
    if cluster is not None:
        cluster.stop_shared()
    conformance = sys.modules.get("conformance.conftest")
    if conformance is not None:
        conformance.drop_spare()
        conformance.close_kafka_namespace(broker=True)

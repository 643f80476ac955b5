"""``delayq bench``: jobs/s of a no-op task through the Worker, JSON or a table."""

from __future__ import annotations

import json

import pytest

from delayq.durable import Queue

from ._helpers import Cli, one_error_line


def test_bench_json_every_job_succeeds_and_queues_are_purged(cli: Cli) -> None:
    result = cli("bench", "--jobs", "200", "--concurrency", "1,4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["url"] == cli.url
    assert data["jobs"] == 200
    runs = data["runs"]
    assert [run["concurrency"] for run in runs] == [1, 4]
    for run in runs:
        assert run["url"] == cli.url
        assert run["jobs"] == run["succeeded"] == 200
        assert run["failed"] == 0
        assert run["seconds"] > 0
        assert run["jobs_per_second"] > 0
        with Queue(cli.url, name=run["queue"]) as queue:
            assert queue.stats().total == 0
    assert len({run["queue"] for run in runs}) == 2


def test_bench_table(cli: Cli) -> None:
    result = cli("bench", "--jobs", "20", "--concurrency", "2")
    assert result.exit_code == 0, result.output
    for column in ("url", "concurrency", "jobs", "seconds", "jobs/s"):
        assert column in result.stdout
    assert cli.url in result.stdout


@pytest.mark.parametrize("value", ["0", "1,x", "", "1,,32", "-4"])
def test_bad_concurrency_is_one_line_exit_2(cli: Cli, value: str) -> None:
    result = cli("bench", "--jobs", "10", "--concurrency", value)
    assert result.exit_code == 2
    assert "--concurrency" in one_error_line(result)


def test_unreachable_redis_is_one_line_exit_1() -> None:
    result = Cli("redis://127.0.0.1:1/0")("bench", "--jobs", "10")
    assert result.exit_code == 1
    assert "cannot use the queue" in one_error_line(result)

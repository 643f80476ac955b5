"""put, get, cancel, reschedule, stats, dead and purge through CliRunner on SQLite and
RabbitMQ."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conformance.conftest import amqp_url
from delayq import Queue, State
from delayq.cli import _queue as cli_queue

from ._helpers import Cli


@pytest.fixture(params=["sqlite", "amqp"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The commands on a SQLite file and on a RabbitMQ namespace (each command a
    candidate for the namespace's scheduler, as the test's own queue is)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'q.db'}"
    else:
        yield from amqp_url(tmp_path)


@pytest.fixture
def queue(url: str) -> Iterator[Queue]:
    with Queue(url, name="jobs") as q:
        yield q


def now_ms() -> int:
    return int(time.time() * 1000)


def make_dead(queue: Queue, id: str, error: str = "boom") -> None:
    queue.put({"n": id}, id=id, max_attempts=1)
    [msg] = queue.reserve(wait=0)
    assert queue.nack(msg, error=error) is State.DEAD


# -- put -------------------------------------------------------------------------------


def test_put_prints_only_the_id_and_stores_every_option(cli: Cli, queue: Queue) -> None:
    before = now_ms()
    result = cli(
        "put", "jobs", '{"order": 42}', "--delay", "30m", "--id", "o-42",
        "--max-attempts", "3", "--header", "trace=abc", "--header", "kind=x=y",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "o-42\n"
    msg = queue.get("o-42")
    assert msg is not None
    assert msg.payload == {"order": 42}
    assert msg.max_attempts == 3
    assert dict(msg.headers) == {"trace": "abc", "kind": "x=y"}
    assert before + 1_800_000 <= msg.due_at <= now_ms() + 1_800_001  # rounded up


def test_put_without_id_prints_a_new_random_id(cli: Cli, queue: Queue) -> None:
    first, second = cli("put", "jobs", "[1, 2]"), cli("put", "jobs", '"text"')
    ids = [first.stdout.strip(), second.stdout.strip()]
    assert len(set(ids)) == 2
    assert all(len(i) == 32 for i in ids)
    assert queue.get(ids[0]).payload == [1, 2]  # type: ignore[union-attr]
    assert queue.get(ids[1]).payload == "text"  # type: ignore[union-attr]


def test_put_reads_the_payload_from_stdin(cli: Cli, queue: Queue) -> None:
    result = cli("put", "jobs", "-", "--id", "s", input='{"from": "stdin"}\n')
    assert result.exit_code == 0, result.output
    assert queue.get("s").payload == {"from": "stdin"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        ("2031-02-03T04:05:06.789Z", datetime(2031, 2, 3, 4, 5, 6, 789000, timezone.utc)),
        ("2031-02-03T05:05:06+01:00", datetime(2031, 2, 3, 4, 5, 6, tzinfo=timezone.utc)),
    ],
)
def test_put_at_an_aware_iso_time(cli: Cli, queue: Queue, at: str, expected: datetime) -> None:
    assert cli("put", "jobs", "1", "--at", at, "--id", "a").exit_code == 0
    assert queue.get("a").due_at == int(expected.timestamp() * 1000)  # type: ignore[union-attr]


def test_put_on_conflict(cli: Cli, queue: Queue) -> None:
    created = cli("put", "jobs", "1", "--id", "x", "--delay", "1h")
    assert (created.exit_code, created.stdout, created.stderr) == (0, "x\n", "")
    due = queue.get("x").due_at  # type: ignore[union-attr]
    ignored = cli("put", "jobs", "2", "--id", "x")
    assert (ignored.exit_code, ignored.stdout) == (0, "x\n")
    assert ignored.stderr == (
        "message 'x' already exists in queue 'jobs': the existing message was kept and "
        "not changed (--on-conflict replace overwrites it)\n"
    )
    kept = queue.get("x")
    assert kept is not None
    assert (kept.payload, kept.due_at) == (1, due)
    assert cli("put", "jobs", "2", "--id", "x", "--on-conflict", "ignore").stderr == (
        ignored.stderr
    )
    replaced = cli("put", "jobs", "3", "--id", "x", "--on-conflict", "replace")
    assert (replaced.exit_code, replaced.stdout, replaced.stderr) == (0, "x\n", "")
    assert queue.get("x").payload == 3  # type: ignore[union-attr]
    refused = cli("put", "jobs", "4", "--id", "x", "--on-conflict", "error")
    assert refused.exit_code == 1
    assert "duplicate" in refused.stderr
    assert queue.get("x").payload == 3  # type: ignore[union-attr]


def test_put_uses_delayq_url_by_default(
    cli: Cli, url: str, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYQ_URL", url)
    result = cli("put", "jobs", "1", "--id", "env", url=False)
    assert result.exit_code == 0, result.output
    assert queue.get("env") is not None


# -- get ---------------------------------------------------------------------------------


def test_get_shows_a_panel(cli: Cli, queue: Queue) -> None:
    queue.put({"order": 7}, id="o-7", delay="1h", headers={"trace": "t1"})
    result = cli("get", "jobs", "o-7")
    assert result.exit_code == 0, result.output
    for text in ("o-7", "scheduled", "0 of 5", "trace", "t1", '"order": 7'):
        assert text in result.stdout, result.stdout
    assert "in 59m" in result.stdout or "in 1h" in result.stdout  # 1h less the time spent


def test_get_json(cli: Cli, queue: Queue) -> None:
    make_dead(queue, "d")
    result = cli("get", "jobs", "d", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["id"] == "d"
    assert data["state"] == "dead"
    assert data["payload"] == {"n": "d"}
    assert data["attempts"] == data["max_attempts"] == 1
    assert data["last_error"] == "boom"
    assert datetime.fromisoformat(data["due_at_iso"]).timestamp() == data["due_at"] / 1000


def test_get_json_of_a_bytes_payload(cli: Cli, queue: Queue) -> None:
    queue.put(b"\x00\xff", id="b")
    data = json.loads(cli("get", "jobs", "b", "--json").stdout)
    assert data["payload_base64"] == "AP8="
    assert "payload" not in data


# -- reschedule, cancel --------------------------------------------------------------------


def test_reschedule_by_delay_and_at(cli: Cli, queue: Queue) -> None:
    queue.put(1, id="r")
    result = cli("reschedule", "jobs", "r", "--delay", "1h")
    assert result.exit_code == 0, result.output
    assert "in 59m" in result.stdout or "in 1h" in result.stdout
    assert queue.get("r").due_at >= now_ms() + 3_590_000  # type: ignore[union-attr]
    at = "2032-01-01T00:00:00+00:00"
    assert cli("reschedule", "jobs", "r", "--at", at).exit_code == 0
    expected = int(datetime.fromisoformat(at).timestamp() * 1000)
    assert queue.get("r").due_at == expected  # type: ignore[union-attr]


def test_reschedule_explains_a_refusal(cli: Cli, queue: Queue) -> None:
    make_dead(queue, "d")
    dead = cli("reschedule", "jobs", "d", "--delay", "1s")
    assert dead.exit_code == 1
    assert "is dead" in dead.stderr
    assert "delayq dead jobs --retry d" in dead.stderr
    queue.put(1, id="held")
    assert queue.reserve(wait=0, lease=60)
    held = cli("reschedule", "jobs", "held", "--delay", "1s")
    assert held.exit_code == 1
    assert "in flight" in held.stderr


def test_cancel(cli: Cli, queue: Queue) -> None:
    queue.put(1, id="c", delay="1h")
    result = cli("cancel", "jobs", "c")
    assert result.exit_code == 0, result.output
    assert "cancelled" in result.stdout
    assert queue.get("c") is None
    again = cli("cancel", "jobs", "c")
    assert again.exit_code == 1
    assert "no message 'c' in queue 'jobs'" in again.stderr


# -- stats -------------------------------------------------------------------------------


def fill(queue: Queue) -> None:
    make_dead(queue, "d1")
    queue.put(3, id="a1")
    assert [m.id for m in queue.reserve(wait=0, lease=60)] == ["a1"]
    queue.put(1, id="s1", delay="1h")
    queue.put(2, id="r1", delay="10ms")
    time.sleep(0.3)  # r1 is ready, about 0.3 s overdue


def test_stats_table(cli: Cli, queue: Queue) -> None:
    fill(queue)
    result = cli("stats", "jobs", "default")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line}
    assert rows["jobs"][1:5] == ["1", "1", "1", "1"]  # scheduled, ready, active, dead
    assert rows["jobs"][6] == "ago"  # next due: "290ms ago", then its ISO time below
    assert rows["default"][1:5] == ["0", "0", "0", "0"]
    assert "cannot list" not in result.stdout


def test_stats_json(cli: Cli, queue: Queue) -> None:
    fill(queue)
    result = cli("stats", "jobs", "--json")
    assert result.exit_code == 0, result.output
    [data] = json.loads(result.stdout)
    assert data["queue"] == "jobs"
    assert (data["scheduled"], data["ready"], data["active"], data["dead"]) == (1, 1, 1, 1)
    assert 0.25 <= data["lag"] <= 30
    assert data["next_due_at"] <= now_ms() - 250
    assert data["next_due_iso"]


def test_stats_without_queue_lists_every_queue_with_messages(cli: Cli, queue: Queue) -> None:
    fill(queue)
    with queue.named("other") as other:
        other.put("x")
        result = cli("stats", "--json")
        assert result.exit_code == 0, result.output
        assert [row["queue"] for row in json.loads(result.stdout)] == ["jobs", "other"]
        other.purge()


def test_stats_without_queue_on_an_empty_store_shows_default(cli: Cli, queue: Queue) -> None:
    result = cli("stats")
    assert result.exit_code == 0, result.output
    assert "default" in result.stdout
    assert "cannot list" not in result.stdout


def test_stats_lists_the_queues_the_backend_holds(cli: Cli, queue: Queue) -> None:
    """The listing is the store's: a queue holding only a scheduled message is listed
    with its counts, one purged empty is not."""
    fill(queue)
    later, gone = queue.named("zz"), queue.named("gone")
    later.put("later", delay=3600)
    gone.put("x")
    gone.purge()
    result = cli("stats", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["queue"]: row for row in json.loads(result.stdout)}
    assert list(rows) == ["jobs", "zz"]
    assert (rows["zz"]["scheduled"], rows["zz"]["ready"], rows["zz"]["dead"]) == (1, 0, 0)
    later.purge()


def stop_after(monkeypatch: pytest.MonkeyPatch, pauses: int) -> list[float]:
    """Make ``stats --watch`` refresh ``pauses`` times, then see Ctrl-C."""
    seen: list[float] = []

    def pause(seconds: float) -> None:
        seen.append(seconds)
        if len(seen) > pauses:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_queue, "_pause", pause)
    return seen


def test_stats_watch_refreshes_until_ctrl_c(
    cli: Cli, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(queue)
    seen = stop_after(monkeypatch, 2)
    result = cli("stats", "jobs", "--watch", "--interval", "250ms")
    assert result.exit_code == 0, result.output
    assert seen == [0.25, 0.25, 0.25]
    assert "jobs" in result.stdout


def test_stats_watch_json_prints_a_line_per_refresh(
    cli: Cli, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(queue)
    stop_after(monkeypatch, 2)
    result = cli("stats", "jobs", "--watch", "--json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert all(json.loads(line)[0]["dead"] == 1 for line in lines)


# -- dead -----------------------------------------------------------------------------------


def test_dead_lists_and_retries(cli: Cli, queue: Queue) -> None:
    for name in ("d1", "d2", "d3"):
        make_dead(queue, name, error=f"failed {name}")
    listed = cli("dead", "jobs")
    assert listed.exit_code == 0, listed.output
    for text in ("d1", "d2", "d3", "failed d2", "1/1", "3 shown of 3 dead"):
        assert text in listed.stdout
    limited = json.loads(cli("dead", "jobs", "--json", "--limit", "2").stdout)
    assert [m["id"] for m in limited] == ["d1", "d2"]

    one = cli("dead", "jobs", "--retry", "d2")
    assert one.exit_code == 0, one.output
    assert "1 dead message(s)" in one.stdout
    assert queue.get("d2").state is State.READY  # type: ignore[union-attr]
    assert queue.get("d2").attempts == 0  # type: ignore[union-attr]

    missing = cli("dead", "jobs", "--retry", "d1", "--retry", "nope")
    assert missing.exit_code == 1
    assert "1 of the 2 ids are not dead" in missing.stderr
    assert queue.get("d1").state is State.READY  # type: ignore[union-attr]

    rest = cli("dead", "jobs", "--retry", "all")
    assert rest.exit_code == 0
    assert queue.stats().dead == 0
    assert "no dead messages" in cli("dead", "jobs").stdout


def test_dead_retry_all_with_ids_is_a_usage_error(cli: Cli, queue: Queue) -> None:
    make_dead(queue, "d1")
    result = cli("dead", "jobs", "--retry", "all", "--retry", "d1")
    assert result.exit_code == 2
    assert queue.get("d1").state is State.DEAD  # type: ignore[union-attr]


# -- purge ------------------------------------------------------------------------------------


def test_purge_asks_first(cli: Cli, queue: Queue) -> None:
    fill(queue)
    declined = cli("purge", "jobs", input="n\n")
    assert declined.exit_code == 1
    assert "remove 4 message(s) of queue 'jobs'" in declined.stderr
    assert "nothing purged" in declined.stderr
    no_answer = cli("purge", "jobs", input="")
    assert no_answer.exit_code == 1
    assert queue.stats().total == 4
    accepted = cli("purge", "jobs", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "purged 4 message(s)" in accepted.stdout
    assert queue.stats().total == 0
    assert "nothing to purge" in cli("purge", "jobs").stdout


@pytest.mark.parametrize(
    ("state", "left"),
    [("scheduled", ["a1", "d1", "r1"]), ("ready", ["a1", "d1", "s1"]),
     ("active", ["d1", "r1", "s1"]), ("dead", ["a1", "r1", "s1"])],
)  # fmt: skip
def test_purge_one_state_with_yes(cli: Cli, queue: Queue, state: str, left: list[str]) -> None:
    fill(queue)
    result = cli("purge", "jobs", "--state", state, "--yes")
    assert result.exit_code == 0, result.output
    assert "purged 1 message(s)" in result.stdout
    assert sorted(i for i in ("s1", "r1", "a1", "d1") if queue.get(i) is not None) == left


# -- send --------------------------------------------------------------------------------


def test_send_puts_the_task_envelope_a_worker_runs(cli: Cli, url: str) -> None:
    result = cli(
        "send", "charge", "42", "eur", '"42"', "--kw", "retry=true", "--kw", "note=two words",
        "--delay", "1h", "--id", "c-42",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "c-42\n"
    with Queue(url, name="default") as q:
        msg = q.get("c-42")
    assert msg is not None
    assert msg.payload == {
        "task": "charge",
        "args": [42, "eur", "42"],
        "kwargs": {"retry": True, "note": "two words"},
    }
    assert msg.due_at > now_ms() + 3_500_000
    again = cli("send", "charge", "43", "--id", "c-42", "--queue", "default")
    assert (again.exit_code, again.stdout) == (0, "c-42\n")
    assert again.stderr == (
        "message 'c-42' already exists in queue 'default': the existing message was kept "
        "and not changed (it runs once)\n"
    )


def test_send_with_the_app_uses_its_queue_and_refuses_an_unknown_task(
    cli: Cli, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shop.py").write_text(
        "from delayq import App\n"
        f"app = App({url!r})\n"
        "@app.task(queue='orders', max_attempts=2)\n"
        "def expire(order: int) -> None:\n"
        "    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    result = cli("send", "expire", "7", "--app", "shop:app")
    assert result.exit_code == 0, result.output
    with Queue(url, name="orders") as q:
        [msg] = q.peek()
    assert msg.payload == {"task": "expire", "args": [7], "kwargs": {}}
    assert msg.max_attempts == 2
    unknown = cli("send", "expir", "--app", "shop:app")
    assert unknown.exit_code == 2
    assert "shop:app has no task 'expir'" in unknown.stderr
    bad = cli("send", "expire", "--kw", "no-equals")
    assert bad.exit_code == 2
    assert "NAME=VALUE" in bad.stderr


# -- ls ----------------------------------------------------------------------------------


def test_ls_lists_waiting_in_flight_and_dead_messages(cli: Cli, queue: Queue) -> None:
    make_dead(queue, "gone")
    queue.put({"n": 1}, id="later", delay=3600)
    queue.put({"n": 2}, id="now")
    queue.put({"n": 3}, id="held")
    [held] = queue.reserve(wait=0, lease=600)
    assert held.id == "now"
    waiting = cli("ls", "jobs", "--json")
    assert waiting.exit_code == 0, waiting.output
    assert [m["id"] for m in json.loads(waiting.stdout)] == ["held", "later"]
    active = json.loads(cli("ls", "jobs", "--state", "active", "--json").stdout)
    assert [m["id"] for m in active] == ["now"]
    assert active[0]["lease_expires_at"] > now_ms() + 500_000
    table = cli("ls", "jobs", "--state", "active")
    assert "now" in table.stdout
    assert "lease until" in table.stdout
    assert "1 shown of 1 active" in table.stdout
    dead = json.loads(cli("ls", "jobs", "--state", "dead", "--json").stdout)
    assert [m["id"] for m in dead] == ["gone"]
    ready = json.loads(cli("ls", "jobs", "--state", "ready", "--json").stdout)
    assert [m["id"] for m in ready] == ["held"]
    assert "no waiting messages in queue 'empty'" in cli("ls", "empty").stdout
    limited = json.loads(cli("ls", "jobs", "--limit", "1", "--json").stdout)
    assert [m["id"] for m in limited] == ["held"]

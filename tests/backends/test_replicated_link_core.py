"""The replicated backends' link core (``_replicated/_link/_core.py``): the decisions a
link makes without I/O, which every driver shares. Checked here: read-your-writes (a
request sent while a fast put of the link may not be folded waits behind it; the reply
marks it folded), the scheduler's announcements, what a late answer to a reserve gives
back, how waiting requests or puts leave together, and when a sequential consumer's
next reserve is sent with its acks. The suites of ``amqp://`` check the same through a
broker (tests/backends/test_amqp*.py)."""

from __future__ import annotations

from delayq.backends._replicated._codec import encode_outcome, pack, unpack
from delayq.backends._replicated._link._core import LinkCore, take_group
from delayq.durable.message import Record, State


def record(id: str, lease: str) -> Record:
    return Record(
        id=id,
        payload=b"{}",
        encoding="json",
        due_at=0,
        seq=1,
        attempts=1,
        max_attempts=3,
        state=State.ACTIVE,
        lease=lease,
        lease_until=60_000,
    )


def test_a_request_after_an_unfolded_fast_put_waits_behind_it_until_a_reply() -> None:
    core = LinkCore(fast_put=True)
    assert core.message([("stats", "r0", b"s")], {"r0"}) == ("stats", "r0", b"s")
    seq, _ = core.next_intake(False, 0.0)
    body = unpack(core.intake_body(seq, [["p1", "jobs", []]], 1_700_000_000.0))
    assert body[:2] == [core.client, 1]
    assert not core.unfolded  # not confirmed yet: nothing to wait for
    core.intake_confirmed(seq)
    assert core.unfolded
    op, request_id, batch = core.message([("get", "r1", b"g")], {"r1"})
    assert op == "batch"
    assert request_id != "r1"
    after, get = unpack(batch)
    assert after[:2] == ["after", ""]
    assert unpack(after[2]) == [core.client, 1]
    assert get == ["get", "r1", b"g"]
    core.replied("r1")  # its reply: the scheduler folded intake message 1
    assert not core.unfolded
    assert core.message([("get", "r2", b"g")], {"r2"}) == ("get", "r2", b"g")


def test_a_call_that_ended_without_a_reply_marks_nothing_folded() -> None:
    core = LinkCore(fast_put=True)
    core.intake_confirmed(core.next_intake(False, 0.0)[0])
    core.message([("get", "r1", b"g")], {"r1"})
    core.ended("r1")
    core.replied("r1")  # a late reply to a call given up proves nothing
    assert core.unfolded


def test_a_resent_request_keeps_the_first_barrier_it_was_sent_behind() -> None:
    core = LinkCore(fast_put=True)
    core.intake_confirmed(core.next_intake(False, 0.0)[0])
    core.message([("get", "r1", b"g")], {"r1"})  # behind 1
    core.intake_confirmed(core.next_intake(False, 0.0)[0])
    core.message([("get", "r1", b"g")], {"r1"})  # resent, now behind 2
    core.replied("r1")
    assert core.folded_seq == 1  # any send of it was answered: 1 at least
    assert core.unfolded


def test_announcements_turn_fast_puts_and_their_copies() -> None:
    core = LinkCore(fast_put=True)
    assert core.fast
    assert not core.announced("r1", "full", 0.0)  # a reply, not an announcement
    assert core.announced("", "full", 0.0)
    assert not core.fast  # the plain path until a put is taken
    core.put_taken()
    assert core.fast
    assert core.next_intake(True, 0.0)[1]  # due soon: copied to the scheduler
    assert core.announced("", "quiet", 10.0)
    assert not core.next_intake(True, 10.5)[1]  # no reserve waits: no copy
    assert core.announced("", "nudge", 11.0)
    assert core.next_intake(True, 11.0)[1]
    core.announced("", "quiet", 20.0)
    core.elected()
    assert core.next_intake(True, 20.0)[1]
    assert not LinkCore(fast_put=False).fast
    off = LinkCore(fast_put=False)
    off.announced("", "full", 0.0)
    off.put_taken()
    assert not off.fast


def test_a_late_answer_gives_back_only_what_no_caller_received() -> None:
    core = LinkCore(fast_put=False)
    a, b = record("a", "la"), record("b", "lb")
    got = core.answer("reserve", ["jobs", 1, 60_000], "r1", encode_outcome("reserve", [a]))
    assert [r.id for r in got] == ["a"]
    again = pack(encode_outcome("reserve", [a, b]))
    assert core.give_back("r1", "ok", again) == [["jobs", "b", "lb", True]]
    core.forget("r2", "other")
    assert core.give_back("r2", "ok", again) == [
        ["other", "a", "la", True],
        ["other", "b", "lb", True],
    ]
    assert core.give_back("r2", "ok", again) == []  # given back once
    assert core.give_back("r3", "ok", again) == []  # no reserve of this link
    assert core.give_back("r1", "error", pack(["x"])) == []


def test_a_second_answer_before_the_call_took_the_first_gives_back_the_rest() -> None:
    core = LinkCore(fast_put=False)
    a, b = record("a", "la"), record("b", "lb")
    core.reserves["r1"] = "jobs"  # in flight
    first = ("ok", pack(encode_outcome("reserve", [a])))
    again = pack(encode_outcome("reserve", [a, b]))
    assert core.answered_again("r1", first, "ok", again) == [["jobs", "b", "lb", True]]
    both = [["jobs", "a", "la", True], ["jobs", "b", "lb", True]]
    assert core.answered_again("r1", ("ok", pack([])), "ok", again) == both
    assert core.answered_again("r1", None, "ok", again) == both  # the call failed
    held = pack([0.01, encode_outcome("reserve", [b])])
    assert core.answered_again("r1", ("held", held), "ok", again) == [["jobs", "a", "la", True]]
    assert core.answered_again("r1", first, "error", pack(["x"])) == []
    core.ended("r1")
    assert core.answered_again("r1", first, "ok", again) == []  # no reserve in flight


def test_waiting_items_leave_together_up_to_the_limit_and_by_their_kind() -> None:
    waiting = [("a", 4), ("a", 4), ("gone", 50), ("b", 1), ("a", 3)]
    size = lambda item: item[1]  # noqa: E731
    gone = lambda item: item[0] == "gone"  # noqa: E731
    joins = lambda first, item: first[0] == item[0]  # noqa: E731
    assert take_group(waiting, size, gone=gone, joins=joins, limit=10) == [("a", 4), ("a", 4)]
    assert take_group(waiting, size, gone=gone, joins=joins, limit=10) == [("b", 1)]
    assert take_group(waiting, size, limit=1) == [("a", 3)]  # one too large goes alone
    assert waiting == []
    assert take_group(waiting, size) == []


def test_a_sequential_consumers_next_reserve_goes_with_its_acks() -> None:
    core = LinkCore(fast_put=False)
    core.called("reserve", ["jobs", 10, 30_000], 5.0, [record("a", "la")], False)
    assert core.ahead_of("ack_many", ["jobs", []], False) == (10, 30_000, 5.0)
    assert core.ahead_of("ack_many", ["jobs", []], True) is None  # others in flight
    assert core.ahead_of("ack", ["jobs", "a", "la"], False) is None
    core.called("ack_many", ["jobs", []], 0.0, [], False)
    assert core.ahead_of("ack_many", ["jobs", []], False) is None  # not after a reserve
    core.called("reserve", ["jobs", 10, 30_000], 0, [record("a", "la")], False)
    assert core.ahead_of("ack_many", ["jobs", []], False) is None  # did not wait
    core.called("reserve", ["jobs", 10, 30_000], 5.0, [], False)
    assert core.ahead_of("ack_many", ["jobs", []], False) is None  # got nothing


def test_the_word_that_a_fold_advances_counts_for_calls_in_flight_until_they_end() -> None:
    """The scheduler's ``folding`` word keeps a request waiting past its timeout: it
    is noted for the ids of calls in flight only, and forgotten when a call ends;
    bytes that are no list of ids change nothing."""
    core = LinkCore(fast_put=False)
    core.told_folding(pack(["r1", "gone", 7]), 10.0, {"r1", "r2"})
    assert core.folding_since("r1", 9.0) == 10.0
    assert core.folding_since("r1", 10.0) is None  # nothing said since
    assert core.folding_since("r2", 0.0) is None
    assert core.folding_since("gone", 0.0) is None
    core.told_folding(b"\xc1 not msgpack", 11.0, {"r1"})
    core.told_folding(pack({"r1": 1}), 11.0, {"r1"})
    assert core.folding_since("r1", 9.0) == 10.0
    core.ended("r1")
    assert core.folding_since("r1", 0.0) is None

"""The history checker on small hand-made histories: each broken promise is found, and
what delayq allows (a redelivery after a lease expiry or a nack) is not flagged."""

from __future__ import annotations

import pytest

from ._history import Delivery, History, Op, Report, check

LEASE = 1.0


def _put(id: str, at: float, delay: float = 0.0, outcome: str = "ok") -> Op:
    return Op("put", at, at + 0.001, outcome, id=id, delay=delay)


def _reserve(at: float, *ids: str, attempts: int = 1, lease: float = LEASE) -> Op:
    end = at + 0.001
    return Op(
        "reserve",
        at,
        end,
        delivered=[Delivery(id, f"{id}@{at}", end + lease, attempts) for id in ids],
    )


def _ack(reserve: Op, id: str, at: float, outcome: str = "ok") -> Op:
    return Op("ack", at, at + 0.001, outcome, id=id, token=_token(reserve, id))


def _nack(reserve: Op, id: str, at: float, delay: float) -> Op:
    return Op("nack", at, at + 0.001, id=id, token=_token(reserve, id), delay=delay)


def _token(reserve: Op, id: str) -> str:
    return next(d.token for d in reserve.delivered if d.id == id)


def _clean(report: Report) -> None:
    assert report.violations() == []


def test_a_clean_history_passes() -> None:
    first = _reserve(10.0, "a")
    ops = [_put("a", 8.0, delay=2.0), first, _ack(first, "a", 10.1)]
    report = check(ops)
    _clean(report)
    assert (report.messages, report.deliveries, report.duplicates) == (1, 1, 0)


def test_a_stored_message_never_delivered_is_lost() -> None:
    report = check([_put("a", 1.0), _put("b", 1.0), _reserve(2.0, "b")])
    assert report.lost == ["a"]


def test_a_cancelled_or_unknown_put_is_not_lost() -> None:
    cancel = Op("cancel", 1.5, 1.6, id="a", result=True)
    _clean(check([_put("a", 1.0), cancel, _put("b", 1.0, outcome="unknown")]))


def test_a_delivery_before_the_due_time_is_early() -> None:
    report = check([_put("a", 100.0, delay=5.0), _reserve(104.0, "a")])
    assert len(report.early) == 1
    assert report.early[0].startswith("a: 0.99")


def test_a_delivery_before_the_nack_delay_is_early() -> None:
    first = _reserve(10.0, "a")
    ops = [_put("a", 9.0), first, _nack(first, "a", 10.2, delay=3.0), _reserve(12.0, "a")]
    report = check(ops)
    assert len(report.early) == 1
    assert report.duplicates == 0  # the nack explains the second delivery


def test_a_message_acked_then_delivered_again_is_reported() -> None:
    first = _reserve(10.0, "a")
    ops = [_put("a", 9.0), first, _ack(first, "a", 10.1), _reserve(12.0, "a", attempts=2)]
    report = check(ops)
    assert report.acked_back == ["a"]
    assert report.duplicates == 1  # and explained: the lease had expired
    assert report.explained == 1


def test_a_failed_or_unknown_ack_does_not_count_as_acked() -> None:
    first = _reserve(10.0, "a")
    for outcome in ("failed", "unknown"):
        ack = _ack(first, "a", 10.1, outcome=outcome)
        _clean(check([_put("a", 9.0), first, ack, _reserve(12.0, "a", attempts=2)]))


def test_a_double_delivery_after_the_lease_expired_is_explained() -> None:
    ops = [_put("a", 9.0), _reserve(10.0, "a"), _reserve(11.5, "a", attempts=2)]
    report = check(ops)
    _clean(report)
    assert (report.duplicates, report.explained) == (1, 1)


def test_a_double_delivery_under_a_live_lease_is_a_violation() -> None:
    ops = [_put("a", 9.0), _reserve(10.0, "a"), _reserve(10.5, "a")]
    report = check(ops)
    assert (report.duplicates, report.explained) == (1, 0)
    assert len(report.unexplained) == 1
    assert "before the first lease expired" in report.unexplained[0]


def test_a_reply_held_up_past_its_lease_does_not_count_as_the_second_delivery() -> None:
    # The first grant's reply arrives late (a partition held it up), after its lease
    # ran out and after another consumer received the second grant.
    late = Op("reserve", 10.0, 11.8, delivered=[Delivery("a", "a@late", 11.0, attempts=1)])
    ops = [_put("a", 9.0), late, _reserve(11.2, "a", attempts=2)]
    report = check(ops)
    _clean(report)
    assert (report.duplicates, report.explained) == (1, 1)


def test_an_extend_moves_the_lease_expiry() -> None:
    first = _reserve(10.0, "a")
    extend = Op("extend", 10.5, 10.6, id="a", token=_token(first, "a"), result=13_000)
    report = check([_put("a", 9.0), first, extend, _reserve(12.0, "a", attempts=2)])
    assert len(report.unexplained) == 1


def test_a_delivery_of_a_failed_put_is_a_phantom() -> None:
    report = check([_put("a", 1.0, outcome="failed"), _reserve(2.0, "a")])
    assert report.phantom == ["a"]
    assert report.messages == 0


def test_the_recorder_notes_outcomes_and_lets_exceptions_through() -> None:
    class Unknown(Exception):
        pass

    history = History(unknown=[Unknown])
    with history.call("put", "a", delay=0.5):
        pass
    with pytest.raises(Unknown), history.call("put", "b"):
        raise Unknown
    with pytest.raises(ValueError, match="no"), history.call("put", "c"):
        raise ValueError("no")
    outcomes = {op.id: (op.outcome, op.error) for op in history.ops}
    assert outcomes == {
        "a": ("ok", None),
        "b": ("unknown", "Unknown"),
        "c": ("failed", "ValueError"),
    }
    assert all(op.end >= op.start for op in history.ops)
    report = check(history)
    assert report.lost == ["a"]
    assert report.unknown == 1

"""RetryPolicy: pure backoff arithmetic and validation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.durable import RetryPolicy


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.base, policy.factor) == (5, 1.0, 2.0)
    assert (policy.max_delay, policy.jitter) == (3600.0, 0.1)


def test_exponential_without_jitter() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, max_delay=10.0, jitter=0)
    assert [policy.delay_for(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_bounds() -> None:
    policy = RetryPolicy(base=10.0, factor=1.0, jitter=0.1)
    assert policy.delay_for(1, 0.0) == pytest.approx(9.0)
    assert policy.delay_for(1, 0.5) == pytest.approx(10.0)
    assert policy.delay_for(1, 1.0) == pytest.approx(11.0)


def test_huge_attempt_does_not_overflow() -> None:
    assert RetryPolicy(jitter=0).delay_for(100_000) == 3600.0


@given(
    attempt=st.integers(1, 10_000),
    r=st.floats(0, 1),
    base=st.floats(0, 1e6),
    factor=st.floats(1, 100),
    cap=st.floats(0, 1e6),
    jitter=st.floats(0, 1),
)
def test_delay_is_within_zero_and_the_cap(
    attempt: int, r: float, base: float, factor: float, cap: float, jitter: float
) -> None:
    policy = RetryPolicy(base=base, factor=factor, max_delay=cap, jitter=jitter)
    delay = policy.delay_for(attempt, r)
    assert 0.0 <= delay <= cap
    assert delay == policy.delay_for(attempt, r)


@given(attempt=st.integers(1, 60))
def test_delay_never_shrinks_without_jitter(attempt: int) -> None:
    policy = RetryPolicy(jitter=0)
    assert policy.delay_for(attempt + 1) >= policy.delay_for(attempt)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 1.0}, TypeError),
        ({"base": -1}, ValueError),
        ({"base": float("nan")}, ValueError),
        ({"factor": 0.5}, ValueError),
        ({"max_delay": float("inf")}, ValueError),
        ({"jitter": 1.5}, ValueError),
        ({"jitter": "0.1"}, TypeError),
    ],
)
def test_validation(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_delay_for_validates() -> None:
    with pytest.raises(ValueError, match="attempt"):
        RetryPolicy().delay_for(0)
    with pytest.raises(ValueError, match="random_value"):
        RetryPolicy().delay_for(1, 2.0)


def test_backoff_is_delay_for_with_a_random_jitter() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, max_delay=60.0, jitter=0.5)
    for attempt in (1, 2, 5):
        random.seed(attempt)
        value = random.random()
        random.seed(attempt)
        assert policy.backoff(attempt) == policy.delay_for(attempt, value)
    delays = {policy.backoff(3) for _ in range(20)}
    assert len(delays) > 1  # jittered
    assert all(2.0 <= d <= 6.0 for d in delays)  # 4 s +- 50 %


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"max_attempts": 1.0}, TypeError, "max_attempts must be an int, not float"),
        ({"max_attempts": 0}, ValueError, "max_attempts must be >= 1, got 0"),
        ({"base": "1"}, TypeError, "base must be a number, not str"),
        ({"base": True}, TypeError, "base must be a number, not bool"),
        ({"base": -1}, ValueError, "base must be finite and >= 0.0, got -1"),
        ({"factor": 0.5}, ValueError, "factor must be finite and >= 1.0, got 0.5"),
        ({"max_delay": float("inf")}, ValueError, "max_delay must be finite and >= 0.0, got inf"),
        ({"jitter": 1.5}, ValueError, "jitter must be between 0.0 and 1.0, got 1.5"),
        ({"jitter": None}, TypeError, "jitter must be a number, not NoneType"),
    ],
)
def test_bad_policies_are_refused_in_words_that_name_the_field(
    options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        RetryPolicy(**options)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_the_edges_of_a_policy_are_accepted() -> None:
    edge = RetryPolicy(max_attempts=1, base=0, factor=1, max_delay=0, jitter=1)
    assert (edge.max_attempts, edge.base, edge.factor, edge.max_delay, edge.jitter) == (
        1,
        0.0,
        1.0,
        0.0,
        1.0,
    )
    with pytest.raises(TypeError, match=r"^attempt must be an int, not float$"):
        RetryPolicy().delay_for(1.0)  # type: ignore[arg-type]

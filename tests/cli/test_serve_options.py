"""``delayq serve``'s options that are refused before anything starts: one usage line,
exit status 2 (the server itself is tested as a process in tests/server)."""

from __future__ import annotations

import pytest

from ._helpers import Cli, one_error_line


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("-1", "Invalid value for '--dispatch-prefetch': -1 is not in the range x>=0"),
        ("two", "Invalid value for '--dispatch-prefetch': 'two' is not a valid integer"),
        ("1.5", "Invalid value for '--dispatch-prefetch'"),
    ],
)
def test_a_bad_dispatch_prefetch_is_a_usage_error(cli: Cli, value: str, expected: str) -> None:
    result = cli("serve", "--dispatch-prefetch", value)
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result)


def test_the_help_says_what_dispatch_prefetch_does(cli: Cli) -> None:
    result = cli("serve", "--help", url=False)
    assert result.exit_code == 0
    assert "--dispatch-prefetch N" in result.output
    assert "0: none" in result.output

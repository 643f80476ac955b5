"""The CLI refuses the payloads every other face refuses, with one error line and
nothing stored (issue 33, point 2)."""

from __future__ import annotations

import json

from delayq import Queue

from ._helpers import Cli, one_error_line


def test_a_payload_of_too_many_values_is_refused(cli: Cli) -> None:
    hostile = json.dumps([[] for _ in range(340_000)])
    result = cli("put", "q", "-", input=hostile)
    assert result.exit_code != 0
    assert "more than 100000 values" in one_error_line(result)
    with Queue(cli.url, name="q") as queue:
        assert queue.stats().ready == 0
    assert cli("put", "q", "-", input=json.dumps([0] * 99_999)).exit_code == 0

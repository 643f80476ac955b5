"""``delayq send --app``: arguments the task's function cannot take are refused with
the line the Python call raises, before anything is written."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import Queue
from delayq.cli._worker import load_app
from delayq.runtime import BadArguments

from ._helpers import Cli, one_error_line

APP = """
from delayq import App

app = App({url!r})


@app.task(queue="orders")
def cancel_if_unpaid(order_id, *, reason="unpaid"):
    pass
"""


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> Iterator[str]:
    """An app module of a unique name in the current directory; sys.path and
    sys.modules are restored afterwards."""
    name = f"shop_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP.format(url=url)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1, 2, 3), {}), ((), {}), ((1,), {"nope": 1}), ((1,), {"order_id": 2})],
    ids=["too-many", "missing", "unknown-keyword", "twice"],
)
def test_send_refuses_what_the_python_call_refuses_with_the_same_line(
    cli: Cli, url: str, shop: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    app = load_app(f"{shop}:app")
    task = app.tasks["cancel_if_unpaid"]
    with pytest.raises(BadArguments) as refused:
        task.send(*args, **kwargs)
    assert str(refused.value).startswith("task 'cancel_if_unpaid': ")
    argv = [json.dumps(value) for value in args]
    for key, value in kwargs.items():
        argv += ["--kw", f"{key}={json.dumps(value)}"]
    result = cli("send", "cancel_if_unpaid", *argv, "--app", f"{shop}:app")
    assert result.exit_code == 1, result.output
    assert one_error_line(result) == f"error: {refused.value}"
    with Queue(url, name="orders") as q:
        assert q.stats().total == 0  # nothing written
    fits = cli("send", "cancel_if_unpaid", "7", "--kw", "reason=late", "--app", f"{shop}:app")
    assert fits.exit_code == 0, fits.output
    app.close()


def test_send_without_app_or_queue_says_where_the_message_goes(cli: Cli, url: str) -> None:
    """Without --app the task's queue is unknown: the message goes to ``default``, and
    stderr says so (a worker of a task on ``orders`` would never see it)."""
    result = cli("send", "cancel_if_unpaid", "7")
    assert result.exit_code == 0, result.output
    assert "without --app or --queue the message goes to queue 'default'" in result.stderr
    with Queue(url, name="default") as q:
        assert q.stats().total == 1
    quiet = cli("send", "cancel_if_unpaid", "8", "--queue", "orders")
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""

"""Without OpenTelemetry nothing changes: ``import delayq``, puts of every face and a
Worker's runs (stepped, and served) import nothing of it, write no trace header and
count no metrics, whether the API is not installed (hidden from ``sys.path``) or
installed and unused. The CLI takes the trace context of its environment
(``TRACEPARENT``), as text, without OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from delayq import Queue
from delayq.cli import main

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

SCRIPT = """
import asyncio, sys

if sys.argv[1] == "hidden":
    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Hide())

import delayq

url = "memory://"
app = delayq.App(url)
ran = []


@app.task(queue="jobs")
def work(n):
    ran.append(n)


@app.task(queue="jobs")
async def later(n):
    ran.append(n)


ids = [work.send(1), *app.send_many([work.message(2)])]
queue = delayq.Queue(url, name="jobs")
ids.append(queue.put({"task": "work", "args": [3]}))
ids += queue.put_many([{"payload": {"task": "work", "args": [4]}}])


async def main():
    ids.append(await later.send_async(5))
    await delayq.Worker(app).burst()
    ids.append(work.send(6))
    worker = delayq.Worker(app)  # serving: where a meter provider would be looked for
    serving = asyncio.create_task(worker.serve())
    while len(ran) < 6:
        await asyncio.sleep(0.01)
    worker.stop()
    await serving
    assert worker.metrics is None

asyncio.run(main())
assert sorted(ran) == [1, 2, 3, 4, 5, 6], ran
assert all(queue.get(i) is None for i in ids)  # acked
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
assert not loaded, loaded
print("ok")
"""


@pytest.mark.parametrize("otel", ["hidden", "installed"])
def test_puts_and_runs_import_no_opentelemetry(otel: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, otel],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def cli_put(tmp_path: Path, *args: str, **env: str | None) -> dict[str, str]:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    environment: dict[str, str | None] = {"TRACEPARENT": None, "TRACESTATE": None, **env}
    done = CliRunner().invoke(main, [*args, "--url", url], env=environment)
    assert done.exit_code == 0, done.output
    queue_name = "jobs" if args[0] == "put" else "default"
    msg = Queue(url, name=queue_name).get(done.stdout.strip())
    assert msg is not None
    return dict(msg.headers)


def test_the_cli_takes_the_trace_context_of_its_environment(tmp_path: Path) -> None:
    assert cli_put(tmp_path, "put", "jobs", "1", TRACEPARENT=PARENT, TRACESTATE="a=1") == {
        "traceparent": PARENT,
        "tracestate": "a=1",
    }
    assert cli_put(tmp_path, "send", "work", "--queue", "default", TRACEPARENT=PARENT) == {
        "traceparent": PARENT
    }
    assert cli_put(tmp_path, "put", "jobs", "1", TRACEPARENT="not-a-traceparent") == {}
    own = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    given = cli_put(
        tmp_path, "put", "jobs", "1", "--header", f"traceparent={own}", TRACEPARENT=PARENT
    )
    assert given == {"traceparent": own}

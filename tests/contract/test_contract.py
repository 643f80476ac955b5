"""The HTTP API as a contract other languages compile against (issue 16), checked with
tools nobody here wrote, from the npm packages of package-lock.json in this folder
(``npm ci``: ``make test`` and ``.ci/run`` install them):

* Redocly's linter finds no problem in ``/openapi.json``, error or warning (the rules
  of ``redocly.yaml``), served by a server with a token and by one without, and the
  two serve the same document;
* openapi-typescript turns it into types that ``client.ts`` (put, get, reschedule,
  cancel, batch, reserve, ack, nack, extend, dead, stats) and the README's TypeScript
  block compile against with ``tsc --strict``: types as tight as the server (a body it
  refuses does not compile, a field every answer carries is never undefined);
* both run, unchanged, against a live ``delayq serve`` with a token and one without;
  ``client.ts`` checks every answer against the document (status listed, required
  headers sent, body valid under ajv in strict mode) and exits 1 on any mismatch.

Without node, npm or the packages the test is skipped, and fails when ``$CI`` is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from server.test_serve_hardening import serving

HERE = Path(__file__).resolve().parent
README = HERE.parents[1] / "README.md"
BIN = HERE / "node_modules" / ".bin"
TOOLS = ("redocly", "openapi-typescript", "tsc")
TOKEN = "contract-test-token"
# The README's TypeScript block, and what it names that the test replaces.
TS_FENCE = re.compile(r"^```ts\n(.*?)^```$", re.MULTILINE | re.DOTALL)
README_BASE = "http://localhost:8080"


def _missing() -> str:
    """What this test needs and does not find ("" when nothing)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not on $PATH (the test needs Node.js 20.19+ with npm)"
    for tool in TOOLS:
        if not (BIN / tool).exists():
            return f"{BIN / tool} is missing: run 'npm ci' in {HERE} (make test does)"
    return ""


@pytest.fixture
def tools() -> None:
    reason = _missing()
    if reason and os.environ.get("CI"):
        pytest.fail(f"the contract test needs its tools on CI: {reason}")
    if reason:
        pytest.skip(reason)


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    env.update(
        # Redocly: no update check, no usage report (nothing but the server is reached).
        REDOCLY_SUPPRESS_UPDATE_NOTICE="true",
        REDOCLY_TELEMETRY="off",
        NO_COLOR="1",
    )
    return env


@pytest.fixture(params=["token", "no-token"])
def server(request: pytest.FixtureRequest, tools: None, tmp_path: Path) -> Iterator[str]:
    """``delayq serve`` with a token or without, on a free port (the memory backend):
    its base URL."""
    args: list[str] = []
    if request.param == "token":
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN, encoding="utf-8")
        args = ["--token-file", str(token_file)]
    with serving(tmp_path, *args, url="memory://contract") as served:
        yield served.base.rstrip("/")


def _token(request: pytest.FixtureRequest) -> str:
    """The token the test's server was started with ("" for none)."""
    return TOKEN if request.node.callspec.params["server"] == "token" else ""


def _run(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, cwd=HERE, capture_output=True, text=True, timeout=120, check=False,
        env=env or _environ(),
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{output}"
    return output


def _lint(path: Path) -> None:
    """Redocly's lint of ``path``: no error, no warning."""
    report = HERE / "generated" / f"{path.stem}.lint.json"
    done = subprocess.run(
        [str(BIN / "redocly"), "lint", "--config", "redocly.yaml", "--format", "json",
         str(path)],
        cwd=HERE, capture_output=True, text=True, timeout=120, check=False, env=_environ(),
    )  # fmt: skip
    start = done.stdout.find("{")
    assert start >= 0, f"redocly lint printed no report:\n{done.stdout}{done.stderr}"
    result = json.loads(done.stdout[start:])
    report.write_text(json.dumps(result, indent=2), encoding="utf-8")
    problems = [
        f"{p['severity']} {p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
        for p in result["problems"]
    ]
    assert problems == [], "\n".join(problems)
    assert done.returncode == 0, done.stderr


def _readme_client(base: str) -> str:
    """The README's TypeScript block, pointed at the test's server."""
    blocks = TS_FENCE.findall(README.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"the README has {len(blocks)} ts blocks, not one"
    code = str(blocks[0])
    assert README_BASE in code
    return code.replace(README_BASE, base)


def test_typescript_clients_compile_and_every_answer_matches_the_document(
    server: str, request: pytest.FixtureRequest
) -> None:
    token = _token(request)
    generated = HERE / "generated"
    shutil.rmtree(generated, ignore_errors=True)
    shutil.rmtree(HERE / "build", ignore_errors=True)
    generated.mkdir()
    # What a generator pointed at the server gets: no token needed for the document.
    document = httpx.get(f"{server}/openapi.json", timeout=10).raise_for_status().json()
    served = generated / "openapi.json"
    served.write_text(json.dumps(document), encoding="utf-8")
    _lint(served)
    # A server started with the other flags serves the same document.
    from delayq.server import ServeConfig, create_app  # noqa: PLC0415

    other = create_app(
        ServeConfig(url="memory://contract-other", dispatch=False, token=None if token else TOKEN)
    )
    assert other.openapi() == document

    _run([str(BIN / "openapi-typescript"), str(served), "--output", "generated/delayq.d.ts"])
    (generated / "readme.ts").write_text(_readme_client(server), encoding="utf-8")
    _run(
        [str(BIN / "tsc"), "--strict", "--target", "es2022", "--module", "nodenext",
         "--outDir", "build", "client.ts", "node-globals.d.ts", "generated/readme.ts"]
    )  # fmt: skip

    output = _run(["node", "build/client.js", server, token])
    assert re.search(r"contract: \d+ answers checked \(\d+ bodies\), 0 failures", output), output
    environ = _environ()
    if token:
        environ["DELAYQ_TOKEN"] = token
    readme = _run(["node", "build/generated/readme.js"], env=environ)
    assert "acked" in readme, readme

"""Every fenced code block of README.md runs as written (see readme_blocks.py for how).

The blocks of one section run in README order in one fresh, empty directory
(``$DELAYQ_URL`` unset, the virtualenv's ``bin`` first on ``$PATH``, pytest loading only
the plugins a project names), python blocks each in a fresh interpreter. A section
with ``sh`` blocks runs inside a private network and PID namespace (``unshare``), where
its ``delayq serve`` listens on 127.0.0.1:8080 and a ``redis-server`` started for it on
127.0.0.1:6379, clashing with nothing on the machine; everything in it is gone when the
namespace ends.

A block is skipped only when a ``<!-- not run: reason -->`` comment stands right above
its fence. A tool the blocks need (unshare, ip, node, curl, redis-server) that is
missing, or an unshare that may not make namespaces, skips its section locally and
fails it when ``$CI`` is set (or, for redis-server, when ``$DELAYQ_REQUIRE`` lists
redis).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from readme_blocks import (
    LANGUAGES,
    SIGNING_SECRET,
    VERIFIED_ANSWERS,
    Block,
    read_blocks,
    tools_needed,
)

README = Path(__file__).resolve().parents[2] / "README.md"
RUNNER = Path(__file__).resolve().with_name("readme_blocks.py")
BLOCKS = read_blocks(README.read_text(encoding="utf-8"))
#: Blocks that may be excused with a "not run" comment: keep this small.
MAX_NOT_RUN = 1
#: Languages whose blocks another test runs: the TypeScript client, compiled against
#: the served /openapi.json and run by tests/contract/test_contract.py.
RUN_ELSEWHERE = ("ts",)
#: The placeholders of the README's curl lines; a request naming one reaches no message.
PLACEHOLDERS = ("/ID/", '"TOKEN"')
#: Environment variables the README's commands must not inherit from whoever runs the
#: tests: the blocks set what they need themselves.
DROPPED_ENV = {
    "DELAYQ_URL",
    "DELAYQ_TOKEN",
    "DELAYQ_SIGNING_SECRET",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
}


#: The output the README documents for its python blocks, checked against what they
#: print: for the block whose code holds the key, one ``(fragment, pattern)`` per line
#: printed, in order, where ``fragment`` is the README's own text of that output (it
#: must stay in the block) and ``pattern`` what the printed line must match in full
#: (times and the monotonic deadline vary from run to run).
DOCUMENTED_OUTPUT: dict[str, list[tuple[str, str]]] = {
    'h = q.put("cancel order 42", delay="30m")': [
        ("is due: now", r"now"),
        ("raises queue.Empty: retry the call", r"retry the call"),
        ('print("nothing is due yet")', r"nothing is due yet"),
        (
            "<Handle pending due=2026-05-04T10:30:00.000Z (in 30m) deadline=8123.456789 "
            "value='cancel order 42'>",
            r"<Handle pending due=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
            r"\(in (30m|29m[\d.]+s)\) deadline=[\d.]+ value='cancel order 42'>",
        ),
        ("an aware datetime in UTC", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\+00:00"),
        ("# True: it was pending", r"True"),
        ("returns all due (up to 100): ['cancel order 42']", r"\['cancel order 42'\]"),
        ("# False: it came out already", r"False"),
        ("# 1 ['remind Ada']", r"1 \['remind Ada'\]"),
    ],
    "s.call_later(0.1, disconnect, other, id=other.id)": [
        ("# conn-8: idle too long, disconnected", r"conn-8: idle too long, disconnected"),
    ],
    'q.put({"order": 42, "action": "cancel-if-unpaid"}': [
        ("# {'order': 42, ...} 1", r"\{'order': 42, 'action': 'cancel-if-unpaid'\} 1"),
        (
            "# Stats(scheduled=0, ready=0, active=0, ...)",
            r"Stats\(scheduled=0, ready=0, active=0, dead=0, next_due_at=None, lag=0\.0\)",
        ),
    ],
}


def documented_output(code: str) -> list[tuple[str, str]] | None:
    """The documented output of the python block ``code``, None when it shows none."""
    found = [lines for key, lines in DOCUMENTED_OUTPUT.items() if key in code]
    assert len(found) <= 1, f"two DOCUMENTED_OUTPUT keys match one block:\n{code}"
    return found[0] if found else None


def sections() -> dict[str, list[Block]]:
    """The blocks to run, by section, in README order."""
    found: dict[str, list[Block]] = {}
    for block in BLOCKS:
        if block.not_run is None and block.lang not in RUN_ELSEWHERE:
            found.setdefault(block.section, []).append(block)
    return found


SECTIONS = sections()


def test_every_block_runs_or_says_why_not() -> None:
    assert len(BLOCKS) >= 10, f"{README} has only {len(BLOCKS)} fenced blocks"
    elsewhere = [b for b in BLOCKS if b.not_run is None and b.lang in RUN_ELSEWHERE]
    unknown = [
        b for b in BLOCKS if b.not_run is None and b.lang not in (*LANGUAGES, *RUN_ELSEWHERE)
    ]
    assert not unknown, f"blocks in a language no test runs: {unknown}"
    excused = [b for b in BLOCKS if b.not_run is not None]
    assert len(excused) <= MAX_NOT_RUN, f"too many blocks marked 'not run': {excused}"
    for block in excused:
        assert len(block.not_run or "") > 20, f"line {block.line}: say why it is not run"
    ran = sum(len(blocks) for blocks in SECTIONS.values())
    assert ran == len(BLOCKS) - len(excused) - len(elsewhere)


def test_the_documented_outputs_are_in_the_readme() -> None:
    """Each documented output names one python block that shows it: a README edit that
    drops or changes an output shown there makes this table change with it."""
    for key, lines in DOCUMENTED_OUTPUT.items():
        [block] = [b for b in BLOCKS if b.lang == "python" and key in b.code]
        assert block.not_run is None
        for fragment, _ in lines:
            assert fragment in block.code, f"README.md line {block.line}: {fragment!r}"


def test_commands_are_split_as_a_shell_reads_them() -> None:
    block = Block(1, "sh", "a \\\n  b  # c\n\nd '{\n  \"e\": 1}'\nf\n", "s")
    assert block.commands() == ["a \\\n  b  # c", "d '{\n  \"e\": 1}'", "f"]


def _unshare_argv() -> list[str]:
    """How to start a process in new network and PID namespaces (a user namespace too
    when not root); it is killed, and everything it started, when the test ends."""
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--net", "--pid", "--fork", "--kill-child", *user, "--"]


@functools.cache
def _namespaces_refused() -> str:
    """ "" when this machine lets the tests make namespaces, else unshare's complaint."""
    try:
        done = subprocess.run(
            [*_unshare_argv(), "true"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        return str(exc)
    return "" if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"


def missing(tools: set[str], source: str = "the README") -> None:
    """Skip, or fail on CI, when one of ``tools`` is not on this machine (or namespaces
    cannot be made); ``source`` names the page whose blocks need them."""
    absent = sorted(tool for tool in tools if shutil.which(tool) is None)
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    strict = bool(os.environ.get("CI")) or bool(
        "redis-server" in absent and ({"redis", "all"} & required)
    )
    if absent:
        message = f"{source}'s blocks need {', '.join(absent)}, not found on $PATH"
    elif "unshare" in tools and _namespaces_refused():
        message = f"unshare cannot make namespaces here: {_namespaces_refused()}"
    else:
        return
    if strict:
        pytest.fail(message)
    pytest.skip(message)


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in DROPPED_ENV}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SECRET"] = SIGNING_SECRET  # the README's --signing-secret "$SECRET"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # A page's `python -m pytest` loads the plugins its project asks for (its conftest's
    # pytest_plugins), not those the suite's environment installs for itself
    # (schemathesis, hypothesis...: 2 s of CPU at each start), as tests/testing does.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


def run_section(blocks: list[Block], workdir: Path) -> list[dict[str, Any]]:
    """Run ``blocks`` with readme_blocks.py (in namespaces when there are sh blocks)."""
    netns = any(block.lang == "sh" for block in blocks)
    workdir.mkdir()
    spec = workdir.parent / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "netns": netns,
                "cwd": str(workdir),
                "env": _environment(),
                "blocks": [asdict(block) for block in blocks],
            }
        ),
        encoding="utf-8",
    )
    argv = [sys.executable, str(RUNNER), str(spec)]
    if netns:
        argv = [*_unshare_argv(), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"the runner failed:\n{done.stdout}\n{done.stderr}"
    steps: list[dict[str, Any]] = json.loads(done.stdout)
    return steps


def _show(step: dict[str, Any], source: str) -> str:
    return (
        f"{source} line {step['line']}: {step['what']}\n"
        f"exit code {step['returncode']} {step['problem']}\n"
        f"--- stdout:\n{step['stdout']}\n--- stderr:\n{step['stderr']}"
    )


def check_step(step: dict[str, Any], source: str = "README.md") -> None:
    """What running one command or block of ``source`` as written must give."""
    assert step["returncode"] == 0, _show(step, source)
    assert not step["problem"], _show(step, source)
    what: str = step["what"]
    if what.startswith(("python", "node")):
        assert not step["stderr"], _show(step, source)  # no traceback, no warning
    if what.endswith("verified()"):
        # a request signed by delayq.server.sign verifies; a copy with one signed part
        # changed (body, URL, method, a signed header, v3 stripped) does not
        assert json.loads(step["stdout"]) == VERIFIED_ANSWERS, _show(step, source)
    elif what.startswith("curl "):
        answer = json.loads(step["stdout"])  # every API answer is JSON
        if any(placeholder in what for placeholder in PLACEHOLDERS):
            # ID and TOKEN stand for a reserved message's id and lease: as written, the
            # request is well formed and finds no such message, or no such lease.
            assert answer["error"]["code"] in {"not_found", "lease_lost"}, _show(step, source)
        else:
            assert not (isinstance(answer, dict) and "error" in answer), _show(step, source)


def run_as_written(
    blocks: list[Block], workdir: Path, source: str = "README.md"
) -> list[dict[str, Any]]:
    """Run ``blocks`` of ``source`` in ``workdir`` (skipped without the tools they need)
    and check each step as :func:`check_step` says: the steps, in order."""
    missing(tools_needed(blocks), "the README" if source == "README.md" else source)
    steps = run_section(blocks, workdir)
    assert {step["line"] for step in steps} == {block.line for block in blocks}
    commands = sum(len(b.commands()) if b.lang == "sh" else 1 for b in blocks)
    assert len(steps) >= commands
    for step in steps:
        check_step(step, source)
    return steps


@pytest.mark.parametrize("section", list(SECTIONS), ids=[s[:30] for s in SECTIONS])
def test_section_runs_as_written(section: str, tmp_path: Path) -> None:
    blocks = SECTIONS[section]
    by_line = {block.line: block for block in blocks}
    for step in run_as_written(blocks, tmp_path / "work"):
        documented = documented_output(by_line[step["line"]].code)
        if step["what"] == "python" and documented is not None:
            printed = step["stdout"].splitlines()
            assert len(printed) == len(documented), _show(step, "README.md")
            for line, (fragment, pattern) in zip(printed, documented, strict=True):
                assert re.fullmatch(pattern, line), f"{fragment!r} printed {line!r}"

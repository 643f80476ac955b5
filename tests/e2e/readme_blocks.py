"""README.md's fenced code blocks, and a runner that runs one section's blocks as written.

Imported by test_readme.py for :func:`read_blocks`; run as a script
(``python readme_blocks.py SPEC.json``) to run the blocks of one section, in README
order, in one directory, and print a JSON report on stdout. test_readme.py starts the
script inside a private network namespace when the section has ``sh`` blocks, so that
the ``delayq serve`` of the README listens on 127.0.0.1:8080 (and a ``redis-server``
on 127.0.0.1:6379 when the section names Redis) without meeting anything on the
machine.

How each language runs, as written:

- ``python``: a fresh interpreter. A block whose first line is a comment naming a
  file (``# myapp.py: ...``) is saved under that name and run as ``python myapp.py``,
  so that later blocks (and ``delayq worker myapp:app``) import it. A block that
  defines ``verified(secret, method, url, headers, body)`` is also run with
  a few lines added that call it on a request signed by :func:`delayq.server.sign`, and
  on copies with one signed part changed (body, URL, method, each signed header).
- ``js``: ``node -e``, then, for a block that defines ``verified``, the same check.
- ``sh``: each command (a line, with its ``\\``-continuations and quoted newlines) by
  ``bash -c``. A command that runs until stopped (``delayq serve``, ``delayq worker``,
  ``--watch``) runs in the background until it is ready (serve: its port accepts;
  the others: first output) and is stopped (Ctrl-C for ``--watch``, else SIGTERM)
  before the next such command and at the end of the section; it must exit 0.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FENCE_OPEN = re.compile(r"^```(\S*)\s*$")  # a bare fence: language "", which no test runs
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
FILE_COMMENT = re.compile(r"^#\s*(?P<name>[A-Za-z_]\w*\.py)\b")
DEFINES_VERIFIED = re.compile(r"^(?:def|function) verified\(", re.MULTILINE)
LONG_RUNNING = re.compile(r"\bdelayq\s+(?:serve|worker)\b|\s--watch\b")
SERVE = re.compile(r"\bdelayq\s+serve\b")
#: A worker is ready once each of its processes said ``worker.started``: a SIGTERM to
#: the group while a child still imports is a stop the supervisor reads as a failed
#: start (exit 1), which a loaded machine made of the README's ``--processes 2``.
WORKER = re.compile(r"\bdelayq\s+worker\b")
PROCESSES = re.compile(r"--processes[ =](\d+)")
REDIS_URL = re.compile(r"\bredis://(?:localhost|127\.0\.0\.1):6379\b")

LANGUAGES = ("python", "sh", "js")
SERVE_PORT = 8080
REDIS_PORT = 6379
#: The value of ``$SECRET`` that the README's ``--signing-secret "$SECRET"`` reads.
SIGNING_SECRET = "readme-signing-secret-0123456789"
SIGNED_BODY = b'{"order": 42}'
CHANGED_BODY = b'{"order": 43}'
COMMAND_TIMEOUT = 60.0
READY_TIMEOUT = 60.0  # a wait for readiness (spawned children import the app), not a measure
STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, code, where it is, and why it is not run (if so)."""

    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    section: str  # the "## " heading above it ("" before the first one)
    not_run: str | None = None

    def commands(self) -> list[str]:
        """An ``sh`` block as commands: lines joined over ``\\`` and open quotes."""
        commands: list[str] = []
        pending = ""
        for line in self.code.splitlines():
            if not pending and not line.strip():
                continue
            pending = f"{pending}\n{line}" if pending else line
            if line.endswith("\\") or not _complete(pending):
                continue
            commands.append(pending)
            pending = ""
        if pending.strip():
            commands.append(pending)
        return commands


def _complete(command: str) -> bool:
    """True when ``command`` has no open quote (shlex reads it to the end)."""
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def read_blocks(text: str) -> list[Block]:
    """Every fenced block of a Markdown text, in order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        opening = FENCE_OPEN.match(line)
        if line.startswith("## "):
            section = line[3:].strip()
        elif opening:
            end = index + 1
            while end < len(lines) and lines[end].rstrip() != "```":
                end += 1
            before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            note = NOT_RUN.match(before.strip())
            blocks.append(
                Block(
                    line=index + 1,
                    lang=opening.group(1),
                    code="\n".join(lines[index + 1 : end]) + "\n",
                    section=section,
                    not_run=note.group("reason") if note else None,
                )
            )
            index = end
        index += 1
    return blocks


def tools_needed(blocks: list[Block]) -> set[str]:
    """The programs the runner needs for these blocks (besides Python and bash)."""
    needed: set[str] = set()
    for block in blocks:
        if block.lang == "js":
            needed.add("node")
        elif block.lang == "sh":
            needed |= {"unshare", "ip"}
            for command in block.commands():
                if REDIS_URL.search(command):
                    needed.add("redis-server")
                if command.lstrip().startswith("curl "):
                    needed.add("curl")
    return needed


# -- the runner (inside the namespace) -----------------------------------------------------


@dataclass
class Step:
    """What one command (or one interpreter run) did."""

    line: int  # of the block's opening fence
    what: str
    returncode: int | None
    stdout: str
    stderr: str
    problem: str = ""  # the runner's own finding: not ready, did not stop, ...


#: Runs ``bash -c COMMAND`` with Ctrl-C's signal at its default, as in a user's shell:
#: a runner started in the background of a shell without job control (``cmd &`` in a
#: script, ``nohup``) ignores SIGINT, every child inherits that, and bash cannot undo
#: it, so ``--watch`` would never see the Ctrl-C this runner sends it.
_AS_TYPED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp('bash', ['bash', '-c', sys.argv[1]])"
)


class Background:
    """A command that runs until it is stopped. Its stdout is a terminal, as when a
    user types it (``--watch`` draws its table only on one); stderr goes to a file."""

    def __init__(self, line: int, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.line = line
        self.command = command
        self._out = bytearray()
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        master, terminal = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _AS_TYPED, command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=terminal,
            stderr=self._err,
            start_new_session=True,
        )
        os.close(terminal)
        self._reader = threading.Thread(target=self._read, args=(master,), daemon=True)
        self._reader.start()

    def _read(self, master: int) -> None:
        try:
            while chunk := os.read(master, 65536):
                self._out += chunk
        except OSError:  # EIO: the command and its children closed the terminal
            pass
        finally:
            os.close(master)

    def output(self) -> tuple[str, str]:
        self._err.seek(0)
        return bytes(self._out).decode(errors="replace"), self._err.read().decode(errors="replace")

    def wait_ready(self) -> str:
        """Wait until the command is ready: "" then, else what went wrong."""
        give_up = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < give_up:
            if self.process.poll() is not None:
                return f"exited with {self.process.returncode} before it was ready"
            if SERVE.search(self.command):
                if _accepts(SERVE_PORT):
                    return ""
            elif WORKER.search(self.command):
                wanted = int(m.group(1)) if (m := PROCESSES.search(self.command)) else 1
                if sum(part.count("worker.started") for part in self.output()) >= wanted:
                    return ""
            elif any(self.output()):
                return ""
            time.sleep(0.05)
        return f"not ready after {READY_TIMEOUT:.0f} s"

    def stop(self, problem: str = "") -> Step:
        sig = signal.SIGINT if "--watch" in self.command else signal.SIGTERM
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            problem = problem or f"still running {STOP_TIMEOUT:.0f} s after {sig.name}"
        self._reader.join(STOP_TIMEOUT)
        stdout, stderr = self.output()
        self._err.close()
        return Step(self.line, self.command, self.process.returncode, stdout, stderr, problem)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _run(line: int, what: str, argv: list[str], cwd: Path, env: dict[str, str]) -> Step:
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return Step(line, what, None, str(exc.stdout), str(exc.stderr), "timed out")
    return Step(line, what, done.returncode, done.stdout, done.stderr)


#: The request each ``verified`` block is checked on (signed by delayq.server.sign),
#: then the changes it must refuse, one at a time, as :func:`_changes` lists them.
SIGNED_URL = "https://api.example.com/orders/42/expire?k=1"
SIGNED_HEADERS = {
    "x-delayq-message-id": "order-42",
    "x-delayq-queue": "UTF-8''w%C3%A9bhooks",  # a queue named wébhooks, as sent
    "x-delayq-attempt": "1",
    "content-type": "application/json",
}


def _changes() -> list[dict[str, Any]]:
    """The requests a ``verified`` block is asked about: the signed one first, then
    one per signed part changed (body, URL, method, each signed header, the header
    removed) and one with the signature stripped of its v3."""
    signed: dict[str, Any] = {
        "method": "POST",
        "url": SIGNED_URL,
        "headers": {},
        "body": SIGNED_BODY,
    }
    changes = [
        signed,
        {**signed, "body": CHANGED_BODY},
        {**signed, "url": SIGNED_URL + "x"},
        {**signed, "method": "PUT"},
    ]
    for name, value in SIGNED_HEADERS.items():
        changes.append({**signed, "headers": {name: value + "x"}})
        changes.append({**signed, "headers": {name: ""}})
    changes.append({**signed, "headers": {"x-delayq-signature": "v2-only"}})
    return changes


#: What a ``verified`` block must answer about :func:`_changes`, in order.
VERIFIED_ANSWERS = [True] + [False] * (len(_changes()) - 1)


def _check_cases(header: str) -> str:
    """:func:`_changes` as JSON for the added lines: each with its full headers."""
    v2_only = header.rsplit(",v3=", 1)[0]
    cases = []
    for change in _changes():
        headers = {**SIGNED_HEADERS, "x-delayq-signature": header, **change["headers"]}
        if headers["x-delayq-signature"] == "v2-only":
            headers["x-delayq-signature"] = v2_only
        headers = {name: value for name, value in headers.items() if value != ""}
        cases.append({**change, "headers": headers, "body": change["body"].hex()})
    return json.dumps(cases)


def _python_check() -> str:
    """Lines added after a python ``verified`` block: its answers as JSON."""
    return (
        "\nimport json as _json, os as _os\n"
        "_e = _os.environ\n"
        "print(_json.dumps([verified(_e['README_SECRET'], _c['method'], _c['url'],"
        " _c['headers'], bytes.fromhex(_c['body']))"
        " for _c in _json.loads(_e['README_CASES'])]))\n"
    )


def _js_check() -> str:
    """Lines added after a js ``verified`` block: its answers as JSON (as for python)."""
    return (
        "\n{ const e = process.env;\n"
        "  const body = (c) => Buffer.from(c.body, 'hex');\n"
        "  console.log(JSON.stringify(JSON.parse(e.README_CASES).map((c) =>\n"
        "    verified(e.README_SECRET, c.method, c.url, c.headers, body(c))))); }\n"
    )


def _signature_env(env: dict[str, str]) -> dict[str, str]:
    from delayq.server import sign  # noqa: PLC0415 (the runner's only delayq import)

    header = sign(
        SIGNING_SECRET,
        int(time.time()),
        SIGNED_BODY,
        method="POST",
        url=SIGNED_URL,
        message_id=SIGNED_HEADERS["x-delayq-message-id"],
        queue=SIGNED_HEADERS["x-delayq-queue"],
        attempt=SIGNED_HEADERS["x-delayq-attempt"],
        content_type=SIGNED_HEADERS["content-type"],
    )
    return {**env, "README_SECRET": SIGNING_SECRET, "README_CASES": _check_cases(header)}


def _start_redis(cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    data = cwd / ".redis"
    data.mkdir()
    process = subprocess.Popen(
        [
            *("redis-server", "--bind", "127.0.0.1", "--port", str(REDIS_PORT)),
            *("--save", "", "--appendonly", "no", "--dir", str(data)),
        ],
        cwd=data,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    give_up = time.monotonic() + READY_TIMEOUT
    while not _accepts(REDIS_PORT):
        if process.poll() is not None or time.monotonic() > give_up:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)
    return process


def run_section(blocks: list[Block], cwd: Path, env: dict[str, str]) -> list[Step]:
    """Run ``blocks`` (one section, README order) in ``cwd``; one step per command."""
    steps: list[Step] = []
    background: list[Background] = []
    redis = None
    if any(REDIS_URL.search(b.code) for b in blocks if b.lang == "sh"):
        redis = _start_redis(cwd, env)
    try:
        for block in blocks:
            if block.lang == "python":
                steps.extend(_python_block(block, cwd, env))
            elif block.lang == "js":
                steps.extend(_js_block(block, cwd, env))
            elif block.lang == "sh":
                for command in block.commands():
                    if LONG_RUNNING.search(command):
                        steps.extend(job.stop() for job in background)
                        job = Background(block.line, command, cwd, env)
                        background = [job]
                        problem = job.wait_ready()
                        if problem:
                            steps.append(job.stop(problem))
                            background = []
                    else:
                        steps.append(_run(block.line, command, ["bash", "-c", command], cwd, env))
            else:
                steps.append(Step(block.line, block.lang, None, "", "", "no runner"))
        steps.extend(job.stop() for job in background)
    finally:
        if redis is not None:
            redis.terminate()
            redis.wait()
    return steps


def _python_block(block: Block, cwd: Path, env: dict[str, str]) -> list[Step]:
    named = FILE_COMMENT.match(block.code)
    if named:
        (cwd / named.group("name")).write_text(block.code, encoding="utf-8")
        argv = [sys.executable, named.group("name")]
    else:
        argv = [sys.executable, "-c", block.code]
    steps = [_run(block.line, "python", argv, cwd, env)]
    if DEFINES_VERIFIED.search(block.code):
        argv = [sys.executable, "-c", block.code + _python_check()]
        steps.append(_run(block.line, "python verified()", argv, cwd, _signature_env(env)))
    return steps


def _js_block(block: Block, cwd: Path, env: dict[str, str]) -> list[Step]:
    steps = [_run(block.line, "node", ["node", "-e", block.code], cwd, env)]
    if DEFINES_VERIFIED.search(block.code):
        argv = ["node", "-e", block.code + _js_check()]
        steps.append(_run(block.line, "node verified()", argv, cwd, _signature_env(env)))
    return steps


def main(spec_path: str) -> None:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    if spec["netns"]:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    blocks = [Block(**fields) for fields in spec["blocks"]]
    steps = run_section(blocks, Path(spec["cwd"]), spec["env"])
    print(json.dumps([asdict(step) for step in steps]))


if __name__ == "__main__":
    main(sys.argv[1])

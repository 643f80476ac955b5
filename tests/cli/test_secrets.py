"""A queue URL's password is never printed (issue 33, point 5): not by an error of any
kind, on any command, given with --url or $DELAYQ_URL; not by the library's
exceptions; not by what a command shows of its URL (purge's question, demo's first
line, bench's table and JSON). A secret on the command line, which ``ps`` shows to
every user of the machine, is warned about."""

from __future__ import annotations

import importlib.util
import logging
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from conformance.conftest import postgres_url
from delayq import AsyncQueue, Queue, UnsupportedURL
from delayq.cli import main
from delayq.durable.registry import redact_url

PASSWORD = "Hunter2sEcret"
URL_WARNING = "warning: a password in --url on the command line can be read by other users"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# Each a URL that carries PASSWORD and fails: malformed in the ways urllib reports
# (quoting a piece of the URL), of a scheme delayq does not have, refused by a backend's
# own check, or of a server that does not answer.
_PORT = _closed_port()
FAILING_URLS = {
    "bracket not closed": f"redis://:{PASSWORD}@[::1:6379/9",
    "unsupported scheme": f"bogus://u:{PASSWORD}@h/x",
    "password parameter, bad port": f"redis://127.0.0.1:99999/0?password={PASSWORD}",
    "slash in the password": f"redis://:{PASSWORD}/x@127.0.0.1:{_PORT}/0",
    "hash in the password": f"redis://:{PASSWORD}#x@127.0.0.1:{_PORT}/0",
    "sqlite with a userinfo": f"sqlite://u:{PASSWORD}@/x.db",
    "postgres, unknown parameter": f"postgresql://u:{PASSWORD}@127.0.0.1/t?bogus=1",
    "redis down": f"redis://:{PASSWORD}@127.0.0.1:{_PORT}/0",
    "redis down, lone userinfo": f"redis://{PASSWORD}@127.0.0.1:{_PORT}/0",
    "redis down, password parameter": f"redis://127.0.0.1:{_PORT}/0?password={PASSWORD}",
    "postgres down": f"postgresql://u:{PASSWORD}@127.0.0.1:{_PORT}/test?pool_timeout=0.5",
    "amqp down": f"amqp://u:{PASSWORD}@127.0.0.1:{_PORT}/?request_timeout=0.5",
    "kafka, unknown parameter": f"kafka://u:{PASSWORD}@127.0.0.1:{_PORT}?bogus=1",
    "kafka down": (
        f"kafka://u:{PASSWORD}@127.0.0.1:{_PORT}"
        "?security_protocol=SASL_PLAINTEXT&request_timeout=0.5"
    ),
}
_NEEDS = {"redis": "redis", "postgres": "psycopg", "amqp": "aiormq", "kafka": "aiokafka"}

# The arguments of every command of `delayq` that opens a queue; a command added
# without an entry here fails test_every_command_is_covered.
COMMANDS: dict[str, list[str]] = {
    "put": ["q", "1"],
    "send": ["t"],
    "get": ["q", "x"],
    "ls": ["q"],
    "cancel": ["q", "x"],
    "reschedule": ["q", "x", "--delay", "1s"],
    "stats": [],
    "dead": ["q"],
    "purge": ["q"],
    "demo": ["--orders", "2", "--window", "0.1"],
    "bench": ["--jobs", "2", "--concurrency", "1"],
    "worker": ["{app}"],
    "scheduler": [],
    "serve": ["--port", "0", "--no-dispatch"],
}


def test_every_command_is_covered() -> None:
    for name, command in main.commands.items():
        takes_url = any(param.name == "url" for param in command.params)
        assert takes_url == (name in COMMANDS), name


@pytest.fixture
def app_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module:app whose App takes its URL from $DELAYQ_URL when imported."""
    module = f"secret_app_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "import delayq\napp = delayq.App()\n\n@app.task()\nasync def t() -> None:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:app"


def _run(argv: list[str], env: dict[str, str] | None = None, input: str = "n\n") -> Result:
    return CliRunner().invoke(main, argv, env=env, input=input)


def _assert_hidden(result: Result, caplog: pytest.LogCaptureFixture) -> None:
    shown = "\n".join((result.stdout, result.stderr, caplog.text))
    assert PASSWORD not in shown, shown
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception


@pytest.mark.parametrize("given", ["--url", "$DELAYQ_URL"])
@pytest.mark.parametrize("kind", FAILING_URLS)
@pytest.mark.parametrize("command", COMMANDS)
def test_no_error_of_any_command_shows_the_password(
    command: str,
    kind: str,
    given: str,
    app_spec: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = FAILING_URLS[kind]
    for word, module in _NEEDS.items():
        if word in kind and not _installed(module):
            pytest.skip(f"needs {module}")
    caplog.set_level(logging.DEBUG)
    args = [arg.replace("{app}", app_spec) for arg in COMMANDS[command]]
    if given == "--url":
        result = _run([command, *args, "--url", url])
    else:
        monkeypatch.setenv("DELAYQ_URL", url)
        result = _run([command, *args])
    assert result.exit_code != 0, result.output
    _assert_hidden(result, caplog)
    assert (URL_WARNING in result.stderr) == (given == "--url"), result.stderr


# Named by kind, not by URL: a URL holds the closed port, which each pytest-xdist
# worker picks anew, and the workers must collect the same tests.
MALFORMED = {
    kind: url for kind, url in FAILING_URLS.items() if "down" not in kind and "scheme" not in kind
}
REFUSED = {**MALFORMED, "unsupported scheme": FAILING_URLS["unsupported scheme"]}


@pytest.mark.parametrize("url", list(REFUSED.values()), ids=list(REFUSED))
@pytest.mark.parametrize("face", [Queue, AsyncQueue])
def test_the_librarys_errors_do_not_show_the_password(url: str, face: type[Queue]) -> None:
    with pytest.raises(UnsupportedURL) as raised:
        face(url)
    error: BaseException | None = raised.value
    while error is not None:  # what a traceback shows, and what it leaves out
        assert PASSWORD not in f"{error} {error!r}"
        error = error.__cause__ or error.__context__


@pytest.mark.skipif(not _installed("redis"), reason="needs redis-py")
def test_an_unreachable_server_does_not_show_the_password() -> None:
    with (
        Queue(FAILING_URLS["redis down"], name="q") as queue,
        pytest.raises(Exception) as raised,  # noqa: PT011  (redis-py's own)
    ):
        queue.stats()
    assert PASSWORD not in f"{raised.value} {raised.value!r}"


def test_the_serve_config_does_not_show_its_secrets() -> None:
    from delayq.server import ServeConfig  # noqa: PLC0415  (the serve extra)

    config = ServeConfig(
        url=f"redis://:{PASSWORD}@h/0", token=f"t-{PASSWORD}", signing_secret=f"s-{PASSWORD}"
    )
    assert PASSWORD not in repr(config)
    assert "url='redis://:***@h/0'" in repr(config)
    assert "token='***'" in repr(config)
    assert "port=8080" in repr(config)


def test_redaction_needs_no_parse() -> None:
    assert redact_url(f"redis://:{PASSWORD}@[::1:6379/9") == "redis://:***@[::1:6379/9"
    assert redact_url(f"redis://:a/{PASSWORD}@h/0") == "redis://:***@h/0"
    assert redact_url(f"amqp://u:p@ss:{PASSWORD}@h/") == "amqp://u:***@h/"
    assert redact_url(f"redis://h/0?db=1&PassWord={PASSWORD}&x=1") == (
        "redis://h/0?db=1&PassWord=***&x=1"
    )
    assert redact_url(f"postgresql://h/d?sslpassword={PASSWORD}") == (
        "postgresql://h/d?sslpassword=***"
    )
    assert redact_url("sqlite:///home/a@b/q.db") == "sqlite:///home/a@b/q.db"
    assert redact_url(b"redis://:x@h") == "<bytes>"


# -- what a command shows of a URL that works ---------------------------------------------


@pytest.fixture
def working_url(tmp_path: Path) -> Iterator[str]:
    """A queue URL with PASSWORD that opens: the test PostgreSQL trusts its clients,
    whatever password they give."""
    for url in postgres_url(tmp_path):
        user, _, rest = url.partition("://")[2].partition("@")
        yield f"postgresql://{user}:{PASSWORD}@{rest}"


def test_purge_demo_and_bench_do_not_show_the_password(
    working_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("DELAYQ_URL", working_url)
    assert _run(["put", "q", "1"]).exit_code == 0
    purge = _run(["purge", "q"], input="n\n")
    assert "remove 1 message(s) of queue 'q' at postgresql://postgres:***@" in purge.stderr
    _assert_hidden(purge, caplog)
    demo = _run(["demo", "--orders", "2", "--window", "0.1"])
    assert "url=postgresql://postgres:***@" in demo.stdout, demo.output
    _assert_hidden(demo, caplog)
    for extra in ([], ["--json"]):
        bench = _run(["bench", "--jobs", "2", "--concurrency", "1", *extra])
        assert "postgresql://postgres:***@" in bench.stdout, bench.output
        _assert_hidden(bench, caplog)


# -- secrets on the command line -------------------------------------------------------------


def test_serve_warns_of_a_signing_secret_on_the_command_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"sqlite:///{Path('no') / 'such' / 'dir.db'}"
    given = _run(["serve", "--url", down, "--port", "0", "--signing-secret", PASSWORD])
    assert (
        "warning: --signing-secret on the command line can be read by other users of this "
        "machine (ps): use --signing-secret-file or $DELAYQ_SIGNING_SECRET"
    ) in given.stderr
    assert given.exit_code == 1
    _assert_hidden(given, caplog)
    monkeypatch.setenv("DELAYQ_SIGNING_SECRET", PASSWORD)
    from_env = _run(["serve", "--url", down, "--port", "0"])
    assert "warning" not in from_env.stderr
    assert from_env.exit_code == 1


def test_a_url_without_a_password_does_not_warn(tmp_path: Path) -> None:
    result = _run(["stats", "--url", f"sqlite:///{tmp_path / 'q.db'}"])
    assert "warning" not in result.stderr

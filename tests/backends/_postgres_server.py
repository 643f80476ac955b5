"""A private PostgreSQL server for the tests that kill or restart one: ``initdb`` into a
temporary directory and ``postgres`` (a child of the test process, unlike what
``pg_ctl`` starts, so that a killed server is reaped) on a free port, from the machine's binaries
(``pg_config --bindir``, else PATH). initdb refuses to run as root: as root the
server runs as the ``postgres`` user (``runuser``), its directory owned by it.
The shared test server is never touched. The fault tests (tests/faults/_netns.py) run
one inside a network namespace: ``wrap`` prefixes the server's command, ``listen`` and
``trust`` open it to the namespace's links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from _ports import free_port

__all__ = ["PostgresUnavailable", "PrivatePostgres"]


class PostgresUnavailable(Exception):
    """The binaries are missing or the server did not start."""


_TOOLS = ("initdb", "postgres", "pg_isready")


def _bindir() -> Path:
    config = shutil.which("pg_config")
    if config is not None:
        found = subprocess.run([config, "--bindir"], capture_output=True, text=True, check=False)
        path = Path(found.stdout.strip())
        if all((path / tool).exists() for tool in _TOOLS):
            return path
    initdb = shutil.which("initdb")
    if initdb is None or not all((Path(initdb).parent / tool).exists() for tool in _TOOLS):
        raise PostgresUnavailable(f"{', '.join(_TOOLS)} not found (pg_config --bindir, PATH)")
    return Path(initdb).parent


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


class PrivatePostgres:
    """One server of the test's own; ``kill()`` is a SIGKILL of it and its processes."""

    def __init__(
        self,
        wrap: Sequence[str] = (),
        listen: str = "127.0.0.1",
        trust: str | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        """``wrap``: argv the server's command is run under (``ip netns exec NAME``);
        ``listen``: its ``listen_addresses``; ``trust``: a network (CIDR) whose clients
        connect without a password; ``settings``: more server settings (``-c``), e.g.
        ``shared_preload_libraries``."""
        self.settings = dict(settings or {})
        self.bindir = _bindir()
        self.wrap = list(wrap)
        self.listen = listen
        self.root = Path(tempfile.mkdtemp(prefix="delayq-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        self._process: subprocess.Popen[bytes] | None = None
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        if trust is not None:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {trust} trust\n")
        self.start()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise PostgresUnavailable(f"{tool} failed: {done.stderr}{done.stdout}\n{log}")

    def start(self) -> None:
        """Start the server as a child of this process (so that a killed one is reaped
        and a restart does not find its pid alive), and wait until it answers."""
        command = [
            str(self.bindir / "postgres"),
            *("-D", str(self.data), "-p", str(self.port), "-k", str(self.root)),
            *("-c", f"listen_addresses={self.listen}", "-c", "fsync=on"),
            *(arg for key, value in self.settings.items() for arg in ("-c", f"{key}={value}")),
        ]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.wrap, *command]
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                # By its unix socket: reachable from any network namespace.
                [str(self.bindir / "pg_isready"), "-h", str(self.root), "-p", str(self.port)],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise PostgresUnavailable(f"postgres did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def _pids(self) -> list[int]:
        """The postmaster, then its children (by /proc), all started by this object."""
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return []
        main = int(pid_file.read_text().split()[0])
        children = Path(f"/proc/{main}/task/{main}/children")
        found = children.read_text().split() if children.exists() else []
        return [main, *map(int, found)]

    def kill(self) -> None:
        """SIGKILL the server and each of its processes, and wait until they are gone."""
        pids = self._pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._process is not None:
            self._process.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "the killed server did not go away"
            time.sleep(0.02)

    def restart(self) -> None:
        """A crash and a restart on the same data directory (crash recovery)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

"""A real 3-master Redis Cluster for the tests, from the ``redis-server`` binary.

:func:`shared_cluster` starts one per test session on free ports of 127.0.0.1 (cluster
mode, no persistence, its files in a temporary directory), joins the three with
``redis-cli --cluster create``, waits for ``cluster_state:ok`` and stops it at the end
of the test session (:func:`stop_shared`), or at exit.
It never touches the shared Redis on port 6379. When it cannot start, it raises
:class:`ClusterUnavailable`; callers skip, or fail when ``$DELAYQ_REQUIRE`` lists redis.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _ports import free_ports

__all__ = ["Cluster", "ClusterUnavailable", "shared_cluster", "stop_shared"]

MASTERS = 3
#: How long the cluster may take to come up: well under a second on an idle machine, but
#: `redis-cli --cluster create` polls the join once a second and took over 8 s on two
#: cores saturated by other work.
START_TIMEOUT = 30.0


class ClusterUnavailable(RuntimeError):
    """The cluster could not be started (no binary, or it did not come up)."""


class Cluster:
    """Three cluster-mode ``redis-server`` masters joined into one cluster, each with
    ``replicas`` replicas (then a dead master's replica takes over within seconds)."""

    def __init__(self, replicas: int = 0) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            raise ClusterUnavailable("no redis-server or redis-cli binary on PATH")
        self._server, self._cli = server, cli
        self.replicas = replicas
        self.directory = Path(tempfile.mkdtemp(prefix="delayq-cluster-"))
        #: The masters first (``redis-cli --cluster create`` makes them so), then replicas.
        #: Below the ephemeral range: a killed node is started again on its own ports. A node
        #: listens on its port + 10000 too (the cluster bus).
        self.ports = free_ports(MASTERS * (1 + replicas), companion=10000)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """``redis+cluster://`` of the three masters."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:MASTERS])

    def _ask(self, port: int, *command: str) -> str:
        done = subprocess.run(
            [self._cli, "-p", str(port), *command],
            capture_output=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        return done.stdout.decode(errors="replace")

    def start(self) -> None:
        """Start the nodes, create the cluster and wait until it serves every slot (and
        every replica is in sync)."""
        deadline = time.monotonic() + START_TIMEOUT
        self._launch(deadline)
        create = subprocess.run(
            [
                self._cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                *("--cluster-replicas", str(self.replicas), "--cluster-yes"),
            ],
            capture_output=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        if create.returncode != 0:
            raise ClusterUnavailable(f"cluster create failed: {create.stdout[-500:]!r}")
        self._wait_ok(deadline)
        for port in self.ports[MASTERS:]:
            while "master_link_status:up" not in self._ask(port, "info", "replication"):
                self._check(deadline, "a replica did not sync")
                time.sleep(0.05)

    def kill(self, port: int | None = None) -> None:
        """SIGKILL the node of ``port``, or every node (their cluster config files stay)."""
        ports = list(self.processes) if port is None else [port]
        for each in ports:
            self.processes[each].kill()
        for each in ports:
            self.processes.pop(each).wait(10)

    def restart(self) -> None:
        """Start the killed nodes again from their cluster config files (their data is
        gone: no persistence) and wait until the cluster serves every slot."""
        deadline = time.monotonic() + START_TIMEOUT
        self._launch(deadline)
        self._wait_ok(deadline)

    def wait_failover(self, dead: int) -> None:
        """Wait until the others hold the killed master ``dead`` failed and serve all
        its slots again (its replica promoted)."""
        deadline = time.monotonic() + START_TIMEOUT
        alive = next(iter(self.processes))
        while True:
            nodes = self._ask(alive, "cluster", "nodes").splitlines()
            line = next(line for line in nodes if f":{dead}@" in line)
            if " master,fail " in line and line.rstrip().endswith("disconnected"):
                break  # failed, and its slots moved to the promoted replica
            self._check(deadline, "no replica took over the dead master")
            time.sleep(0.05)
        self._wait_ok(deadline)

    def _launch(self, deadline: float) -> None:
        # With replicas, a dead master is failed after 2 s (not 15) and its replica always
        # tries to take over. Without, a node slow to answer on a busy machine must not be
        # failed: that would take the cluster down under a test.
        failover = ("--cluster-node-timeout", "2000", "--cluster-replica-validity-factor", "0")
        for port in self.ports:
            if port in self.processes:
                continue
            command = [
                self._server,
                *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
                *("--cluster-enabled", "yes"),
                *("--cluster-config-file", str(self.directory / f"nodes-{port}.conf")),
                *(failover if self.replicas else ()),
                *("--save", "", "--appendonly", "no"),
                *("--logfile", str(self.directory / f"redis-{port}.log")),
            ]
            self.processes[port] = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        for port in self.processes:
            while "PONG" not in self._ask(port, "ping"):
                self._check(deadline, "a node did not answer PING")
                time.sleep(0.02)

    def _wait_ok(self, deadline: float) -> None:
        for port in self.processes:
            while "cluster_state:ok" not in self._ask(port, "cluster", "info"):
                self._check(deadline, "the cluster did not reach cluster_state:ok")
                time.sleep(0.05)

    def _check(self, deadline: float, what: str) -> None:
        for port, process in self.processes.items():
            if process.poll() is not None:
                log = self.directory / f"redis-{port}.log"
                tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
                raise ClusterUnavailable(f"the redis-server of port {port} exited: {tail}")
        if time.monotonic() > deadline:
            raise ClusterUnavailable(what)

    def stop(self) -> None:
        """Stop every node and delete the directory."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


_shared: Cluster | None = None
_failure: str | None = None


def shared_cluster() -> Cluster:
    """The session's cluster, started on first use and stopped when the process exits."""
    global _shared, _failure
    if _failure is not None:
        raise ClusterUnavailable(_failure)
    if _shared is None:
        cluster = Cluster()
        try:
            cluster.start()
        except (ClusterUnavailable, OSError, subprocess.SubprocessError) as exc:
            cluster.stop()
            _failure = str(exc)
            raise ClusterUnavailable(_failure) from exc
        atexit.register(cluster.stop)
        _shared = cluster
    return _shared


def stop_shared() -> None:
    """Stop the session's cluster, if one started: called at the end of each test
    session (tests/conftest.py), since a pytest-xdist worker may end without running
    ``atexit`` handlers (two CI runs left the three nodes running)."""
    global _shared
    cluster, _shared = _shared, None
    if cluster is not None:
        cluster.stop()

"""Private RabbitMQ nodes for the tests that kill and restart them.

:class:`RabbitNodes` runs one node or a 3-node cluster from the machine's
``rabbitmq-server``, each node with its own name (``dq<hex>-<n>@localhost``), ports
below the kernel's ephemeral range (a restarted node's port could otherwise be taken by
an outgoing connection meanwhile), data and log directories in the test's temporary
directory, and an Erlang cookie of its own; the cluster forms at first boot
(``classic_config`` peer discovery). Nodes are stopped by their process id, never by
name, and the shared node (5672) is never touched.

With ``netns``, the nodes run inside that network namespace (``ip netns exec``): the
listener on every address of the namespace (``0.0.0.0``), epmd and the distribution on
the namespace's own loopback; clients reach a node at ``host`` (an address of the
namespace, a link's end). Stopping them ends every process left in the namespace (epmd,
started by the node) by its process id too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import pytest

from _ports import free_ports

__all__ = ["RabbitNodes", "unavailable"]

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
#: How long a node may take to accept AMQP connections.
READY_TIMEOUT = 60.0


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail when ``$DELAYQ_REQUIRE`` lists amqp."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if "amqp" in required or "all" in required:
        pytest.fail(f"amqp is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"amqp unavailable: {reason}")


class RabbitNodes:
    """``size`` private nodes (1 or 3, clustered): :meth:`start`, :meth:`kill` one with
    SIGKILL, :meth:`start_node` it again on the same port and data, :meth:`stop`."""

    def __init__(
        self,
        directory: Path,
        size: int,
        tls: tuple[Path, Path] | None = None,
        *,
        netns: str | None = None,
        host: str = "127.0.0.1",
        config: Sequence[str] = (),
        advanced: str = "",
    ) -> None:
        if not Path(SERVER).exists() or shutil.which("erl") is None:
            unavailable(f"{SERVER} (and erl) are needed to run private RabbitMQ nodes")
        self.directory = directory
        tag = secrets.token_hex(3)
        self.names = [f"dq{tag}-{n}@localhost" for n in range(size)]
        ports = free_ports(2 * size if tls else size, companion=1000)
        self.ports = ports[:size]
        self.cookie = secrets.token_hex(16)
        #: ``(certificate, key)`` of a TLS listener on each node's ``tls_ports`` entry.
        self.tls = tls
        self.tls_ports = ports[size:]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        #: The network namespace the nodes run in (None: the machine's own).
        self.netns = netns
        #: Where clients reach the nodes.
        self.host = host
        #: Further lines of each node's rabbitmq.conf (``consumer_timeout = 3000``), and
        #: its advanced.config (Erlang terms, for settings rabbitmq.conf does not take).
        self.config = list(config)
        self.advanced = advanced

    def url(self, node: int, query: str = "") -> str:
        return f"amqp://guest:guest@{self.host}:{self.ports[node]}/%2F{query}"

    def _home(self, node: int) -> Path:
        home = self.directory / f"node{node}"
        if home.exists():
            return home
        home.mkdir(parents=True)
        listen = "0.0.0.0" if self.netns else "127.0.0.1"
        lines = [
            f"listeners.tcp.default = {listen}:{self.ports[node]}",
            "loopback_users = none",
            *(self._tls_lines(node) if self.tls else ()),
            "cluster_formation.peer_discovery_backend = classic_config",
            *(
                f"cluster_formation.classic_config.nodes.{n + 1} = {name}"
                for n, name in enumerate(self.names)
            ),
            *self.config,
        ]
        (home / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        if self.advanced:
            (home / "advanced.config").write_text(self.advanced + "\n")
        (home / "enabled_plugins").write_text("[].\n")
        cookie = home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        return home

    def _tls_lines(self, node: int) -> list[str]:
        assert self.tls is not None
        cert, key = self.tls
        return [
            f"listeners.ssl.default = 127.0.0.1:{self.tls_ports[node]}",
            f"ssl_options.cacertfile = {cert}",
            f"ssl_options.certfile = {cert}",
            f"ssl_options.keyfile = {key}",
            "ssl_options.verify = verify_none",
            "ssl_options.fail_if_no_peer_cert = false",
        ]

    def start_node(self, node: int) -> None:
        home = self._home(node)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.names[node],
            "RABBITMQ_NODE_PORT": str(self.ports[node]),
            "RABBITMQ_DIST_PORT": str(self.ports[node] + 1000),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
            "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_PID_FILE": str(home / "pid"),
        }
        with (home / "server.out").open("ab") as out:
            prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
            self.procs[node] = subprocess.Popen(
                [*prefix, SERVER], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home
            )

    def wait_ready(self, node: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                with socket.create_connection((self.host, self.ports[node]), timeout=0.5):
                    return
            except OSError:
                proc = self.procs[node]
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.directory / f"node{node}" / "server.out").read_text()[-2000:]
                    unavailable(f"node {self.names[node]} did not start: {tail}")
                time.sleep(0.2)

    def start(self) -> None:
        for node in range(len(self.names)):
            self.start_node(node)
        for node in range(len(self.names)):
            self.wait_ready(node)

    def _beam(self, node: int) -> int | None:
        pid_file = self.directory / f"node{node}" / "pid"
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def kill(self, node: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the node's Erlang VM, by its process id (SIGKILL: no shutdown
        at all; SIGTERM: RabbitMQ's orderly stop), and wait for it to end."""
        pid = self._beam(node)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        proc = self.procs.pop(node, None)
        if proc is not None:
            proc.wait(60)
        (self.directory / f"node{node}" / "pid").unlink(missing_ok=True)

    def stop(self) -> None:
        for node in list(self.procs):
            self.kill(node)
        if self.netns:
            # What the nodes left in their namespace (epmd), each by its process id.
            listed = subprocess.run(
                ["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False
            )
            for pid in listed.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)

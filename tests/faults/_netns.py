"""Hosts of the tests' own, in network namespaces: a server behind links that a test
can cut.

:class:`ServerHost` is one network namespace (``ip netns add``) holding a server. Each
:meth:`ServerHost.link` is a veth pair between the root namespace (where the clients
run) and the server's namespace, on a private /30 of 10.231.0.0/16 that no interface of
the machine uses; a client reaches the server at ``link.address``. Two clients on two
links of one host can thus be cut apart: one link down, the other up.

Faults are ``tc`` queueing disciplines on the veth ends (the only ones this harness
made; the root namespace's firewall is never touched): ``blackhole`` drops every packet
an interface sends, silently, as a peer that stops answering without closing does.
Packet loss is an ``nft`` table inside the host's namespace (this kernel has no
``netem``), dropping every n-th packet the link carries each way.

* :meth:`Link.silence`: the server's replies are dropped (the server still receives
  and runs what it is sent: the case where a write's fate is unknown);
* :meth:`Link.cut`: both directions are dropped (a partition);
* :meth:`Link.lose`: one packet in ``every`` is dropped each way (TCP retransmits it);
* :meth:`Link.heal`: back to normal.

Every name carries the pid of the test process (``dqf<pid>...``), so parallel runs do
not clash, and namespaces left by a test process that died are removed by the next run.
:class:`NsRedis` runs a ``redis-server`` inside a host's namespace on a temp dir and
stops it by PID; :class:`NsPostgres` a private PostgreSQL (``initdb``, run as the
``postgres`` user when root) the same way.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, NoReturn

import pytest

from backends._postgres_server import PrivatePostgres
from backends._rabbitmq_nodes import RabbitNodes
from backends._redis_server import wait_ready

__all__ = [
    "CONNECT_TIMEOUT",
    "READ_TIMEOUT",
    "Link",
    "NsPostgres",
    "NsRabbit",
    "NsRedis",
    "ServerHost",
    "enter",
    "namespaces_refused",
    "unavailable",
]

#: Where the links' /30 subnets are taken from (private, used by nothing here).
_POOL = ipaddress.ip_network("10.231.0.0/16")
_SLOTS = _POOL.num_addresses // 4
_PREFIX = "dqf"
_NAME = re.compile(rf"^{_PREFIX}(\d+)s\d+$")
_counter = 0
#: setns(2)'s flag of a network namespace.
_CLONE_NEWNET = 0x40000000
#: The socket and connect timeouts (s) of the tests' URLs (the defaults are 10 and 5).
READ_TIMEOUT = 1.0
CONNECT_TIMEOUT = 0.5


def unavailable(reason: str, what: str = "network namespaces") -> NoReturn:
    """Fail under CI (``$CI`` set, or ``$DELAYQ_REQUIRE`` naming netns or all), skip
    elsewhere: the fault tests need ``what`` (root's tools), and ``reason`` says why
    they cannot have them here."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if os.environ.get("CI") or required & {"netns", "all"}:
        pytest.fail(f"the fault tests need {what}, and: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespaces_refused() -> str:
    """``""`` when this process can make the hosts (root, ``ip``, ``tc`` with the
    blackhole discipline, ``nft`` with nf_tables, ``redis-server``), else why not."""
    if os.geteuid() != 0:
        return "not root (ip netns needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "tc", "nft", "redis-server"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (Debian: apt-get install iproute2 nftables)"
    try:
        with ServerHost() as host:
            link = host.link()
            link.cut()
            link.lose(every=100)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return ""


def enter(name: str) -> None:
    """Move the calling thread into the network namespace ``name`` (setns(2) through
    libc: what ``ip netns exec`` does for a process). The sockets the thread opens
    from then on, and the threads it starts, are that namespace's."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{name}") as handle:
        if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")


def _sweep() -> None:
    """Remove the namespaces of test processes that died without cleaning up."""
    try:
        names = _run(["ip", "netns", "list"]).split()
    except (RuntimeError, OSError):
        return
    for name in names:
        match = _NAME.match(name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _used_networks() -> list[ipaddress.IPv4Network]:
    found = []
    for line in _run(["ip", "-o", "-4", "addr", "show"]).splitlines():
        match = re.search(r"inet (\S+)", line)
        if match:
            found.append(ipaddress.ip_interface(match.group(1)).network)
    return found


def _free_subnet(avoid: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /30 of the pool that overlaps nothing the machine (or ``avoid``) uses."""
    global _counter
    used = [*_used_networks(), *avoid]
    for _ in range(_SLOTS):
        slot = (os.getpid() * 64 + _counter) % _SLOTS
        _counter += 1
        subnet = ipaddress.ip_network(f"{_POOL.network_address + slot * 4}/30")
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError("no free /30 left in 10.231.0.0/16")


def _mac(argv: Sequence[str]) -> str:
    match = re.search(r"link/ether (\S+)", _run(argv))
    if match is None:
        raise RuntimeError(f"no MAC address in {' '.join(argv)}")
    return match.group(1)


class Link:
    """One veth pair between the root namespace and a host: ``address`` is the host's
    end, ``peer`` the root namespace's."""

    def __init__(self, host: ServerHost, index: int, client: ServerHost | None = None) -> None:
        self.host = host
        #: The namespace of the link's outer end: the root's (None), or a client host's
        #: (a process's threads that enter it reach the server through this link alone).
        self.client = client
        self.outer = f"{host.name}o{index}"  # in the root namespace, or the client's
        self.inner = f"{host.name}i{index}"  # in the host's namespace
        self.subnet = _free_subnet([link.subnet for link in host.links])
        peer, address = list(self.subnet.hosts())
        self.peer, self.address = str(peer), str(address)
        ns = host.name
        outer = self._outer_ip
        _run(["ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner])
        try:
            _run(["ip", "link", "set", self.inner, "netns", ns])
            if client is not None:
                _run(["ip", "link", "set", self.outer, "netns", client.name])
            _run([*outer, "addr", "add", f"{self.peer}/30", "dev", self.outer])
            _run([*outer, "link", "set", self.outer, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address}/30", "dev", self.inner])
            _run(["ip", "-n", ns, "link", "set", self.inner, "up"])
            # Permanent neighbours: no ARP, so a cut stays silent (a failed ARP
            # lookup would answer "no route to host") and a heal is immediate.
            outer_mac = _mac([*outer, "link", "show", self.outer])
            inner_mac = _mac(["ip", "-n", ns, "link", "show", self.inner])
            _run(
                [
                    *outer,
                    "neigh",
                    "replace",
                    self.address,
                    "lladdr",
                    inner_mac,
                    "dev",
                    self.outer,
                    "nud",
                    "permanent",
                ]
            )
            _run(
                [
                    "ip",
                    "-n",
                    ns,
                    "neigh",
                    "replace",
                    self.peer,
                    "lladdr",
                    outer_mac,
                    "dev",
                    self.inner,
                    "nud",
                    "permanent",
                ]
            )
        except RuntimeError:
            self.remove()
            raise
        self._outer_dropping = self._inner_dropping = False
        self._losing = False

    @property
    def _outer_ip(self) -> list[str]:
        """``ip`` in the namespace of the link's outer end."""
        return ["ip"] if self.client is None else ["ip", "-n", self.client.name]

    def route(self, address: str) -> None:
        """From the client host (the outer end's namespace), ``address`` (another of
        the server's) through this link: a broker that advertises one address to every
        client is reached through this link by the client host's threads."""
        if self.client is None:
            raise RuntimeError("only a client host's link routes an address of its own")
        _run([*self._outer_ip, "route", "replace", f"{address}/32", "via", self.address])

    def _drop(self, inner: bool, on: bool) -> None:
        """Start or stop dropping what one end sends (a ``blackhole`` root qdisc)."""
        if (self._inner_dropping if inner else self._outer_dropping) == on:
            return
        if inner:
            where = self.host.exec_argv([])
        else:
            where = [] if self.client is None else self.client.exec_argv([])
        device = self.inner if inner else self.outer
        verb = "add" if on else "del"
        _run([*where, "tc", "qdisc", verb, "dev", device, "root", *(["blackhole"] if on else [])])
        if inner:
            self._inner_dropping = on
        else:
            self._outer_dropping = on

    def silence(self) -> None:
        """The host's replies are dropped; what clients send still arrives."""
        self._drop(inner=True, on=True)
        self._drop(inner=False, on=False)

    def cut(self) -> None:
        """Nothing passes either way (a partition); no reset is sent."""
        self._drop(inner=True, on=True)
        self._drop(inner=False, on=True)

    def lose(self, every: int) -> None:
        """Drop one packet in ``every`` that the link carries, each way (``every=100``:
        1 % loss), evenly spaced so that a short test meets some; the rest pass.
        :meth:`lost` counts the drops; :meth:`heal` ends the loss."""
        if every < 2:
            raise ValueError(f"every must be >= 2, not {every}")
        self._unlose()
        table = self._table
        drop = f"numgen inc mod {every} == 0 counter drop"
        ruleset = (
            f"table inet {table} {{\n"
            f"  chain lossin {{\n    type filter hook input priority 0; policy accept;\n"
            f'    iifname "{self.inner}" {drop}\n  }}\n'
            f"  chain lossout {{\n    type filter hook output priority 0; policy accept;\n"
            f'    oifname "{self.inner}" {drop}\n  }}\n'
            f"}}\n"
        )
        _run(self.host.exec_argv(["nft", "-f", "-"]), stdin=ruleset)
        self._losing = True

    def lost(self) -> int:
        """How many packets :meth:`lose` dropped so far, both ways."""
        if not self._losing:
            return 0
        listing = _run(self.host.exec_argv(["nft", "list", "table", "inet", self._table]))
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", listing))

    @property
    def _table(self) -> str:
        return f"dqloss{self.inner}"

    def _unlose(self) -> None:
        if self._losing:
            _run(self.host.exec_argv(["nft", "delete", "table", "inet", self._table]))
            self._losing = False

    def heal(self) -> None:
        """Everything passes again."""
        self._drop(inner=True, on=False)
        self._drop(inner=False, on=False)
        self._unlose()

    def remove(self) -> None:
        """Delete the pair (deleting one end deletes both)."""
        argv = [*self._outer_ip, "link", "del", self.outer]
        subprocess.run(argv, capture_output=True, check=False)


class ServerHost:
    """A network namespace for one server, and its links (a context manager: leaving
    it removes the namespace and every link)."""

    def __init__(self) -> None:
        global _counter
        _sweep()
        self.name = f"{_PREFIX}{os.getpid()}s{_counter % 100}"
        _counter += 1
        self.links: list[Link] = []
        _run(["ip", "netns", "add", self.name])
        try:
            _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
        except RuntimeError:
            self.close()
            raise

    def link(self, client: ServerHost | None = None) -> Link:
        """A new link from the root namespace (or from ``client``'s) to this host."""
        link = Link(self, len(self.links), client)
        self.links.append(link)
        return link

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the host's namespace (``ip netns exec`` execs it: the
        process's pid is the command's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def close(self) -> None:
        """Remove every link and the namespace."""
        for link in self.links:
            link.remove()
        self.links.clear()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def __enter__(self) -> ServerHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NsRedis:
    """A ``redis-server`` in ``host``'s namespace, listening on every address there
    (port 6379 of its own namespace), its data and log in ``directory``."""

    PORT = 6379

    def __init__(self, host: ServerHost, directory: Path, options: Sequence[str] = ()) -> None:
        self.host = host
        self.directory = directory
        self.options = list(options)
        self.log = directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, link: Link, **params: object) -> str:
        """The URL of this server through ``link`` (``params`` as URL parameters)."""
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"redis://{link.address}:{self.PORT}/0" + (f"?{query}" if query else "")

    def short_url(self, link: Link) -> str:
        """:meth:`url` with the short timeouts the tests use (:data:`READ_TIMEOUT`,
        :data:`CONNECT_TIMEOUT`), so a call on a silent link fails fast."""
        return self.url(link, socket_timeout=READ_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT)

    def start(self, link: Link) -> None:
        """Run the server; return once it answers PING through ``link``."""
        argv = [
            "redis-server",
            *("--port", str(self.PORT), "--bind", "0.0.0.0", "--protected-mode", "no"),
            *("--dir", str(self.directory), "--logfile", str(self.log)),
            *("--save", "", "--appendonly", "no"),
            *self.options,
        ]
        self.process = subprocess.Popen(
            self.host.exec_argv(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_ready(self.process, self.url(link), self.log_tail)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL if it lingers)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class NsPostgres(PrivatePostgres):
    """A private PostgreSQL in ``host``'s namespace, listening on every address there,
    trusting the links' clients; started at once, stopped (by PID) and removed by
    :meth:`stop`. Raises ``PostgresUnavailable`` without the binaries."""

    #: The timeouts of :meth:`short_url`: a connect (libpq's least: 2 s), a request
    #: not acknowledged (ms), the keepalive probes of an idle connection (s), and the
    #: wait for a pooled connection (s).
    SHORT: ClassVar[dict[str, int]] = {
        "connect_timeout": 2,
        "tcp_user_timeout": int(READ_TIMEOUT * 1000),
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 1,
        "pool_timeout": 2,
    }

    def __init__(self, host: ServerHost) -> None:
        self.host = host
        super().__init__(wrap=host.exec_argv([]), listen="*", trust=str(_POOL))

    def url(self, link: Link, **params: object) -> str:
        """The URL of this server through ``link`` (``params`` as URL parameters)."""
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"postgresql://postgres@{link.address}:{self.port}/postgres" + (
            f"?{query}" if query else ""
        )

    def short_url(self, link: Link, **params: object) -> str:
        """:meth:`url` with the short timeouts of :data:`SHORT`, so a call on a silent
        link fails within a few seconds."""
        return self.url(link, **{**self.SHORT, **params})


# -- RabbitMQ (amqp://) in a host's namespace ------------------------------------------


class NsRabbit:
    """A private RabbitMQ node (``backends._rabbitmq_nodes.RabbitNodes``) in ``host``'s
    namespace, listening on every address there, its data and log in ``directory``;
    stopped by PID (the node, then what it left in the namespace: epmd)."""

    def __init__(self, host: ServerHost, directory: Path) -> None:
        self.host = host
        self.nodes = RabbitNodes(directory, 1, netns=host.name)

    @property
    def port(self) -> int:
        return self.nodes.ports[0]

    def url(self, link: Link, **params: object) -> str:
        """The URL of this node through ``link`` (``params`` as URL parameters)."""
        query = "&".join(f"{key}={value}" for key, value in params.items())
        return f"amqp://guest:guest@{link.address}:{self.port}/%2F" + (f"?{query}" if query else "")

    def start(self, link: Link) -> None:
        """Run the node; return once it takes connections through ``link``."""
        self.nodes.host = link.address
        try:
            self.nodes.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the node and what it left in the namespace, by PID."""
        self.nodes.stop()

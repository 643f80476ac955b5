"""URL callbacks, sans-IO: what a callback is, which hosts it may reach, and how its
requests are signed.

A message put with a callback carries it as JSON in its :data:`CALLBACK_HEADER`
header; the dispatcher (:mod:`delayq.server._dispatch`) sends it when it falls due.
Everything here is pure: parsing and validation, the allowlist (checked at put and
again at send time, when the resolved addresses are checked too), and the HMAC
signature that receivers verify with :func:`verify`.

The allowlist (``ServeConfig.callback_hosts``): a pattern is an exact host
(``api.example.com``, ``10.0.0.7``, ``[2001:db8::1]``) or ``*.suffix`` (any host
strictly below ``suffix``), then optionally ``:port`` or ``:*``. Without a port a
pattern allows the default port of the URL's scheme only (80 for http, 443 for
https); ``:port`` allows that port only, ``:*`` every port. A malformed pattern
(``host:abc``) allows nothing. Host names are compared in the ASCII form the HTTP
client connects to: a non-ASCII name is encoded by IDNA 2008 as httpx encodes it
(``api.busineß.com`` is ``api.xn--busine-gta.com``, not Python's IDNA 2003
``api.business.com``), and so are non-ASCII patterns.

Addresses (IP literals, and every address a name resolves to when the request is
sent; a ``%zone`` belongs to an IPv6 link-local literal only, any other text with one
is a name):

* loopback (``localhost`` and the names below it, ``127.0.0.0/8``, ``::1``): allowed
  when, and only when, ``allow_loopback_callbacks`` is set, on any port and without
  being listed (the flag is meant for a receiver on the same machine, typically on a
  port of its own); a ``localhost`` name is never resolved but connected to the
  loopback addresses (:func:`fixed_addresses`);
* link-local (``169.254.0.0/16``, cloud metadata), unspecified and multicast: refused
  unless that very IP literal is listed;
* every other address that is not public: private (``10/8``, ``172.16/12``,
  ``192.168/16``), unique local (``fc00::/7``), shared/CGNAT (``100.64/10``), NAT64
  (``64:ff9b::/96``, ``64:ff9b:1::/48``), reserved (``240/4``), IPv4-compatible IPv6,
  6to4 (``2002::/16``), and whatever else :mod:`ipaddress` does not call global (the
  ranges named here are listed explicitly, so every Python version refuses them alike;
  what ``is_global`` says differs between versions): refused unless
  ``allow_private_callbacks`` is set or that very IP literal is listed;
* an IPv6 address that carries an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4,
  Teredo, NAT64) is refused when that IPv4 address would be, whatever the flags say
  of the IPv6 range.

``allow_private_callbacks`` lifts the address rule only: the host must still match
the allowlist.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias
from urllib.parse import SplitResult, quote, unquote_to_bytes, urlsplit

from ._config import ServeConfig, idna_host, is_loopback_host, split_callback_host
from ._constants import (
    CALLBACK_DEFAULT_TIMEOUT,
    CALLBACK_MAX_HEADER_BYTES,
    CALLBACK_MAX_HEADERS,
    CALLBACK_MAX_TIMEOUT,
    CALLBACK_MAX_URL_LENGTH,
    CALLBACK_SIGNATURE_TOLERANCE,
)

__all__ = [
    "BODILESS_METHODS",
    "CALLBACK_METHODS",
    "ENCODED_PREFIX",
    "Callback",
    "CallbackError",
    "address_refusal",
    "check_host",
    "check_message_id",
    "connection_refusal",
    "fixed_addresses",
    "host_allowed",
    "message_id_from_header",
    "message_id_header",
    "queue_from_header",
    "queue_header",
    "sign",
    "verify",
]

#: The HTTP methods a callback may use.
CALLBACK_METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
#: Those of them sent without a body (the payload must be null).
BODILESS_METHODS = ("GET",)

ErrorCode = Literal["invalid_callback", "callback_host_not_allowed"]

# Headers a callback may not set: hop-by-hop ones, those httpx computes, and ours.
_RESERVED_HEADERS = frozenset(
    (
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
        "host", "content-length", "expect",
    )
)  # fmt: skip
_RESERVED_PREFIX = "x-delayq-"
# RFC 9110 token characters.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # used with fullmatch
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CALLBACK_KEYS = frozenset(("url", "method", "headers", "timeout"))


class CallbackError(ValueError):
    """A callback that cannot be accepted. ``code`` is ``"invalid_callback"`` (bad
    shape or value) or ``"callback_host_not_allowed"`` (the allowlist refuses it)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


def _invalid(message: str) -> CallbackError:
    return CallbackError("invalid_callback", message)


def _refused(message: str) -> CallbackError:
    return CallbackError("callback_host_not_allowed", message)


@dataclass(frozen=True)
class Callback:
    """Where and how a message is delivered when it falls due.

    ``url`` is http(s) without credentials; ``method`` one of
    :data:`CALLBACK_METHODS`; ``headers`` extra request headers (no hop-by-hop
    headers, no ``Host``/``Content-Length``, no ``X-Delayq-*``); ``timeout`` the
    seconds one attempt may take, from resolving the host to the answer's headers.
    Build it with :func:`parse_callback` (which checks the server's limits and its
    allowlist) or :meth:`from_header`.
    """

    url: str
    method: str = "POST"
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = CALLBACK_DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        _check_url(self.url)
        if self.method not in CALLBACK_METHODS:
            raise _invalid(f"callback method must be one of {', '.join(CALLBACK_METHODS)}")
        object.__setattr__(self, "headers", MappingProxyType(_check_headers(self.headers)))
        timeout = self.timeout
        if type(timeout) is bool or not isinstance(timeout, (int, float)):
            raise _invalid(f"callback timeout must be seconds (a number), got {timeout!r:.40}")
        if not (0 < timeout <= CALLBACK_MAX_TIMEOUT) or math.isnan(timeout):
            raise _invalid(f"callback timeout must be > 0 and <= {CALLBACK_MAX_TIMEOUT:g} s")
        object.__setattr__(self, "timeout", float(timeout))

    def to_json(self) -> dict[str, object]:
        """The callback as a JSON object (what the API shows)."""
        return {
            "url": self.url,
            "method": self.method,
            "headers": dict(self.headers),
            "timeout": self.timeout,
        }

    def to_header(self) -> str:
        """The value of the message header that carries this callback."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_header(cls, text: str) -> Callback:
        """The callback stored by :meth:`to_header`; :class:`CallbackError` when
        ``text`` is not one. The allowlist is not checked here (see :func:`check_host`)."""
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise _invalid(f"callback header is not JSON: {exc}") from None
        return _from_mapping(raw, default_timeout=None)


def parse_callback(raw: object, config: ServeConfig, *, with_body: bool = False) -> Callback:
    """Validate a callback given to the API: ``{"url": ..., "method": "POST",
    "headers": {...}, "timeout": seconds}`` (only ``url`` required) or a URL string,
    for a message whose payload makes a request body (``with_body``) or not (a null
    payload, empty bytes).

    The timeout defaults to ``config.callback_timeout``, which is also its upper
    bound. Header values must be ASCII (HTTP clients and servers read other bytes as
    Latin-1, so ``café`` would arrive as ``cafÃ©``), and a GET, which is sent without
    a body, takes no payload. Raises :class:`CallbackError` (``invalid_callback`` or
    ``callback_host_not_allowed``) and does no I/O.
    """
    if isinstance(raw, str):
        raw = {"url": raw}
    callback = _from_mapping(raw, default_timeout=config.callback_timeout)
    if callback.timeout > config.callback_timeout:
        raise _invalid(
            f"callback timeout must be <= {config.callback_timeout:g} s (the server's limit)"
        )
    for name, value in callback.headers.items():
        at = next((i for i, ch in enumerate(value) if not ch.isascii()), None)
        if at is not None:
            raise _invalid(
                f"callback header {name!r} must have an ASCII value, got {value[at]!r} at "
                f"{at}: a receiver would read other text garbled (percent-encode it, or "
                "put it in the payload)"
            )
    if with_body and callback.method in BODILESS_METHODS:
        raise _invalid(
            f"callback method {callback.method} is sent without a body, so the payload "
            "must be null: put what the receiver needs in the URL, or use POST"
        )
    check_host(callback.url, config)
    return callback


def _from_mapping(raw: object, *, default_timeout: float | None) -> Callback:
    if not isinstance(raw, Mapping):
        raise _invalid(f"callback must be an object with a url, not {type(raw).__name__}")
    unknown = set(raw) - _CALLBACK_KEYS
    if unknown:
        shown = ", ".join(sorted(map(str, unknown)))
        known = ", ".join(sorted(_CALLBACK_KEYS))
        raise _invalid(f"callback has unknown keys: {shown:.200} (known: {known})")
    if "url" not in raw:
        raise _invalid("callback needs a url")
    method = raw.get("method", "POST")
    if not isinstance(method, str):
        raise _invalid(f"callback method must be a string, not {type(method).__name__}")
    headers = raw.get("headers")
    timeout = raw.get("timeout")
    if timeout is None:
        timeout = CALLBACK_DEFAULT_TIMEOUT if default_timeout is None else default_timeout
    return Callback(
        url=raw["url"],
        method=method.upper(),
        headers={} if headers is None else headers,
        timeout=timeout,
    )


def _check_url(url: object) -> SplitResult:
    if not isinstance(url, str):
        raise _invalid(f"callback url must be a string, not {type(url).__name__}")
    if not url or len(url) > CALLBACK_MAX_URL_LENGTH:
        raise _invalid(f"callback url must be 1 to {CALLBACK_MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise _invalid("callback url must not contain spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in _DEFAULT_PORTS:
        raise _invalid(f"callback url must be http:// or https://, got {url!r:.100}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise _invalid("callback url must not carry credentials (user:password@)")
    if not parts.hostname:
        raise _invalid(f"callback url has no host: {url!r:.100}")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise _invalid(f"callback url has a bad port: {url!r:.100}") from None
    _ascii_host(parts.hostname)
    return parts


def _check_headers(headers: object) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        raise _invalid(f"callback headers must be an object, not {type(headers).__name__}")
    if len(headers) > CALLBACK_MAX_HEADERS:
        raise _invalid(f"callback may set at most {CALLBACK_MAX_HEADERS} headers")
    checked: dict[str, str] = {}
    size = 0
    seen: set[str] = set()
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise _invalid(f"callback headers must map strings to strings, got {name!r:.60}")
        if not _TOKEN.fullmatch(name):
            raise _invalid(f"callback header name {name!r:.60} is not a valid header name")
        lowered = name.lower()
        if lowered in _RESERVED_HEADERS or lowered.startswith(_RESERVED_PREFIX):
            raise _invalid(f"callback may not set the {name!r} header")
        if lowered in seen:
            raise _invalid(f"callback header {name!r} is given twice")
        seen.add(lowered)
        if any((ord(ch) < 32 and ch != "\t") or ord(ch) == 127 for ch in value):
            raise _invalid(f"callback header {name!r} has control characters in its value")
        size += len(name.encode()) + len(value.encode())
        checked[name] = value
    if size > CALLBACK_MAX_HEADER_BYTES:
        raise _invalid(
            f"callback headers are {size} bytes, the limit is {CALLBACK_MAX_HEADER_BYTES}"
        )
    return checked


# -- the allowlist ------------------------------------------------------------------------


def _ascii_host(host: str) -> str:
    """``host`` lowercased, without brackets or a trailing dot, IDNA-encoded as the
    HTTP client encodes it."""
    name = host.strip("[]").lower().rstrip(".")
    try:
        return idna_host(name)
    except UnicodeError:  # idna.IDNAError is one
        raise _invalid(f"callback host {host!r:.100} is not a valid host name") from None


_Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


# What a zone (``%eth0``) of an IPv6 link-local literal may be: an interface name or
# index. A zone anywhere else is not an address: ``93.184.216.34%.attacker.example``
# is a name, and would be resolved through DNS.
_ZONE = re.compile(r"[0-9A-Za-z_-]{1,15}")  # used with fullmatch


def _ip(host: str) -> _Address | None:
    text, zoned, zone = host.partition("%")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if zoned and not (address.version == 6 and address.is_link_local and _ZONE.fullmatch(zone)):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _pattern_matches(pattern: str, host: str, port: int, default_ports: tuple[int, ...]) -> bool:
    """True if ``pattern`` allows ``host`` (normalized) on ``port``; a pattern without
    a port allows ``default_ports`` only."""
    split = split_callback_host(pattern)
    if split is None:
        return False
    want_host, want_port = split
    if want_port is None:
        if port not in default_ports:
            return False
    elif want_port not in ("*", port):
        return False
    if want_host.startswith("*."):
        return host.endswith(want_host[1:])
    wanted_ip = _ip(want_host)
    if wanted_ip is not None:
        return wanted_ip == _ip(host)
    return want_host == host


def _listed_ip(address: _Address, config: ServeConfig) -> bool:
    for pattern in config.callback_hosts:
        split = split_callback_host(pattern)
        if split is not None and _ip(split[0]) == address:
            return True
    return False


# Addresses that are not public, refused unless --allow-private-callbacks or listed,
# by the name a refusal gives them; the rest of what ipaddress does not call global
# (it differs between Python versions, hence the explicit ranges) is refused too.
_NON_PUBLIC = tuple(
    (ipaddress.ip_network(network), kind)
    for network, kind in (
        ("10.0.0.0/8", "private"),
        ("172.16.0.0/12", "private"),
        ("192.168.0.0/16", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("0.0.0.0/8", "'this network'"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("240.0.0.0/4", "reserved"),
        ("fc00::/7", "unique local"),
        ("fec0::/10", "site-local"),
        ("64:ff9b::/96", "NAT64"),
        ("64:ff9b:1::/48", "NAT64 (local use)"),
        ("::/96", "IPv4-compatible IPv6"),
        ("2002::/16", "6to4"),
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for or leads to: 6to4, Teredo (the
    client), NAT64 (well-known prefix) and IPv4-compatible (IPv4-mapped ones are
    made IPv4 by :func:`_ip` already)."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _V4_COMPATIBLE and int(ip) > 1):  # not :: or ::1
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _non_public(ip: _Address) -> str | None:
    """What kind of non-public address ``ip`` is (None: a public one)."""
    for network, kind in _NON_PUBLIC:
        if ip in network:
            return kind
    if not ip.is_global or ip.is_reserved:
        return "non-global"
    return None


def _ip_refusal(ip: _Address, config: ServeConfig) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        reason = None if embedded is None else _ip_refusal(embedded, config)
        if reason is not None:
            return f"{ip} embeds {embedded}: {reason}"
    if ip.is_loopback:
        if config.allow_loopback_callbacks:
            return None
        return f"{ip} is a loopback address (allowed only with --allow-loopback-callbacks)"
    special = (
        "link-local" if ip.is_link_local
        else "unspecified" if ip.is_unspecified
        else "multicast" if ip.is_multicast
        else None
    )  # fmt: skip
    if special is not None:
        if _listed_ip(ip, config):
            return None
        return f"{ip} is a {special} address (allowed only when that IP is listed)"
    kind = _non_public(ip)
    if kind is None or config.allow_private_callbacks or _listed_ip(ip, config):
        return None
    return (
        f"{ip} is a {kind} address (allowed only with --allow-private-callbacks, "
        "or when that IP is listed)"
    )


def address_refusal(address: str, config: ServeConfig) -> str | None:
    """Why a connection to the IP ``address`` is refused under ``config`` (None: it
    is allowed). The dispatcher checks every address a callback host resolves to."""
    ip = _ip(address)
    if ip is None:
        return f"{address!r} is not an IP address"
    return _ip_refusal(ip, config)


def _target_refusal(
    host: str, port: int, default_ports: tuple[int, ...], config: ServeConfig
) -> str | None:
    """Why ``host`` (normalized by :func:`_ascii_host`) on ``port`` is refused, a
    pattern without a port allowing ``default_ports``; None: allowed."""
    literal = _ip(host)
    if is_loopback_host(host) or (literal is not None and literal.is_loopback):
        if config.allow_loopback_callbacks:
            return None
        return (
            f"callback host {host!r} is loopback: the server allows it only with "
            "--allow-loopback-callbacks"
        )
    if not any(_pattern_matches(p, host, port, default_ports) for p in config.callback_hosts):
        allowed = ", ".join(config.callback_hosts) or "none configured"
        return (
            f"callback host {host}:{port} is not in the server's allowlist ({allowed:.200}); "
            "add it with --allow-callback-host (a pattern without a port allows the "
            "default port only: add :PORT or :*)"
        )
    reason = None if literal is None else address_refusal(host, config)
    return None if reason is None else f"callback host refused: {reason}"


def check_host(url: str, config: ServeConfig) -> None:
    """Raise :class:`CallbackError` unless ``url``'s host may be called under
    ``config`` (see the module's docstring for the rules). Does no DNS lookup."""
    parts = _check_url(url)
    host = _ascii_host(parts.hostname or "")
    default_port = _DEFAULT_PORTS[parts.scheme.lower()]
    reason = _target_refusal(host, parts.port or default_port, (default_port,), config)
    if reason is not None:
        raise _refused(reason)


def connection_refusal(host: str, port: int, config: ServeConfig) -> str | None:
    """Why a TCP connection to ``host``:``port`` is refused under ``config`` (None: it
    is allowed), ``host`` being what the HTTP client connects to (an ASCII name or an
    IP literal), checked before it is resolved: the rules of :func:`check_host`,
    except that a pattern without a port allows both 80 and 443 (the scheme is not
    known here; :func:`check_host`, at put and at send, holds it to the scheme's own).
    A non-ASCII name is refused: resolving it would encode it by IDNA 2003. The
    addresses a name resolves to are then checked with :func:`address_refusal`."""
    if not host.isascii():
        return f"callback host {host!r:.100} is not ASCII (IDNA-encode it first)"
    try:
        name = _ascii_host(host)
    except CallbackError as exc:
        return exc.message
    return _target_refusal(name, port, tuple(_DEFAULT_PORTS.values()), config)


#: The addresses a ``localhost`` name connects to, in the order tried.
LOOPBACK_ADDRESSES = ("127.0.0.1", "::1")


def fixed_addresses(host: str) -> tuple[str, ...] | None:
    """The addresses a connection to ``host`` goes to without asking a resolver: an IP
    literal's own, and the loopback addresses for ``localhost`` and every name below
    it (RFC 6761 6.3: such names are loopback and never sent to DNS, which could
    answer a public address for ``evil.localhost``); None for any other name."""
    literal = _ip(host)
    if literal is not None:
        return (host,)
    if is_loopback_host(host):
        return LOOPBACK_ADDRESSES
    return None


def host_allowed(url: str, config: ServeConfig) -> bool:
    """True if :func:`check_host` accepts ``url`` (False also for a malformed url)."""
    try:
        check_host(url, config)
    except CallbackError:
        return False
    return True


# -- signing ------------------------------------------------------------------------------

# What an HTTP header carries unchanged: printable ASCII, no space at either end (a
# receiver's parser strips those).
_HEADER_SAFE = re.compile(r"[!-~](?:[ -~]*[!-~])?")  # used with fullmatch


def check_message_id(message_id: str) -> str:
    """``message_id`` if it is a value of ``X-Delayq-Message-Id`` as sent (and so
    what v2 signs): printable ASCII without a space at either end; else
    ``ValueError``. :func:`message_id_header` makes such a value of any id."""
    if not isinstance(message_id, str) or not _HEADER_SAFE.fullmatch(message_id):
        raise ValueError(
            f"message id {message_id!r:.80} is not a value of the X-Delayq-Message-Id "
            "header: it must be printable ASCII without a space at either end "
            "(message_id_header encodes any id)"
        )
    return message_id


#: What starts an encoded ``X-Delayq-Message-Id`` or ``X-Delayq-Queue`` (as in an
#: RFC 8187 ext-value).
ENCODED_PREFIX = "UTF-8''"
# RFC 8187 attr-char, less the letters and digits (kept by quote in any case).
_ATTR_CHARS = "!#$&+-.^_`|~"
_ENCODED = re.compile(r"(?:[0-9A-Za-z!#$&+\-.^_`|~]|%[0-9A-Fa-f]{2})*")  # used with fullmatch


def _text_header(text: str, what: str, header: str) -> str:
    """The value of ``header`` that carries ``text`` (a ``what``): ``text`` itself when
    a header carries it unchanged (printable ASCII, no space at either end, not
    starting with ``UTF-8''``), else ``UTF-8''`` and its UTF-8 bytes percent-encoded
    (every byte but RFC 8187's attr-chars), so that any text can be sent and two texts
    never share a value. ``ValueError`` for a str that is not Unicode text."""
    if not isinstance(text, str):
        raise ValueError(f"a {what} is a str, not {type(text).__name__}")
    if _HEADER_SAFE.fullmatch(text) and not text.startswith(ENCODED_PREFIX):
        return text
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {text!r:.80} is not Unicode text (it holds a lone surrogate), so "
            f"the {header} header cannot carry it"
        ) from None
    return ENCODED_PREFIX + quote(data, safe=_ATTR_CHARS)


def _text_from_header(value: str, what: str) -> str:
    """The text that ``value`` (made by :func:`_text_header`) stands for."""
    if not value.startswith(ENCODED_PREFIX):
        return value
    encoded = value[len(ENCODED_PREFIX) :]
    if not _ENCODED.fullmatch(encoded):
        raise ValueError(f"not a percent-encoded {what}: {value!r:.80}")
    try:
        return unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"not a percent-encoded {what} (not UTF-8): {value!r:.80}") from None


def message_id_header(message_id: str) -> str:
    """The ``X-Delayq-Message-Id`` value of ``message_id``: the id itself when a
    header carries it unchanged, else ``UTF-8''`` and its percent-encoded UTF-8
    bytes (:func:`_text_header`), so that every id can be sent and two ids never share
    a value. ``ValueError`` for a str that is not Unicode text (a lone surrogate)."""
    return _text_header(message_id, "message id", "X-Delayq-Message-Id")


def message_id_from_header(value: str) -> str:
    """The message id that ``value`` (an ``X-Delayq-Message-Id`` header) stands for:
    the inverse of :func:`message_id_header`. ``ValueError`` when an encoded value
    is not percent-encoded UTF-8."""
    return _text_from_header(value, "message id")


def queue_header(queue: str) -> str:
    """The ``X-Delayq-Queue`` value of the queue name ``queue``, encoded as
    :func:`message_id_header` encodes an id (``wébhooks`` is
    ``UTF-8''w%C3%A9bhooks``)."""
    return _text_header(queue, "queue name", "X-Delayq-Queue")


def queue_from_header(value: str) -> str:
    """The queue name that ``value`` (an ``X-Delayq-Queue`` header) stands for: the
    inverse of :func:`queue_header`. ``ValueError`` when an encoded value is not
    percent-encoded UTF-8."""
    return _text_from_header(value, "queue name")


# A timestamp a header may carry: ASCII digits, few enough that int() takes them and
# the result compares with a float (400 digits overflowed it, 5,000 int() refused).
_TIMESTAMP = re.compile(r"[0-9]{1,15}")  # used with fullmatch


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _digest_v2(secret: str, timestamp: int, request: tuple[str, str, str], body: bytes) -> str:
    method, url, message_id = request
    message = f"{timestamp}\n{method}\n{url}\n{message_id}\n".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _digest_v3(
    secret: str,
    timestamp: int,
    request: tuple[str, str, str],
    delivery: tuple[str, str, str],
    body: bytes,
) -> str:
    # The leading "v3" line keeps a v3 text from ever equalling a v2 one (those start
    # with the timestamp), so no v2 signature passes for a v3 entry.
    lines = ("v3", str(timestamp), *request, *delivery)
    message = "".join(f"{line}\n" for line in lines).encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _request_of(
    method: str | None, url: str | None, message_id: str | None
) -> tuple[str, str, str] | None:
    """``(method, url, message_id)`` checked for v2, or None when none is given.
    ``ValueError`` when only some are given or one could make the signed text
    ambiguous (a newline in it)."""
    if method is None and url is None and message_id is None:
        return None
    if method is None or url is None or message_id is None:
        raise ValueError("method, url and message_id go together (they make the v2 signature)")
    if not isinstance(method, str) or not _TOKEN.fullmatch(method):
        raise ValueError(f"method must be an HTTP method such as POST, got {method!r:.40}")
    if not isinstance(url, str) or not url or not _HEADER_SAFE.fullmatch(url) or " " in url:
        raise ValueError(f"url must be the URL as sent (printable ASCII, no spaces): {url!r:.100}")
    return method, url, check_message_id(message_id)


# A header value as a receiver reads it: printable ASCII, tabs and spaces inside only
# (a parser strips them at either end).
_FIELD_VALUE = re.compile(r"[!-~](?:[ \t!-~]*[!-~])?")  # used with fullmatch


def _delivery_of(
    request: tuple[str, str, str] | None,
    queue: str | None,
    attempt: str | int | None,
    content_type: str | None,
) -> tuple[str, str, str] | None:
    """``(queue, attempt, content_type)`` checked for v3, or None when none is given.
    ``ValueError`` when only some are given, without the v2 three, or when one is not
    a header value as received (``content_type`` may be ``""``: no such header)."""
    if queue is None and attempt is None and content_type is None:
        return None
    if queue is None or attempt is None or content_type is None or request is None:
        raise ValueError(
            "queue, attempt and content_type go together, with method, url and message_id "
            "(they make the v3 signature)"
        )
    if type(attempt) is int and attempt >= 0:
        attempt = str(attempt)
    if not isinstance(attempt, str) or not attempt.isascii() or not attempt.isdigit():
        raise ValueError(f"attempt must be the X-Delayq-Attempt header (digits): {attempt!r:.40}")
    if not isinstance(queue, str) or not _FIELD_VALUE.fullmatch(queue):
        raise ValueError(f"queue must be the X-Delayq-Queue header as sent: {queue!r:.100}")
    if not isinstance(content_type, str) or not (
        content_type == "" or _FIELD_VALUE.fullmatch(content_type)
    ):
        raise ValueError(
            f"content_type must be the Content-Type header as sent, or '' for none: "
            f"{content_type!r:.100}"
        )
    return queue, attempt, content_type


def sign(
    secret: str,
    timestamp: int,
    body: bytes,
    *,
    method: str | None = None,
    url: str | None = None,
    message_id: str | None = None,
    queue: str | None = None,
    attempt: str | int | None = None,
    content_type: str | None = None,
) -> str:
    """The signature header value of a request.

    ``t=<unix seconds>,v1=<hex>``: ``<hex>`` is HMAC-SHA256, keyed by ``secret``, of
    ``b"<t>." + body``. Given the request's ``method``, ``url`` and ``message_id``
    (all three), ``,v2=<hex>`` follows: HMAC-SHA256, keyed by ``secret``, of
    ``f"{t}\\n{method}\\n{url}\\n{message_id}\\n".encode() + body``, i.e. four lines,
    each ended by a newline (none can hold one: they are checked), then the raw
    body. ``url`` is the URL as sent: the scheme, ``://``, the ``Host`` header, then
    the request target (path and query as on the request line); ``message_id`` the
    ``X-Delayq-Message-Id`` header as sent (:func:`message_id_header` of the id:
    the id itself, or its encoded form for an id a header cannot carry).

    Given also ``queue``, ``attempt`` and ``content_type`` (the ``X-Delayq-Queue``,
    ``X-Delayq-Attempt`` and ``Content-Type`` headers as sent: :func:`queue_header`
    of the queue name, ``""`` for a request without ``Content-Type``), ``,v3=<hex>``
    follows: HMAC-SHA256 of eight lines, ``v3``, then ``t``, ``method``, ``url``,
    ``message_id``, ``queue``, ``attempt``, ``content_type``, each ended by a newline,
    then the raw body. The dispatcher sends v1, v2 and v3 together, so receivers
    written for v1 or v2 still verify.
    """
    if not isinstance(secret, str) or not secret:
        raise ValueError("the signing secret must be a non-empty str")
    if type(timestamp) is not int or timestamp < 0:
        raise ValueError(f"timestamp must be unix seconds (an int >= 0), got {timestamp!r}")
    request = _request_of(method, url, message_id)
    delivery = _delivery_of(request, queue, attempt, content_type)
    data = bytes(body)
    header = f"t={timestamp},v1={_digest(secret, timestamp, data)}"
    if request is not None:
        header += f",v2={_digest_v2(secret, timestamp, request, data)}"
    if request is not None and delivery is not None:
        header += f",v3={_digest_v3(secret, timestamp, request, delivery, data)}"
    return header


def verify(
    secret: str,
    header_value: str,
    body: bytes,
    *,
    tolerance: float = CALLBACK_SIGNATURE_TOLERANCE,
    now: float | None = None,
    method: str | None = None,
    url: str | None = None,
    message_id: str | None = None,
    queue: str | None = None,
    attempt: str | int | None = None,
    content_type: str | None = None,
    accept_v2: bool = False,
) -> bool:
    """True if ``header_value`` (from :data:`CALLBACK_SIGNATURE_HEADER`) signs this
    request with ``secret`` and its timestamp is within ``tolerance`` seconds of
    ``now`` (default: the current time).

    Which entry must match depends on what is given (as :func:`sign` describes them):

    * ``method``, ``url``, ``message_id``, ``queue``, ``attempt`` and
      ``content_type`` (the headers as received; ``""`` when there is no
      ``Content-Type``): a ``v3=`` entry, so that none of those headers can be
      changed; with ``accept_v2`` (a receiver that servers from before v3 still
      call), a header with no ``v3=`` entry passes on its ``v2=`` entry, which
      covers neither queue, attempt nor content type;
    * ``method``, ``url`` and ``message_id`` only: a ``v2=`` entry, so a header
      stripped of its v2 does not pass for another request;
    * none of them: a ``v1=`` entry (``body`` only, as before v2).

    Several entries of a kind are allowed (e.g. while a secret is rotated); the
    comparison takes constant time. Whatever ``header_value`` holds, the answer is
    True or False (a timestamp of more than 15 digits is not one), never an
    exception. ``ValueError`` if only some of the v2 three, or of the v3 three, are
    given, or ``accept_v2`` without the v3 three."""
    try:
        request = _request_of(method, url, message_id)
        delivery = _delivery_of(request, queue, attempt, content_type)
    except ValueError:
        v2_given = _given(method, url, message_id)
        v3_given = _given(queue, attempt, content_type)
        if v2_given is None or v3_given is None or (v3_given and not v2_given):
            raise  # called wrongly
        return False  # a value no signature covers
    if accept_v2 and delivery is None:
        raise ValueError("accept_v2 goes with the request's queue, attempt and content_type")
    if not isinstance(secret, str) or not secret or not isinstance(header_value, str):
        return False
    timestamp: int | None = None
    entries: dict[str, list[str]] = {"v1": [], "v2": [], "v3": []}
    for part in header_value.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and timestamp is None and _TIMESTAMP.fullmatch(value):
            timestamp = int(value)
        elif key in entries and value:
            entries[key].append(value)
    if request is None:
        scheme = "v1"
    elif delivery is not None and (entries["v3"] or not accept_v2):
        scheme = "v3"
    else:
        scheme = "v2"
    candidates = entries[scheme]
    if timestamp is None or not candidates:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return False
    data = bytes(body)
    if request is None:
        expected = _digest(secret, timestamp, data)
    elif scheme == "v2" or delivery is None:
        expected = _digest_v2(secret, timestamp, request, data)
    else:
        expected = _digest_v3(secret, timestamp, request, delivery, data)
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected.encode(), candidate.encode("ascii", "replace"))
    return matched


def _given(*values: object) -> bool | None:
    """True when all ``values`` are given (not None), False when none is, None when
    some are."""
    given = {value is not None for value in values}
    return given.pop() if len(given) == 1 else None

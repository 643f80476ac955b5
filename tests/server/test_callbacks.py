"""Unit tests of URL callbacks without I/O: parsing, the host allowlist, signing."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq.server import queue_from_header as public_queue_from_header
from delayq.server import verify as public_verify
from delayq.server._callbacks import (
    Callback,
    CallbackError,
    address_refusal,
    connection_refusal,
    host_allowed,
    message_id_from_header,
    message_id_header,
    parse_callback,
    queue_from_header,
    queue_header,
    sign,
    verify,
)
from delayq.server._config import ServeConfig
from delayq.server._constants import (
    CALLBACK_MAX_HEADER_BYTES,
    CALLBACK_MAX_HEADERS,
    CALLBACK_MAX_TIMEOUT,
    CALLBACK_MAX_URL_LENGTH,
)


def config(
    *hosts: str, loopback: bool = False, private: bool = False, timeout: float = 10.0
) -> ServeConfig:
    return ServeConfig(
        url="memory://callbacks-unit",
        callback_hosts=hosts,
        allow_loopback_callbacks=loopback,
        allow_private_callbacks=private,
        callback_timeout=timeout,
    )


ALLOW_EXAMPLE = config("api.example.com", "*.hooks.example.org", "pinned.example.net:8443")


# -- parse_callback --------------------------------------------------------------------


def test_parse_fills_defaults() -> None:
    cb = parse_callback({"url": "https://api.example.com/hook"}, ALLOW_EXAMPLE)
    assert cb == Callback("https://api.example.com/hook", "POST", {}, 10.0)


def test_parse_takes_a_bare_url_and_every_field() -> None:
    assert parse_callback("https://api.example.com/x", ALLOW_EXAMPLE).url.endswith("/x")
    cb = parse_callback(
        {
            "url": "https://a.hooks.example.org/h?k=1",
            "method": "put",
            "headers": {"Authorization": "Bearer abc", "X-Trace": "1"},
            "timeout": 2.5,
        },
        ALLOW_EXAMPLE,
    )
    assert (cb.method, cb.timeout) == ("PUT", 2.5)
    assert dict(cb.headers) == {"Authorization": "Bearer abc", "X-Trace": "1"}


def test_header_round_trip() -> None:
    cb = parse_callback(
        {
            "url": "https://api.example.com/ü",
            "method": "PATCH",
            "headers": {"A": "caf%C3%A9"},
            "timeout": 3,
        },
        ALLOW_EXAMPLE,
    )
    again = Callback.from_header(cb.to_header())
    assert again == cb
    assert json.loads(cb.to_header())["method"] == "PATCH"
    # One stored by an earlier version, whose put took any header value, still reads.
    stored = Callback("https://api.example.com/", headers={"A": "é"})
    assert Callback.from_header(stored.to_header()) == stored


@pytest.mark.parametrize(
    ("value", "shown"),
    [("café ✓", "'é' at 3"), ("✓", "'✓' at 0"), ("a\u00a0b", "'\\xa0' at 1"), ("😀", "at 0")],
)
def test_parse_refuses_a_header_value_that_is_not_ascii(value: str, shown: str) -> None:
    """Issue 35, point 7: such a value went out as UTF-8 bytes, which receivers read
    as Latin-1 (``café ✓`` arrived as ``cafÃ© â\x9c\x93``)."""
    raw = {"url": "https://api.example.com/", "headers": {"X-Note": value}}
    with pytest.raises(CallbackError) as info:
        parse_callback(raw, ALLOW_EXAMPLE)
    assert info.value.code == "invalid_callback"
    assert info.value.message.startswith("callback header 'X-Note' must have an ASCII value")
    assert shown in info.value.message
    assert "percent-encode" in info.value.message
    ok = {"X-Note": "caf%C3%A9 \t~", "Authorization": "Bearer abc"}
    assert dict(parse_callback({**raw, "headers": ok}, ALLOW_EXAMPLE).headers) == ok


def test_parse_refuses_a_payload_with_a_method_sent_without_a_body() -> None:
    """Issue 35, point 8: a GET is sent without a body; a put with a payload is told."""
    for method in ("GET", "get"):
        raw = {"url": "https://api.example.com/", "method": method}
        with pytest.raises(CallbackError) as info:
            parse_callback(raw, ALLOW_EXAMPLE, with_body=True)
        assert info.value.code == "invalid_callback"
        assert info.value.message.startswith("callback method GET is sent without a body")
        assert "payload must be null" in info.value.message
        assert parse_callback(raw, ALLOW_EXAMPLE).method == "GET"
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        raw = {"url": "https://api.example.com/", "method": method}
        assert parse_callback(raw, ALLOW_EXAMPLE, with_body=True).method == method


def test_callback_is_frozen_and_its_headers_read_only() -> None:
    cb = Callback("https://api.example.com/", headers={"A": "1"})
    with pytest.raises(AttributeError):
        cb.url = "https://evil.example/"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cb.headers["B"] = "2"  # type: ignore[index]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (None, "must be an object"),
        (42, "must be an object"),
        ({}, "needs a url"),
        ({"url": "https://api.example.com/", "retries": 3}, "unknown keys"),
        ({"url": 5}, "must be a string"),
        ({"url": ""}, "1 to"),
        ({"url": "https://api.example.com/" + "a" * 3000}, "1 to"),
        ({"url": "ftp://api.example.com/"}, "http:// or https://"),
        ({"url": "file:///etc/passwd"}, "http:// or https://"),
        ({"url": "api.example.com/hook"}, "http:// or https://"),
        ({"url": "https://user:pw@api.example.com/"}, "credentials"),
        ({"url": "https://user@api.example.com/"}, "credentials"),
        ({"url": "https:///nohost"}, "no host"),
        ({"url": "https://api.example.com:99999/"}, "bad port"),
        ({"url": "https://api.example.com/a b"}, "spaces or control"),
        ({"url": "https://api.example.com/\r\nX: y"}, "spaces or control"),
        ({"url": "https://api.example.com/", "method": "TRACE"}, "method must be one of"),
        ({"url": "https://api.example.com/", "method": 1}, "method must be a string"),
        ({"url": "https://api.example.com/", "headers": []}, "headers must be an object"),
        ({"url": "https://api.example.com/", "headers": {"A": 1}}, "strings to strings"),
        ({"url": "https://api.example.com/", "headers": {"Bad Name": "x"}}, "valid header"),
        ({"url": "https://api.example.com/", "headers": {"Name\n": "x"}}, "valid header"),
        ({"url": "https://api.example.com/", "headers": {"A": "x\r\nB: y"}}, "control"),
        ({"url": "https://api.example.com/", "headers": {"Host": "evil"}}, "may not set"),
        ({"url": "https://api.example.com/", "headers": {"content-length": "1"}}, "may not set"),
        ({"url": "https://api.example.com/", "headers": {"Connection": "close"}}, "may not set"),
        ({"url": "https://api.example.com/", "headers": {"Transfer-Encoding": "x"}}, "may not"),
        ({"url": "https://api.example.com/", "headers": {"X-Delayq-Signature": "t=1"}}, "may not"),
        ({"url": "https://api.example.com/", "headers": {"a": "1", "A": "2"}}, "twice"),
        ({"url": "https://api.example.com/", "headers": {"A": "x" * 9000}}, "bytes, the limit"),
        ({"url": "https://api.example.com/", "timeout": 0}, "timeout must be > 0"),
        ({"url": "https://api.example.com/", "timeout": -1}, "timeout must be > 0"),
        ({"url": "https://api.example.com/", "timeout": float("nan")}, "timeout must be > 0"),
        ({"url": "https://api.example.com/", "timeout": float("inf")}, "timeout must be > 0"),
        ({"url": "https://api.example.com/", "timeout": True}, "must be seconds"),
        ({"url": "https://api.example.com/", "timeout": "10s"}, "must be seconds"),
        ({"url": "https://api.example.com/", "timeout": 11}, "server's limit"),
    ],
)
def test_parse_refuses_invalid(raw: Any, fragment: str) -> None:
    with pytest.raises(CallbackError) as info:
        parse_callback(raw, ALLOW_EXAMPLE)
    assert info.value.code == "invalid_callback"
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_too_many_headers() -> None:
    headers = {f"H{i}": "v" for i in range(CALLBACK_MAX_HEADERS + 1)}
    with pytest.raises(CallbackError, match="at most"):
        parse_callback({"url": "https://api.example.com/", "headers": headers}, ALLOW_EXAMPLE)


def test_timeout_limit_follows_the_config() -> None:
    roomy = config("api.example.com", timeout=60)
    assert parse_callback({"url": "https://api.example.com/", "timeout": 60}, roomy).timeout == 60
    assert parse_callback("https://api.example.com/", roomy).timeout == 60
    with pytest.raises(CallbackError, match="<= 300"):
        Callback("https://api.example.com/", timeout=CALLBACK_MAX_TIMEOUT + 1)


@pytest.mark.parametrize("text", ["", "not json", "[1]", '{"method": "POST"}', '"https://x"'])
def test_from_header_refuses_garbage(text: str) -> None:
    with pytest.raises(CallbackError) as info:
        Callback.from_header(text)
    assert info.value.code == "invalid_callback"


# -- the allowlist ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/hook",
        "http://API.Example.COM./hook",
        "https://a.hooks.example.org/",
        "https://deep.a.hooks.example.org/",
        "https://pinned.example.net:8443/",
    ],
)
def test_allowed_hosts(url: str) -> None:
    assert host_allowed(url, ALLOW_EXAMPLE)
    assert parse_callback(url, ALLOW_EXAMPLE).url == url


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.example.com/",  # not listed
        "https://api.example.com.evil.net/",  # suffix trick
        "https://hooks.example.org/",  # the wildcard needs a label below
        "https://xhooks.example.org/",  # not below the suffix
        "https://pinned.example.net/",  # port 443, the pattern pins 8443
        "https://pinned.example.net:8444/",
        "http://10.0.0.7/",  # IP not listed
        "https://api.example.com:9000/",  # a pattern without a port: the default one only
        "http://api.example.com:443/",  # the default port of https, not of http
        "https://a.hooks.example.org:8443/",
    ],
)
def test_refused_hosts(url: str) -> None:
    assert not host_allowed(url, ALLOW_EXAMPLE)
    with pytest.raises(CallbackError) as info:
        parse_callback(url, ALLOW_EXAMPLE)
    assert info.value.code == "callback_host_not_allowed"
    assert "allowlist" in info.value.message


def test_no_host_is_allowed_by_default() -> None:
    assert not host_allowed("https://api.example.com/", config())


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8000/",
        "http://LOCALHOST./",
        "http://app.localhost/",
        "http://127.0.0.1:9000/",
        "http://127.1.2.3/",
        "http://[::1]:9000/",
        "http://[::ffff:127.0.0.1]/",
    ],
)
def test_loopback_needs_the_flag(url: str) -> None:
    listed = config("localhost", "127.0.0.1", "::1")
    with pytest.raises(CallbackError) as info:
        parse_callback(url, listed)
    assert info.value.code == "callback_host_not_allowed"
    assert "--allow-loopback-callbacks" in info.value.message
    assert host_allowed(url, config(loopback=True))


@pytest.mark.parametrize(
    ("url", "ip"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),  # cloud metadata
        ("http://[fe80::1]/", "fe80::1"),
        ("http://0.0.0.0:8080/", "0.0.0.0"),
        ("http://[::]/", "::"),
        ("http://224.0.0.1/", "224.0.0.1"),
        ("http://[ff02::1]/", "ff02::1"),
    ],
)
def test_special_addresses_refused_unless_that_ip_is_listed(url: str, ip: str) -> None:
    wildcard = config("*.example.com", "10.0.0.7", loopback=True)
    with pytest.raises(CallbackError) as info:
        parse_callback(url, wildcard)
    assert info.value.code == "callback_host_not_allowed"
    assert host_allowed(url, config(f"[{ip}]:*" if ":" in ip else f"{ip}:*"))


def test_ip_and_ipv6_patterns() -> None:
    cfg = config("10.0.0.7", "[2001:db8::1]:8443", "2001:db8::2")
    assert host_allowed("http://10.0.0.7/", cfg)
    assert not host_allowed("http://10.0.0.7:81/", cfg)
    assert host_allowed("https://[2001:db8::1]:8443/", cfg)
    assert not host_allowed("https://[2001:db8::1]/", cfg)
    assert host_allowed("https://[2001:DB8:0::2]/", cfg)
    assert not host_allowed("http://10.0.0.8/", cfg)


def test_idna_hosts_match_their_ascii_form() -> None:
    cfg = config("xn--bcher-kva.example")
    assert host_allowed("https://bücher.example/", cfg)


def test_the_host_is_encoded_as_the_http_client_encodes_it() -> None:
    # IDNA2008 (what httpx connects to) keeps "ß": api.xn--busine-gta.com. IDNA2003 (the
    # codec of Python) made it "ss", so a listed api.business.com admitted another host.
    listed = config("api.business.com")
    assert not host_allowed("https://api.busineß.com/hook", listed)
    with pytest.raises(CallbackError) as info:
        parse_callback("https://api.busineß.com/hook", listed)
    assert info.value.code == "callback_host_not_allowed"
    assert "api.xn--busine-gta.com" in info.value.message
    assert host_allowed("https://api.busineß.com/hook", config("api.xn--busine-gta.com"))
    assert host_allowed("https://api.busineß.com/hook", config("api.busineß.com"))
    assert host_allowed("https://API.Business.com/hook", listed)


def test_a_host_the_http_client_cannot_encode_is_invalid() -> None:
    # IDNA2003 encodes a snowman (xn--n3h); IDNA2008, and so httpx, refuses it.
    with pytest.raises(CallbackError) as info:
        parse_callback("https://\u2603.example/", config("xn--n3h.example"))
    assert info.value.code == "invalid_callback"
    assert "not a valid host name" in info.value.message


@pytest.mark.parametrize(
    ("pattern", "url", "allowed"),
    [
        ("api.example.com", "https://api.example.com/", True),
        ("api.example.com", "http://api.example.com/", True),
        ("api.example.com", "https://api.example.com:443/", True),
        ("api.example.com", "https://api.example.com:8443/", False),
        ("api.example.com", "http://api.example.com:443/", False),
        ("api.example.com:*", "https://api.example.com:8443/", True),
        ("api.example.com:*", "http://api.example.com/", True),
        ("api.example.com:8443", "https://api.example.com/", False),
        ("*.example.com", "https://a.example.com:8443/", False),
        ("*.example.com:*", "https://a.example.com:8443/", True),
        ("[2001:db8::1]:*", "https://[2001:db8::1]:9/", True),
        ("2001:db8::1", "https://[2001:db8::1]:9/", False),
        ("10.0.0.7:*", "http://10.0.0.7:81/", True),
        # (a malformed pattern is refused when the server starts: test_hardening.py)
    ],
)
def test_a_pattern_without_a_port_allows_the_default_port_only(
    pattern: str, url: str, allowed: bool
) -> None:
    assert host_allowed(url, config(pattern)) is allowed


def test_loopback_allows_any_port_with_the_flag() -> None:
    assert host_allowed("http://127.0.0.1:54321/", config(loopback=True))
    assert host_allowed("http://localhost:54321/", config(loopback=True))


NON_PUBLIC = [
    "10.1.2.3",  # private
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "100.64.0.1",  # shared address space (CGNAT)
    "100.127.255.254",
    "240.0.0.1",  # reserved
    "255.255.255.255",
    "198.18.0.1",  # benchmarking
    "192.0.0.8",  # IETF protocol assignments
    "0.1.2.3",  # "this network"
    "fd00::1",  # unique local
    "fc00::1",
    "fec0::1",  # site-local (deprecated)
    "64:ff9b::808:808",  # NAT64
    "64:ff9b:1::1",  # local-use NAT64
    "::808:808",  # IPv4-compatible (deprecated)
    "2001:db8::1",  # documentation
    "::ffff:10.0.0.1",  # IPv4-mapped private
]


@pytest.mark.parametrize("address", NON_PUBLIC)
def test_non_public_addresses_are_refused_unless_allowed(address: str) -> None:
    reason = address_refusal(address, config())
    assert reason is not None
    assert "--allow-private-callbacks" in reason
    assert address_refusal(address, config(private=True)) is None
    assert address_refusal(address, config(address)) is None  # that very IP is listed


@pytest.mark.parametrize("address", NON_PUBLIC)
def test_non_public_literals_are_refused_at_put(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(CallbackError) as info:
        parse_callback(f"https://{host}/hook", config("*.example.com", private=False))
    assert info.value.code == "callback_host_not_allowed"
    assert host_allowed(f"https://{host}/hook", config(host))


@pytest.mark.parametrize(
    ("address", "embedded"),
    [
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible
        ("::ffff:127.0.0.1", "127.0.0.1"),  # IPv4-mapped
        ("2002:7f00:1::", "127.0.0.1"),  # 6to4
        ("2002:7f00:1::1", "127.0.0.1"),
        ("2002:a9fe:a9fe::", "169.254.169.254"),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),  # Teredo (client obfuscated)
    ],
)
def test_an_ipv6_embedding_a_refused_ipv4_is_refused(address: str, embedded: str) -> None:
    # Allowing private ranges does not allow what they embed.
    reason = address_refusal(address, config(private=True))
    assert reason is not None
    assert embedded in reason
    assert not host_allowed(f"https://[{address}]/", config(f"[{address}]", private=True))


def test_6to4_is_refused_by_default_and_by_what_it_embeds() -> None:
    # On every Python version alike (ipaddress calls 2002::/16 global on some only).
    public_6to4 = "2002:5db8:d822::1"  # 93.184.216.34
    assert "6to4" in (address_refusal(public_6to4, config()) or "")
    assert address_refusal(public_6to4, config(private=True)) is None
    assert address_refusal(public_6to4, config(public_6to4)) is None
    private_6to4 = "2002:a00:1::"  # 10.0.0.1
    assert "10.0.0.1" in (address_refusal(private_6to4, config(private_6to4)) or "")
    assert address_refusal(private_6to4, config(private=True)) is None
    assert address_refusal("2606:4700:4700::1111", config()) is None


def test_the_ipv4_compatible_range_starts_after_loopback() -> None:
    # :: and ::1 are the unspecified and the loopback address; from ::2 (::0.0.0.2) on,
    # an address of ::/96 stands for the IPv4 address it ends with.
    assert address_refusal("::1", config(loopback=True)) is None  # not 0.0.0.1
    reason = address_refusal("::2", config("[::2]"))  # listing it does not allow 0.0.0.2
    assert reason is not None
    assert "0.0.0.2" in reason


def test_malformed_url_is_not_allowed() -> None:
    assert not host_allowed("not a url", ALLOW_EXAMPLE)


@pytest.mark.parametrize(
    ("address", "loopback", "listed", "refused"),
    [
        ("93.184.216.34", False, (), False),
        ("10.1.2.3", False, (), True),
        ("10.1.2.3", False, ("10.1.2.3:8080",), False),
        ("127.0.0.1", False, (), True),
        ("127.0.0.1", True, (), False),
        ("::1", False, (), True),
        ("::ffff:127.0.0.1", False, (), True),
        ("169.254.169.254", True, (), True),
        ("169.254.169.254", False, ("169.254.169.254",), False),
        ("0.0.0.0", True, (), True),
        ("239.1.1.1", False, (), True),
        ("fe80::1%eth0", False, (), True),
        ("not-an-ip", False, (), True),
    ],
)
def test_address_refusal(
    address: str, loopback: bool, listed: tuple[str, ...], refused: bool
) -> None:
    reason = address_refusal(address, config(*listed, loopback=loopback))
    assert (reason is not None) is refused


# -- signing -----------------------------------------------------------------------------------


def test_sign_format_and_verify() -> None:
    header = sign("s3cret", 1_700_000_000, b'{"a":1}')
    t, v1 = header.split(",")
    assert t == "t=1700000000"
    assert v1.startswith("v1=")
    assert len(v1) == 3 + 64
    assert verify("s3cret", header, b'{"a":1}', now=1_700_000_010)


def test_v1_is_the_hmac_of_the_timestamp_a_dot_and_the_body() -> None:
    """A known answer computed here, as the README tells a receiver to compute it:
    HMAC-SHA256 over ``<t>.<body>``. Without the ``.`` a timestamp and a body that
    begins with digits could be split another way (t=17, body "00..." signs as t=170)."""
    body = b'{"order":42}'
    expected = hmac.new(b"s3cret", b'1700000000.{"order":42}', hashlib.sha256).hexdigest()
    assert expected == "7c393310b159e0ddabd257ea65bc7352a78d638451e5764a0230dd33c285113c"
    header = sign("s3cret", 1_700_000_000, body)
    assert header == f"t=1700000000,v1={expected}"
    assert verify("s3cret", f"t=1700000000,v1={expected}", body, now=1_700_000_000)
    # The same bytes split at another place are another signature.
    assert sign("s3cret", 17, b"00000000" + body) != sign("s3cret", 1_700_000_000, body)


def test_verify_refuses_tampering() -> None:
    body = b"payload"
    header = sign("s3cret", 1000, body)
    assert not verify("s3cret", header, b"payload!", now=1000)
    assert not verify("other", header, body, now=1000)
    assert not verify("s3cret", header.replace("t=1000", "t=1001"), body, now=1000)
    assert not verify("", header, body, now=1000)


def test_verify_refuses_stale_and_future_timestamps() -> None:
    header = sign("k", 1000, b"x")
    assert verify("k", header, b"x", now=1300)
    assert not verify("k", header, b"x", now=1301)
    assert not verify("k", header, b"x", now=699)
    assert verify("k", header, b"x", now=1600, tolerance=600)


@pytest.mark.parametrize("header", ["", "garbage", "t=abc,v1=00", "v1=00", "t=1000", "t=1000,v1="])
def test_verify_refuses_malformed_headers(header: str) -> None:
    assert not verify("k", header, b"x", now=1000)


@pytest.mark.parametrize("digits", [400, 5000, 20_000])
@pytest.mark.parametrize("now", [None, 1000.0])
def test_verify_says_false_for_a_timestamp_of_many_digits(digits: int, now: float | None) -> None:
    """400 digits overflowed the float of the clock (OverflowError), 5,000 exceeded
    int()'s limit (ValueError): a receiver written as ``if not verify(...)`` answered
    500."""
    body = b"x"
    for header in (
        f"t={'9' * digits},v1={'0' * 64}",
        f"t={'1' * digits},v2={'0' * 64}",
        f"v1=00,t={'0' * (digits - 4)}1000",  # a real timestamp in many digits
    ):
        assert public_verify("k", header, body, now=now) is False
        assert public_verify("k", header, body, now=now, **REQUEST) is False


# Header text of every kind, and text shaped like a header: t= (any digits, up to
# thousands of them) and entries of any key with any value.
_DIGITS = st.text("0123456789", min_size=1, max_size=20) | st.integers(300, 6000).flatmap(
    lambda n: st.text("0123456789", min_size=n, max_size=n)
)
_ENTRY = st.tuples(
    st.sampled_from(["t", "v1", "v2", "v3", "T", " t", "t ", ""]) | st.text(max_size=4),
    st.text(max_size=80) | _DIGITS,
).map("=".join)
_HEADERS = (
    st.text()
    | st.lists(_ENTRY, max_size=6).map(",".join)
    | st.tuples(_DIGITS, st.lists(_ENTRY, max_size=3)).map(
        lambda parts: ",".join([f"t={parts[0]}", *parts[1], "v1=00", "v2=00", "v3=00"])
    )
)


@settings(max_examples=300, deadline=None)
@given(header=_HEADERS, now=st.none() | st.floats(allow_nan=False) | st.integers(0, 2**40))
def test_verify_says_false_for_any_header_that_is_not_a_signature(
    header: str, now: float | None
) -> None:
    assert public_verify("k", header, b"body", now=now) is False
    assert public_verify("k", header, b"body", now=now, **REQUEST) is False


def test_verify_accepts_any_of_several_signatures() -> None:
    new = sign("new", 1000, b"x")
    old_digest = sign("old", 1000, b"x").split("v1=")[1]
    both = f"{new},v1={old_digest}"
    assert verify("new", both, b"x", now=1000)
    assert verify("old", both, b"x", now=1000)


def test_sign_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="secret"):
        sign("", 1, b"")
    with pytest.raises(ValueError, match="timestamp"):
        sign("k", -1, b"")


# -- signing, v2: method, URL and message id too ----------------------------------------------

REQUEST = {"method": "GET", "url": "https://api.example.com/orders/42?k=1", "message_id": "m-1"}


def v2_by_hand(secret: str, t: int, method: str, url: str, message_id: str, body: bytes) -> str:
    """The v2 digest as the README tells a receiver to compute it."""
    signed = f"{t}\n{method}\n{url}\n{message_id}\n".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def test_sign_v2_format() -> None:
    header = sign("s3cret", 1000, b"", **REQUEST)
    fields = dict(part.split("=", 1) for part in header.split(","))
    assert list(fields) == ["t", "v1", "v2"]
    assert fields["t"] == "1000"
    assert fields["v1"] == sign("s3cret", 1000, b"").split("v1=")[1]  # v1 as before
    assert fields["v2"] == v2_by_hand("s3cret", 1000, "GET", REQUEST["url"], "m-1", b"")


def test_v2_covers_method_url_message_id_and_body() -> None:
    header = sign("k", 1000, b"", **REQUEST)
    assert verify("k", header, b"", now=1000, **REQUEST)
    for change in (
        {"method": "DELETE"},
        {"url": "https://api.example.com/orders/43?k=1"},
        {"url": "https://api.example.com/orders/42"},
        {"message_id": "m-2"},
    ):
        assert not verify("k", header, b"", now=1000, **{**REQUEST, **change}), change
    assert not verify("k", header, b"x", now=1000, **REQUEST)
    assert not verify("other", header, b"", now=1000, **REQUEST)
    # Two bodyless requests of other messages no longer share a signature.
    other = sign("k", 1000, b"", **{**REQUEST, "message_id": "m-2"})
    assert other.split("v2=")[1] != header.split("v2=")[1]
    assert other.split("v1=")[1].split(",")[0] == header.split("v1=")[1].split(",")[0]


def test_v1_still_verifies_during_the_transition() -> None:
    header = sign("k", 1000, b"body", **REQUEST)
    assert verify("k", header, b"body", now=1000)


def test_given_the_request_only_v2_counts() -> None:
    # A v1-only header (or one stripped of its v2) cannot pass for another request.
    v1_only = sign("k", 1000, b"")
    assert verify("k", v1_only, b"", now=1000)
    assert not verify("k", v1_only, b"", now=1000, **REQUEST)
    stripped = sign("k", 1000, b"", **REQUEST).rsplit(",", 1)[0]
    assert not verify("k", stripped, b"", now=1000, **REQUEST)


def test_v2_tolerance_and_several_signatures() -> None:
    header = sign("new", 1000, b"x", **REQUEST)
    old = sign("old", 1000, b"x", **REQUEST).split("v2=")[1]
    both = f"{header},v2={old}"
    assert verify("new", both, b"x", now=1300, **REQUEST)
    assert verify("old", both, b"x", now=1300, **REQUEST)
    assert not verify("new", both, b"x", now=1301, **REQUEST)


def test_sign_v2_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="together"):
        sign("k", 1, b"", method="GET", url="https://a.example/")
    with pytest.raises(ValueError, match="together"):
        verify("k", "t=1,v2=00", b"", now=1, message_id="m")
    for message_id in ("a\nb", "a\n", " a", "é", ""):
        with pytest.raises(ValueError, match="message id"):
            sign("k", 1, b"", method="GET", url="https://a.example/", message_id=message_id)
    with pytest.raises(ValueError, match="url"):
        sign("k", 1, b"", method="GET", url="https://a.example/\nx", message_id="a")
    for method in ("G ET", "GET\n", ""):
        with pytest.raises(ValueError, match="method"):
            sign("k", 1, b"", method=method, url="https://a.example/", message_id="a")
    with pytest.raises(ValueError, match="url"):
        sign("k", 1, b"", method="GET", url="https://a.example/\n", message_id="a")
    # verify() says False, never raises, for such values (no signature covers them)
    assert not verify("k", "t=1,v2=00", b"", now=1, method="GET\n", url="u", message_id="a")


# -- signing, v3: queue, attempt and content type too ------------------------------------------

DELIVERY = {"queue": "orders", "attempt": "2", "content_type": "application/json"}
V3 = {**REQUEST, **DELIVERY}


def v3_by_hand(secret: str, t: int, parts: dict[str, str], body: bytes) -> str:
    """The v3 digest as the README tells a receiver to compute it."""
    lines = ["v3", str(t), *(parts[k] for k in ("method", "url", "message_id")),
             *(parts[k] for k in ("queue", "attempt", "content_type"))]  # fmt: skip
    signed = "".join(f"{line}\n" for line in lines).encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def test_sign_v3_format() -> None:
    header = sign("s3cret", 1000, b"{}", **V3)
    fields = dict(part.split("=", 1) for part in header.split(","))
    assert list(fields) == ["t", "v1", "v2", "v3"]
    assert header.rsplit(",v3=", 1)[0] == sign("s3cret", 1000, b"{}", **REQUEST)  # v1, v2 as before
    assert fields["v3"] == v3_by_hand("s3cret", 1000, V3, b"{}")
    assert sign("s3cret", 1000, b"{}", **{**V3, "attempt": 2}) == header  # an int attempt
    no_type = sign("s3cret", 1000, b"", **{**V3, "content_type": ""})
    assert no_type.split("v3=")[1] == v3_by_hand("s3cret", 1000, {**V3, "content_type": ""}, b"")


@pytest.mark.parametrize(
    "change",
    [
        {"method": "PUT"},
        {"url": "https://api.example.com/orders/43?k=1"},
        {"message_id": "m-2"},
        {"queue": "orders2"},
        {"attempt": "3"},
        {"attempt": "02"},
        {"content_type": "text/plain"},
        {"content_type": ""},
    ],
)
def test_v3_covers_every_signed_header(change: dict[str, str]) -> None:
    header = sign("k", 1000, b"{}", **V3)
    assert verify("k", header, b"{}", now=1000, **V3)
    assert verify("k", header, b"{}", now=1000, **V3, accept_v2=True)
    assert not verify("k", header, b"{}", now=1000, **{**V3, **change})
    assert not verify("k", header, b"{}", now=1000, **{**V3, **change}, accept_v2=True)


def test_given_the_v3_parts_v3_counts_when_present() -> None:
    header = sign("k", 1000, b"{}", **V3)
    assert not verify("k", header, b"{} ", now=1000, **V3)  # the body too
    # A header whose v3 does not match fails even though its v2 does.
    forged = sign("k", 1000, b"{}", **{**V3, "queue": "other"})
    assert not verify("k", forged, b"{}", now=1000, **V3)
    # An older server's header (v1 and v2 only) is refused, and so is a header
    # stripped of its v3, unless the receiver accepts v2.
    older = sign("k", 1000, b"{}", **REQUEST)
    stripped = header.rsplit(",v3=", 1)[0]
    for v2_only in (older, stripped):
        assert not verify("k", v2_only, b"{}", now=1000, **V3)
        assert verify("k", v2_only, b"{}", now=1000, **V3, accept_v2=True)
    # The v2 and v1 calls of receivers written before v3 still verify the new header.
    assert verify("k", header, b"{}", now=1000, **REQUEST)
    assert verify("k", header, b"{}", now=1000)
    # No v2 signature passes for a v3 entry (v3's text starts with a line of its own),
    # not even over a body that begins with the lines v3 adds.
    prefix = b"orders\n2\napplication/json\n"
    v2 = sign("k", 1000, prefix + b"{}", **REQUEST).split("v2=")[1]
    assert not verify("k", f"t=1000,v3={v2}", b"{}", now=1000, **V3)


def test_sign_and_verify_v3_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="together"):
        sign("k", 1, b"", **REQUEST, queue="q", attempt="1")
    with pytest.raises(ValueError, match="together"):
        sign("k", 1, b"", **DELIVERY)  # without method, url and message_id
    with pytest.raises(ValueError, match="together"):
        verify("k", "t=1,v3=00", b"", now=1, **DELIVERY)
    with pytest.raises(ValueError, match="together"):
        verify("k", "t=1,v3=00", b"", now=1, **REQUEST, content_type="")
    with pytest.raises(ValueError, match="accept_v2"):
        verify("k", "t=1,v3=00", b"", now=1, **REQUEST, accept_v2=True)
    for bad in (
        {"queue": "a\nb"}, {"queue": ""}, {"queue": " q"}, {"queue": "café"},
        {"attempt": "x"}, {"attempt": "1\n"}, {"attempt": -1}, {"attempt": True},
        {"content_type": "text/plain\n"}, {"content_type": "text/plain "},
    ):  # fmt: skip
        with pytest.raises(ValueError, match=r"queue|attempt|content_type"):
            sign("k", 1, b"", **{**V3, **bad})  # type: ignore[arg-type]
        # verify() says False, never raises, for such values (no signature covers them)
        assert verify("k", "t=1,v3=00", b"", now=1, **{**V3, **bad}) is False  # type: ignore[arg-type]
    assert sign("k", 1, b"", **{**V3, "content_type": "text/plain;\tq=1"})  # a tab inside


# -- the message id header -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("message_id", "header"),
    [
        ("order-42", "order-42"),
        ("a b", "a b"),  # inner spaces travel as they are
        (" lead", "UTF-8''%20lead"),
        ("trail ", "UTF-8''trail%20"),
        ("héllo", "UTF-8''h%C3%A9llo"),
        ("a\nb", "UTF-8''a%0Ab"),
        ("UTF-8''x", "UTF-8''UTF-8%27%27x"),  # the prefix itself is encoded
        ("!#$&+-.^_`|~/", "!#$&+-.^_`|~/"),
        ("é!#$&+-.^_`|~/", "UTF-8''%C3%A9!#$&+-.^_`|~%2F"),
        ("", "UTF-8''"),
    ],
)
def test_message_id_header_round_trips(message_id: str, header: str) -> None:
    assert message_id_header(message_id) == header
    assert message_id_from_header(header) == message_id


def test_message_id_header_refuses_what_is_not_text() -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        message_id_header("a\ud800")
    with pytest.raises(ValueError, match="is a str, not int"):
        message_id_header(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("UTF-8''%zz", "not a percent-encoded message id: "),
        ("UTF-8''a b", "not a percent-encoded message id: "),
        ("UTF-8''%C3", "not a percent-encoded message id (not UTF-8): "),
        ("UTF-8''%ff", "(not UTF-8)"),
    ],
)
def test_message_id_from_header_refuses_bad_encodings(value: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=r"^not a percent-encoded message id") as info:
        message_id_from_header(value)
    assert fragment in str(info.value)
    assert repr(value)[:20] in str(info.value)


@pytest.mark.parametrize(
    ("queue", "header"),
    [
        ("callbacks", "callbacks"),
        ("wébhooks", "UTF-8''w%C3%A9bhooks"),
        ("🪝hooks", "UTF-8''%F0%9F%AA%9Dhooks"),
        ("注文", "UTF-8''%E6%B3%A8%E6%96%87"),
        ("UTF-8''q", "UTF-8''UTF-8%27%27q"),
        ("a b", "a b"),
    ],
)
def test_queue_header_round_trips_as_the_message_id_header(queue: str, header: str) -> None:
    assert queue_header(queue) == header
    assert queue_from_header(header) == queue
    assert public_queue_from_header(header) == queue
    assert message_id_header(queue) == header  # one encoding for both headers
    with pytest.raises(ValueError, match=r"lone surrogate.*X-Delayq-Queue"):
        queue_header("q\ud800")
    with pytest.raises(ValueError, match=r"^not a percent-encoded queue name"):
        queue_from_header("UTF-8''%C3")


def test_message_id_from_header_leaves_a_plain_value_alone() -> None:
    assert message_id_from_header("UTF-8'x%41") == "UTF-8'x%41"
    assert message_id_from_header("%41") == "%41"
    assert message_id_from_header("UTF-8''%41%2f") == "A/"


# -- the connection guard's own check ------------------------------------------------------


def test_connection_refusal_checks_host_and_port_before_any_lookup() -> None:
    cfg = config("api.example.com", "hooks.example.org:8443", "10.0.0.7")
    assert connection_refusal("api.example.com", 443, cfg) is None
    assert connection_refusal("api.example.com", 80, cfg) is None  # either default port
    assert "allowlist" in (connection_refusal("api.example.com", 8443, cfg) or "")
    assert connection_refusal("hooks.example.org", 8443, cfg) is None
    assert "allowlist" in (connection_refusal("hooks.example.org", 443, cfg) or "")
    assert "allowlist" in (connection_refusal("other.example.com", 443, cfg) or "")
    assert connection_refusal("10.0.0.7", 80, cfg) is None
    reason = connection_refusal("api.busineß.com", 443, cfg)
    assert reason == "callback host 'api.busineß.com' is not ASCII (IDNA-encode it first)"
    assert connection_refusal("API.Example.COM", 443, cfg) is None  # case-insensitive
    assert "loopback" in (connection_refusal("127.0.0.1", 443, config("127.0.0.1")) or "")
    assert connection_refusal("127.0.0.1", 5000, config(loopback=True)) is None


# -- what mutation testing found unchecked (docs/testing.md) --------------------------------


def test_the_callback_header_is_compact_utf8_json() -> None:
    """The stored form of a callback (it counts against the headers' size limit)."""
    cb = parse_callback(
        {"url": "https://api.example.com/ü", "headers": {"A": "b"}, "timeout": 3},
        ALLOW_EXAMPLE,
    )
    assert cb.to_header() == (
        '{"url":"https://api.example.com/ü","method":"POST","headers":{"A":"b"},"timeout":3.0}'
    )


def test_sign_takes_timestamp_zero_and_verify_reads_the_clock() -> None:
    assert sign("k", 0, b"x").startswith("t=0,v1=")
    assert verify("k", sign("k", int(time.time()), b"x"), b"x")  # now: time.time()
    assert not verify("k", sign("k", int(time.time()) - 3600, b"x"), b"x")


def test_verify_refuses_what_is_not_a_secret_a_header_or_its_own_entry() -> None:
    body = b"x"
    empty_key = hmac.new(b"", b"1000.x", hashlib.sha256).hexdigest()
    assert not verify("", f"t=1000,v1={empty_key}", body, now=1000)
    assert not verify("k", None, body, now=1000)  # type: ignore[arg-type]
    assert not verify(None, "t=1000,v1=00", body, now=1000)  # type: ignore[arg-type]
    digest = sign("k", 1000, body).split("v1=")[1]
    assert verify("k", f"t=1000,v1={digest}", body, now=1000)
    assert not verify("k", f"t=1000,v0={digest}", body, now=1000)  # another key
    assert not verify("k", f"t=1000,x={digest}", body, now=1000)
    assert not verify("k", "t=1000,v1=é", body, now=1000)  # not ASCII: no match, no error


@pytest.mark.parametrize(
    "given",
    [
        {"url": "https://a.example/", "message_id": "m"},
        {"method": "GET", "message_id": "m"},
        {"method": "GET", "url": "https://a.example/"},
    ],
)
def test_v2_needs_method_url_and_message_id_together(given: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="go together"):
        sign("k", 1, b"", **given)
    with pytest.raises(ValueError, match="go together"):
        verify("k", "t=1,v2=00", b"", now=1, **given)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (5, "callback must be an object with a url, not int"),
        ({}, "callback needs a url"),
        ({"url": 5}, "callback url must be a string, not int"),
        ({"url": "https://api.example.com/a b"}, "callback url must not contain spaces or "
         "control characters"),
        ({"url": "https://api.example.com/\x7f"}, "callback url must not contain spaces or "
         "control characters"),
        ({"url": "https://u:p@api.example.com/"}, "callback url must not carry credentials "
         "(user:password@)"),
        ({"url": "https://api.example.com/", "method": 5}, "callback method must be a "
         "string, not int"),
        ({"url": "https://api.example.com/", "colour": 1, "size": 2},
         "callback has unknown keys: colour, size (known: headers, method, timeout, url)"),
    ],
)  # fmt: skip
def test_a_bad_callback_is_refused_in_so_many_words(raw: Any, message: str) -> None:
    with pytest.raises(CallbackError) as info:
        parse_callback(raw, ALLOW_EXAMPLE)
    assert info.value.message == message


def test_a_callback_defaults_to_post_and_the_servers_timeout() -> None:
    cb = parse_callback({"url": "https://api.example.com/"}, config("api.example.com", timeout=7))
    assert (cb.method, cb.timeout) == ("POST", 7.0)
    stored = Callback.from_header('{"url":"https://api.example.com/"}')
    assert (stored.method, stored.timeout) == ("POST", 10.0)


def test_the_callback_limits_are_inclusive() -> None:
    base = "https://api.example.com/"
    longest = base + "a" * (CALLBACK_MAX_URL_LENGTH - len(base))
    assert parse_callback(longest, ALLOW_EXAMPLE).url == longest
    with pytest.raises(CallbackError):
        parse_callback(longest + "a", ALLOW_EXAMPLE)
    for timeout in (0.5, CALLBACK_MAX_TIMEOUT):
        assert Callback(base, timeout=timeout).timeout == timeout
    many = {f"X-H{i}": "v" for i in range(CALLBACK_MAX_HEADERS)}
    assert len(parse_callback({"url": base, "headers": many}, ALLOW_EXAMPLE).headers) == len(many)
    # Names and values add up to the byte limit exactly: allowed; one byte more: refused.
    names = {f"X-{i}": "" for i in range(CALLBACK_MAX_HEADERS - 1)}
    used = sum(len(name) for name in names) + len("X-Big")
    full = {**names, "X-Big": "v" * (CALLBACK_MAX_HEADER_BYTES - used)}
    assert parse_callback({"url": base, "headers": full}, ALLOW_EXAMPLE)
    full["X-Big"] += "v"
    with pytest.raises(CallbackError):
        parse_callback({"url": base, "headers": full}, ALLOW_EXAMPLE)
    with pytest.raises(CallbackError):
        parse_callback({"url": base, "headers": {"X-A": "a\x7fb"}}, ALLOW_EXAMPLE)

"""The callback allowlist as a client of the HTTP API meets it: what a put is
answered, and the flags of ``delayq serve`` that shape it."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from delayq.cli import main

from ._helpers import error_of, put, stats


def put_callback(client: Any, url: str) -> Any:
    return client.post(
        "/v1/queues/callbacks/messages", json={"payload": 1, "callback": {"url": url}}
    )


def test_put_checks_the_host_the_http_client_would_connect_to(make_client: Any) -> None:
    client = make_client(callback_hosts=("api.business.com",))
    refused = put_callback(client, "https://api.busineß.com/hook")
    assert error_of(refused, 422) == "callback_host_not_allowed"
    assert "api.xn--busine-gta.com" in refused.json()["error"]["message"]
    invalid = put_callback(client, "https://\u2603.example/hook")  # IDNA 2003 only
    assert error_of(invalid, 422) == "invalid_callback"
    assert stats(client, "callbacks")["ready"] == 0
    put(client, "callbacks", callback={"url": "https://API.business.com/hook"})


def test_put_refuses_an_ipv6_literal_that_embeds_loopback(make_client: Any) -> None:
    client = make_client(
        callback_hosts=("[2002:7f00:1::]", "10.0.0.7"), allow_private_callbacks=True
    )
    refused = put_callback(client, "https://[2002:7f00:1::]/hook")
    assert error_of(refused, 422) == "callback_host_not_allowed"
    assert "127.0.0.1" in refused.json()["error"]["message"]
    put(client, "callbacks", callback={"url": "http://10.0.0.7/hook"})  # a listed IP
    assert stats(client, "callbacks")["ready"] == 1


def test_serve_help_tells_the_port_rule_and_the_private_flag() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "--allow-private-callbacks" in result.output
    assert ":* for any" in result.output


def test_put_refuses_a_listed_ipv4_address_followed_by_a_zone(make_client: Any) -> None:
    client = make_client(callback_hosts=("93.184.216.34", "[fe80::1]"))
    for url in (
        "http://93.184.216.34%.attacker.example/hook",
        "http://93.184.216.34%25.attacker.example/hook",
    ):
        refused = put_callback(client, url)
        assert error_of(refused, 422) == "callback_host_not_allowed", url
    assert stats(client, "callbacks")["ready"] == 0
    put(client, "callbacks", callback={"url": "http://93.184.216.34/hook"})
    put(client, "callbacks", callback={"url": "http://[fe80::1%25eth0]/hook"})  # a real zone
    assert stats(client, "callbacks")["ready"] == 2

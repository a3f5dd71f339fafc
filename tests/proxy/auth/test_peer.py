"""The caller's address through trusted proxies: one reading for lockouts (MCP edge, sign-in,
the API) and the egress policy's caller zone."""

from __future__ import annotations

from typing import Any

import pytest

from policies.egress import caller_zone as policy_zone
from proxy.auth.peer import caller_address, client_address, client_ip
from proxy.config import parse_networks
from proxy.destinations import classify


def caller_zone(peer: str | None, xff: str | None, trusted: Any, *,
                forwarded: str | None = None) -> str:
    address = caller_address(peer, xff, trusted, forwarded=forwarded)
    return "unknown" if address is None else classify(address)


TRUSTED = parse_networks(["10.0.0.1", "192.168.0.0/16"], "server.trusted_proxies")


@pytest.mark.parametrize(("peer", "xff", "trusted", "zone"), [
    ("127.0.0.1", None, (), "loopback"),
    ("::1", None, (), "loopback"),
    ("::ffff:127.0.0.1", None, (), "loopback"),
    ("10.0.0.9", None, (), "lan"),
    ("8.8.8.8", None, (), "remote"),
    (None, None, (), "unknown"),
    ("not-an-ip", None, (), "unknown"),
    # a spoofed header from a peer that is not a trusted proxy is ignored
    ("8.8.8.8", "127.0.0.1", (), "remote"),
    ("8.8.8.8", "127.0.0.1", TRUSTED, "remote"),
    ("10.0.0.9", "127.0.0.1", TRUSTED, "lan"),
    # a trusted proxy: the nearest address that is not a trusted proxy counts
    ("10.0.0.1", "8.8.8.8", TRUSTED, "remote"),
    ("10.0.0.1", "127.0.0.1, 8.8.8.8", TRUSTED, "remote"),        # a forged left entry
    ("10.0.0.1", "8.8.8.8, 192.168.4.4", TRUSTED, "remote"),      # through two proxies
    ("10.0.0.1", "127.0.0.1, 192.168.4.4", TRUSTED, "loopback"),
    ("10.0.0.1", "172.16.5.5", TRUSTED, "lan"),
    ("10.0.0.1", "[2606:4700::1]:443", TRUSTED, "remote"),
    ("10.0.0.1", "8.8.8.8:5678", TRUSTED, "remote"),
    ("10.0.0.1", "192.168.4.4, 192.168.9.9", TRUSTED, "lan"),    # all trusted: the farthest
    ("10.0.0.1", None, TRUSTED, "lan"),                          # the proxy's own call
    ("10.0.0.1", "8.8.8.8, garbage", TRUSTED, "unknown"),        # cannot be told: fail closed
    ("::ffff:10.0.0.1", "8.8.8.8", TRUSTED, "remote"),
    ("10.0.0.1", "8.8.8.8", parse_networks(["::ffff:10.0.0.1"], "k"), "remote"),
])
def test_caller_zone(peer: str | None, xff: str | None, trusted: tuple[Any, ...],
                     zone: str) -> None:
    assert caller_zone(peer, xff, trusted) == zone
    headers = [] if xff is None else [("X-Forwarded-For", xff)]
    assert policy_zone(peer, headers, trusted) == zone  # the egress policy reads it so


def test_a_trusted_proxy_sending_only_forwarded_leaves_the_caller_unknown() -> None:
    assert caller_zone("10.0.0.1", None, TRUSTED, forwarded="for=8.8.8.8") == "unknown"
    assert caller_zone("8.8.8.8", None, TRUSTED, forwarded="for=127.0.0.1") == "remote"


def test_every_x_forwarded_for_line_counts_in_order_and_the_first_forwarded() -> None:
    trusted = parse_networks(["10.0.0.1"], "k")
    lines = [("x-forwarded-for", "10.0.0.7"), ("X-Forwarded-For", "8.8.8.8")]
    assert str(client_ip("10.0.0.1", lines, trusted)) == "8.8.8.8"
    assert client_ip("10.0.0.1", [("Forwarded", "for=8.8.8.8")], trusted) is None
    assert str(client_ip("10.0.0.1", [("Forwarded", "for=8.8.8.8")], ())) == "10.0.0.1"


def test_a_route_lockout_key_is_the_client_or_the_peer() -> None:
    trusted = parse_networks(["10.0.0.1"], "k")
    assert client_address("10.0.0.1", [("X-Forwarded-For", "8.8.8.8")], trusted) == "8.8.8.8"
    assert client_address("10.0.0.1", [("Forwarded", "for=1.2.3.4")], trusted) == "peer:10.0.0.1"
    assert client_address(None, [], ()) == "peer:?"

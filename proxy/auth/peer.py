"""The caller's address: the connection's peer, or, behind a trusted proxy, the client that
proxy names in X-Forwarded-For. One reading serves every place that needs it: lockouts on the
MCP edge, sign-in and the management API, and the egress policy's caller zone.

`server.trusted_proxies` is parsed once (`proxy.config.parse_networks`, in `create_app`), and
without any trusted proxy no proxy header is read at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from proxy.destinations import IPAddress, IPNetwork, unwrap


def client_ip(peer: str | None, headers: Iterable[tuple[str, str]],
              trusted_proxies: Sequence[IPNetwork]) -> IPAddress | None:
    """`caller_address` over request headers as (name, value) pairs in any case: every
    X-Forwarded-For line in order, and the first Forwarded line."""
    if not trusted_proxies:
        return _address(peer)
    lines = [(k.lower(), v) for k, v in headers]
    forwarded_for = ",".join(v for k, v in lines if k == "x-forwarded-for") or None
    forwarded = next((v for k, v in lines if k == "forwarded"), None)
    return caller_address(peer, forwarded_for, trusted_proxies, forwarded=forwarded)


def client_address(peer: str | None, headers: Iterable[tuple[str, str]],
                   trusted_proxies: Sequence[IPNetwork]) -> str:
    """The address failed attempts are counted against on a Quart route (sign-in, the API):
    the client through trusted proxies (else every client behind the proxy would share one
    lockout, and one attacker would lock them all out), or `peer:<peer>` when it cannot be
    told. Quart's `request.headers` iterate as (name, value) pairs, repeats included."""
    address = client_ip(peer, headers, trusted_proxies)
    return str(address) if address is not None else f"peer:{peer or '?'}"


def caller_address(peer_ip: str | None, forwarded_for: str | None,
                   trusted_proxies: Sequence[IPNetwork], *,
                   forwarded: str | None = None) -> IPAddress | None:
    """The connection's peer, unless the peer is a trusted proxy: then the nearest address in
    X-Forwarded-For that is not a trusted proxy, walking from the right (the entries left of
    it were written by whoever the proxy heard, so they prove nothing). None when it cannot be
    told: no peer, a malformed hop, or a trusted proxy that sent only `Forwarded`, which is not
    read (a proxy that appends to one header passes a client's forged other header on)."""
    peer = _address(peer_ip)
    if peer is None or not _trusted(peer, trusted_proxies):
        return peer
    hops = [hop.strip() for hop in (forwarded_for or "").split(",") if hop.strip()]
    if not hops:
        return None if forwarded else peer
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            return None
        if not _trusted(address, trusted_proxies):
            return address
    return _address(hops[0])  # every hop is a trusted proxy: the farthest one is the caller


def _address(text: str | None) -> IPAddress | None:
    """An address as peers and X-Forwarded-For write it: bare, [v6]:port or v4:port."""
    if not text:
        return None
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return unwrap(ipaddress.ip_address(text))
    except ValueError:
        return None


def _trusted(address: IPAddress, trusted_proxies: Sequence[IPNetwork]) -> bool:
    return any(address in network for network in trusted_proxies)

"""Egress: where data may go (the caller's zone against the upstream's collection labels) and
where requests may go (the upstream's resolved addresses against its zones).

The data check comes first: it costs no I/O, and a caller who may not have the data learns
nothing about the destination. A refusal is seed 000's body at 403, and its `audit` object is
kept on the exception for the audit record. The destination check is `proxy.egress`'s, run
here so that a refused upstream answers before anything is sent, and again by the transport
for requests that never pass the chain.

`proxy.config` embeds `EgressConfig`, so this module imports the chain's types for annotations
only: at run time it needs nothing that imports the config back.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from proxy.egress import (
    API_DEFAULT_ZONES,
    DEFAULT_METADATA_ADDRESSES,
    ZONES,
    Destinations,
    EgressDestinationDenied,
    IPAddress,
    IPNetwork,
    Resolver,
    SystemResolver,
    UpstreamEgress,
    Zone,
    classify,
    is_metadata,
    parse_addresses,
    unwrap,
)
from proxy.errors import PolicyDenied

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.jsonrpc import McpMessage

__all__ = [
    "API_DEFAULT_ZONES", "MAX_COLLECTIONS", "POLICIES", "ZONES", "Egress", "EgressConfig",
    "EgressDenied", "EgressDestinationDenied", "Resolver", "SystemResolver", "UpstreamEgress",
    "caller_address", "caller_zone", "classify", "decide", "is_metadata", "parse_networks",
    "unknown_audit", "validate_egress",
]

CallerZone = Zone | Literal["unknown"]
Reason = Literal["INVALID_INPUT", "UNKNOWN_DESTINATION", "POLICY_LOCAL_ONLY", "POLICY_LAN_ONLY",
                 "AUTHENTICATION_REQUIRED"]
Policy = Literal["local_only", "lan", "remote"]

POLICIES: tuple[Policy, ...] = ("local_only", "lan", "remote")  # most restrictive first
MAX_COLLECTIONS = 64  # seed 000's cap on audit.collections
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@dataclass(frozen=True)
class EgressConfig:
    """`[egress]`. `collections` maps a data label to the farthest zone its data may be served
    to. `metadata_addresses` replaces, not extends, the built-in list."""

    collections: dict[str, str] = field(default_factory=dict)
    metadata_addresses: list[str] = field(default_factory=lambda: list(DEFAULT_METADATA_ADDRESSES))


def validate_egress(egress: EgressConfig,
                    upstreams: Sequence[tuple[str, str, Sequence[str], Sequence[str]]],
                    trusted_proxies: Sequence[str] = ()) -> None:
    """Raise ValueError naming the first offending key. `upstreams` are (name, url, zones,
    collections) in config order."""
    for label, policy in egress.collections.items():
        if not _LABEL.match(label):
            raise ValueError(f"egress.collections: {label!r} must be 1-64 letters, digits, "
                             "'-', '_' or '.', starting with a letter or digit")
        if policy not in POLICIES:
            raise ValueError(f"egress.collections.{label}: {policy!r} is not one of "
                             f"{', '.join(POLICIES)}")
    for i, address in enumerate(egress.metadata_addresses):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"egress.metadata_addresses[{i}]: {address!r} is not an IP "
                             "address") from None
    for i, (_name, url, zones, labels) in enumerate(upstreams):
        try:
            UpstreamEgress.from_url("", url)
        except ValueError as exc:
            raise ValueError(f"upstreams[{i}].url: {exc}") from None
        _check_upstream(f"upstreams[{i}]", zones, labels, egress.collections)
    parse_networks(trusted_proxies, "server.trusted_proxies")


def _check_upstream(where: str, zones: Sequence[str], labels: Sequence[str],
                    policies: dict[str, str]) -> None:
    if not zones:
        raise ValueError(f"{where}.zones: must name at least one of {', '.join(ZONES)}")
    for zone in zones:
        if zone not in ZONES:
            raise ValueError(f"{where}.zones: {zone!r} is not one of {', '.join(ZONES)}")
    if len(labels) > MAX_COLLECTIONS:
        raise ValueError(f"{where}.collections: more than {MAX_COLLECTIONS} labels")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}.collections: a label appears twice")
    for label in labels:
        if label not in policies:
            raise ValueError(f"{where}.collections: {label!r} has no policy in "
                             "[egress.collections]")


def parse_networks(values: Iterable[str], key: str) -> tuple[IPNetwork, ...]:
    """Addresses or CIDR networks; raise ValueError naming `key[i]` on the first bad one."""
    networks: list[IPNetwork] = []
    for i, value in enumerate(values):
        try:
            network = ipaddress.ip_network(value)
        except ValueError:
            raise ValueError(f"{key}[{i}]: {value!r} is not an IP address or network, "
                             "e.g. 10.0.0.1 or 10.0.0.0/8") from None
        if network.version == 6 and network.subnet_of(_MAPPED):  # as addresses are unwrapped
            network = ipaddress.IPv4Network(
                (int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
        networks.append(network)
    return tuple(networks)


# -- the caller's zone ---------------------------------------------------------------------------

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


def caller_zone(peer_ip: str | None, forwarded_for: str | None,
                trusted_proxies: Sequence[IPNetwork], *,
                forwarded: str | None = None) -> CallerZone:
    address = caller_address(peer_ip, forwarded_for, trusted_proxies, forwarded=forwarded)
    return "unknown" if address is None else classify(address)


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


# -- the decision ----------------------------------------------------------------------------------

def decide(policy: Policy, zone: CallerZone, authenticated: bool) -> Reason | None:
    """None to serve. Loopback callers get everything; beyond this host, `local_only` data
    never goes, `lan` data stops at the LAN, and the caller must be authenticated. A caller
    whose zone cannot be told gets nothing labelled."""
    if zone == "unknown":
        return "UNKNOWN_DESTINATION"
    if zone == "loopback":
        return None
    if policy == "local_only":
        return "POLICY_LOCAL_ONLY"
    if policy == "lan" and zone == "remote":
        return "POLICY_LAN_ONLY"
    if not authenticated:
        return "AUTHENTICATION_REQUIRED"
    return None


def unknown_audit() -> dict[str, Any]:
    """Seed 000's audit object when nothing about the call could be established."""
    return {"action": "unknown", "destinationZone": "unknown", "contentClass": "unknown",
            "collectionCount": 0, "collections": [], "effectivePolicy": "unknown",
            "effectivePolicySource": "unknown", "callerAuthenticated": None,
            "callerOperationAuthorized": None}


class EgressDenied(PolicyDenied):
    """Seed 000's body: `reason` is the audit line (`egress: POLICY_LAN_ONLY collection x`),
    `egress_reason` the schema's enum, and `audit` the object in `data.audit`, which the audit
    record carries too."""

    http_status = 403
    code = -32003
    message = "Operation blocked by collection egress policy"

    def __init__(self, reason: str, *, egress_reason: Reason = "INVALID_INPUT",
                 audit: dict[str, Any] | None = None) -> None:
        audit = unknown_audit() if audit is None else audit
        super().__init__(reason, data={"code": "EGRESS_DENIED", "message": self.message,
                                       "reason": egress_reason, "audit": audit})
        self.egress_reason: Reason = egress_reason
        self.audit = audit


@dataclass(frozen=True, slots=True)
class _Labels:
    """An upstream's labels, sorted, with the most restrictive policy among them."""

    labels: tuple[str, ...]
    effective: Policy
    deciding: str  # the first label that carries `effective`

    @classmethod
    def of(cls, labels: Iterable[str], policies: dict[str, str]) -> _Labels | None:
        ordered = tuple(sorted(set(labels)))
        for policy in POLICIES:
            for label in ordered:
                if policies[label] == policy:
                    return cls(ordered, policy, label)
        return None  # no labels: the upstream serves nothing the data check governs


class Egress:
    name: ClassVar[str] = "egress"
    order: ClassVar[int] = 300

    def __init__(self, cfg_egress: EgressConfig, upstreams: Iterable[UpstreamEgress],
                 resolver: Resolver, trusted_proxies: Sequence[str],
                 clock: Callable[[], float] = time.monotonic, pin_ttl_s: float = 30.0) -> None:
        validate_egress(cfg_egress, [])
        self._policies = dict(cfg_egress.collections)
        self._trusted = parse_networks(trusted_proxies, "server.trusted_proxies")
        self.destinations = Destinations((), resolver,
                                         parse_addresses(cfg_egress.metadata_addresses),
                                         clock, pin_ttl_s)
        self._labels: dict[str, _Labels | None] = {}
        for upstream in upstreams:
            self.add(upstream)

    def validate(self, upstream: UpstreamEgress) -> None:
        """Raise ValueError if `add` would refuse this upstream; changes nothing."""
        _check_upstream(f"upstream {upstream.name!r}", upstream.zones, upstream.collections,
                        self._policies)

    def add(self, upstream: UpstreamEgress) -> None:
        """Register or replace an upstream (the management API's, with API_DEFAULT_ZONES)."""
        self.validate(upstream)
        self.destinations.add(upstream)
        self._labels[upstream.name] = _Labels.of(upstream.collections, self._policies)

    def discard(self, name: str) -> None:
        self.destinations.discard(name)
        self._labels.pop(name, None)

    def pinned(self, endpoint: str) -> list[str] | None:
        return self.destinations.pinned(endpoint)

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        labels = self._labels.get(ctx.endpoint)
        if labels is not None:
            self._check_data(labels, ctx)
        await self.destinations.check(ctx.endpoint)

    def _check_data(self, labels: _Labels, ctx: CallContext) -> None:
        xff = ",".join(v for k, v in ctx.headers if k.lower() == "x-forwarded-for") or None
        forwarded = next((v for k, v in ctx.headers if k.lower() == "forwarded"), None)
        zone = caller_zone(ctx.peer_ip, xff, self._trusted, forwarded=forwarded)
        authenticated = ctx.principal.authenticated
        reason = decide(labels.effective, zone, authenticated)
        if reason is None:
            return
        audit: dict[str, Any] = {
            "action": "serve",             # the gateway serves the upstream's answer to the caller
            "destinationZone": zone,       # where the data goes: the caller
            "contentClass": "unknown",     # an MCP answer's content is not classified here
            "collectionCount": len(labels.labels),
            "collections": list(labels.labels[:MAX_COLLECTIONS]),
            "effectivePolicy": labels.effective,
            "effectivePolicySource": "explicit",  # every label has a policy (validated)
            "callerAuthenticated": authenticated,
            "callerOperationAuthorized": True,  # access (order 100) has admitted the call
        }
        raise EgressDenied(f"egress: {reason} collection {labels.deciding}",
                           egress_reason=reason, audit=audit)

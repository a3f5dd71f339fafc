"""Egress: where data may go (the caller's zone against the upstream's collection labels) and
where requests may go (the upstream's resolved addresses against its zones).

The data check comes first: it costs no I/O, and a caller who may not have the data learns
nothing about the destination. A refusal is seed 000's body at 403, and its `audit` object is
kept on the exception for the audit record. The destination check is asked of `Destinations`
(implemented by `proxy.destinations.Destinations`, which resolves, checks and pins), so that a
refused upstream answers before anything is sent; the upstream client dials that pin.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from proxy.auth.peer import client_ip
from proxy.config import (
    COLLECTION_POLICIES,
    MAX_COLLECTIONS,
    CollectionPolicy,
    EgressConfig,
    validate_egress,
)
from proxy.config import validate_upstream_egress as _check_upstream
from proxy.destinations import (
    API_DEFAULT_ZONES,
    ZONES,
    EgressDestinationDenied,
    IPNetwork,
    UpstreamEgress,
    Zone,
    classify,
)
from proxy.errors import PolicyDenied

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.jsonrpc import McpMessage

__all__ = [
    "API_DEFAULT_ZONES", "MAX_COLLECTIONS", "POLICIES", "ZONES", "Destinations", "Egress",
    "EgressDenied", "EgressDestinationDenied", "UpstreamEgress", "caller_zone", "decide",
    "unknown_audit",
]

CallerZone = Zone | Literal["unknown"]
Reason = Literal["INVALID_INPUT", "UNKNOWN_DESTINATION", "POLICY_LOCAL_ONLY", "POLICY_LAN_ONLY",
                 "AUTHENTICATION_REQUIRED"]
Policy = CollectionPolicy

POLICIES: tuple[Policy, ...] = COLLECTION_POLICIES  # most restrictive first


class Destinations(Protocol):
    """Where requests may go, as the policy asks it: one entry per upstream, and a `check`
    that raises EgressDestinationDenied (or UpstreamUnavailable) for one that may not be
    dialled now."""

    def add(self, upstream: UpstreamEgress) -> None: ...

    def discard(self, name: str) -> None: ...

    def pinned(self, name: str) -> list[str] | None: ...

    async def check(self, name: str) -> object: ...


# -- the caller's zone ---------------------------------------------------------------------------

def caller_zone(peer_ip: str | None, headers: Iterable[tuple[str, str]],
                trusted_proxies: Sequence[IPNetwork]) -> CallerZone:
    """Where the answer goes: the caller, through trusted proxies (proxy.auth.peer)."""
    if not trusted_proxies:  # the connection's peer: the same few on every call
        return _peer_zone(peer_ip)
    address = client_ip(peer_ip, headers, trusted_proxies)
    return "unknown" if address is None else classify(address)


@functools.lru_cache(maxsize=4096)
def _peer_zone(peer_ip: str | None) -> CallerZone:
    address = client_ip(peer_ip, (), ())
    return "unknown" if address is None else classify(address)


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
                 destinations: Destinations, trusted_proxies: Sequence[IPNetwork]) -> None:
        """`trusted_proxies` as `proxy.config.parse_networks` answers them, once, at start-up."""
        validate_egress(cfg_egress, [])
        self._policies = dict(cfg_egress.collections)
        self._trusted = tuple(trusted_proxies)
        self._destinations = destinations
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
        self._destinations.add(upstream)
        self._labels[upstream.name] = _Labels.of(upstream.collections, self._policies)

    def discard(self, name: str) -> None:
        self._destinations.discard(name)
        self._labels.pop(name, None)

    def pinned(self, endpoint: str) -> list[str] | None:
        return self._destinations.pinned(endpoint)

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        labels = self._labels.get(ctx.endpoint)
        if labels is not None:
            self._check_data(labels, ctx)
        await self._destinations.check(ctx.dial_key or ctx.endpoint)

    def _check_data(self, labels: _Labels, ctx: CallContext) -> None:
        zone = caller_zone(ctx.peer_ip, ctx.headers, self._trusted)
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

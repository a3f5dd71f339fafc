"""Where requests may go: every address the gateway dials is classified into a zone and checked
first, and the connection is made to exactly the addresses that were checked.

`admit` is the one guarded step for every outbound request to a host someone else chose:
upstream MCP calls, the connect flow's authorization servers and client metadata documents. It
resolves the host once, refuses if any address falls outside the zones the request may use or
is a cloud metadata address (unless the operator wrote that address as the host), and answers
the addresses to dial. Those travel on the request as the `DIAL` extension, and the pinned
transport (proxy.upstream.transport) dials them and nothing else, never resolving again, so a
DNS answer that changes between check and connect (rebinding) cannot move the connection.

`Destinations` keeps one pin per upstream, for the egress policy's check and the upstream
client's dial. The data side (who may receive what) is the egress policy's, in
policies/egress.py; this module knows nothing of callers, and imports no HTTP client. The
zone names and the metadata addresses are the config language's (proxy.config.zones).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.config.zones import (
    API_DEFAULT_ZONES,
    DEFAULT_METADATA_ADDRESSES,
    ZONES,
    IPAddress,
    IPNetwork,
    Zone,
    host_port,
)
from proxy.errors import UpstreamFailure, UpstreamUnavailable
from proxy.published import Published

__all__ = [  # with the zone rules of the config language (proxy.config.zones), re-exported
    "API_DEFAULT_ZONES", "DEFAULT_METADATA_ADDRESSES", "DIAL", "ZONES", "Destination",
    "Destinations", "EgressDestinationDenied", "IPAddress", "IPNetwork", "Refused", "Resolver",
    "SystemResolver", "UpstreamEgress", "Zone", "admit", "classify", "is_metadata",
    "parse_addresses", "unwrap",
]

DIAL = "tollhouse.dial"  # the httpx request extension: the addresses `admit` answered

_THIS_HOST = ipaddress.ip_network("0.0.0.0/8")  # connect() to 0.x reaches this host on Linux
_LAN = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
    "fc00::/7", "fe80::/10", "fec0::/10"))
_EMBEDS_V4 = tuple(ipaddress.ip_network(n) for n in (
    "::ffff:0:0/96",   # IPv4-mapped
    "64:ff9b::/96",    # NAT64 well-known prefix
    "::/96",           # IPv4-compatible (deprecated, still accepted by some stacks)
))


def unwrap(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, compatible), else `ip`."""
    if ip.version == 6 and any(ip in net for net in _EMBEDS_V4):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


@functools.lru_cache(maxsize=4096)  # ipaddress's properties are slow; an address's zone is fixed
def classify(ip: IPAddress) -> Zone:
    """loopback: this host. lan: private, shared (CGNAT), link-local, unique-local, and every
    other address that is not globally routable (documentation, reserved, multicast), so an
    odd address never counts as `remote`, the one zone a run-time upstream may use."""
    ip = unwrap(ip)
    if ip.is_loopback or ip.is_unspecified or ip in _THIS_HOST:
        return "loopback"
    if any(ip in net for net in _LAN):
        return "lan"
    if ip.is_global and not ip.is_multicast:
        return "remote"
    return "lan"


def parse_addresses(values: Iterable[str]) -> frozenset[IPAddress]:
    """Raise ValueError on the first value that is not an IP address."""
    return frozenset(unwrap(ipaddress.ip_address(v)) for v in values)


_DEFAULT_METADATA = parse_addresses(DEFAULT_METADATA_ADDRESSES)


def is_metadata(ip: IPAddress, metadata: Collection[IPAddress] = _DEFAULT_METADATA) -> bool:
    return unwrap(ip) in metadata


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[str]:
        """Every address `host` has now, as IP strings; raise OSError when it has none."""


class SystemResolver:
    """getaddrinfo on the event loop's executor, with answers kept `ttl_s` seconds."""

    def __init__(self, ttl_s: float = 10.0, max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._cache: dict[tuple[str, int], tuple[float, list[str]]] = {}

    async def resolve(self, host: str, port: int) -> list[str]:
        key = (host, port)
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return list(hit[1])
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise OSError(f"{host} has no address")
        if len(self._cache) >= self._max_entries:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
        self._cache[key] = (now + self._ttl_s, addresses)
        return list(addresses)


class EgressDestinationDenied(UpstreamFailure):
    """The upstream resolves where it may not be dialled. The wire names no address; the
    server-side text (`str(exc)`) does, for the operator's log."""

    message = "upstream not reachable under the egress policy"
    expose_detail = False
    upstream_kind = "egress_denied"

    def __init__(self, detail: str | None = None, *, upstream: str = "") -> None:
        super().__init__(detail)
        self.upstream = upstream

    @property
    def audit_reason(self) -> str:
        return "egress_destination_denied"


@dataclass(frozen=True, slots=True)
class UpstreamEgress:
    """What the destination check needs of one upstream. A metadata address is allowed only
    when it is this upstream's literal host, so there is no separate flag to get wrong."""

    name: str
    host: str
    port: int
    zones: tuple[str, ...] = ZONES
    collections: tuple[str, ...] = ()

    @classmethod
    def from_url(cls, name: str, url: str, zones: Iterable[str] = ZONES,
                 collections: Iterable[str] = ()) -> UpstreamEgress:
        if "{" in url:  # per-caller (proxy.config.template): each resolved URL is added as
            # it is made (`Destinations.add_resolved`); this entry resolves nowhere
            return cls(name, "per-caller.invalid", 443, tuple(zones), tuple(collections))
        host, port = host_port(url)
        return cls(name, host, port, tuple(zones), tuple(collections))

    @classmethod
    def local(cls, name: str, collections: Iterable[str] = ()) -> UpstreamEgress:
        """A process the gateway runs (a stdio upstream): no host, so no destination check;
        its collection labels still decide who may receive its data. What the process
        itself dials is outside these rules (docs/per-caller-and-stdio.md)."""
        return cls(name, "", 0, ZONES, tuple(collections))


@dataclass(frozen=True, slots=True)
class Destination:
    """A host as `admit` checks it: made once per upstream, or per URL for a fetch."""

    host: str
    port: int
    zones: Collection[str]
    literal: IPAddress | None  # the host, when it is an address: its own answer, never resolved
    # the operator wrote this host: a cloud metadata address it names literally may be dialled
    named_by_operator: bool

    @classmethod
    def of(cls, host: str, port: int, zones: Collection[str], *,
           named_by_operator: bool = False) -> Destination:
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        return cls(host.strip("[]") if literal is not None else host, port, zones, literal,
                   named_by_operator)


class Refused(Exception):
    """`admit` found an address the request may not go to; the text names it, for logs only."""


async def admit(dest: Destination, resolver: Resolver,
                metadata: Collection[IPAddress] = _DEFAULT_METADATA) -> Sequence[str]:
    """Resolve (an address is its own answer), refuse, and answer what to dial. Raise Refused
    if any address is outside `dest.zones` or a metadata address the operator did not name,
    and OSError when the host has no address (nothing was checked, so nothing may be dialled).
    One refused address refuses the whole answer, so a rebinding mix is never half-dialled."""
    literal = dest.literal
    if literal is not None:
        addresses: Sequence[str] = [dest.host]
    else:
        addresses = await resolver.resolve(dest.host, dest.port)
        if not addresses:
            raise OSError(f"{dest.host} has no address")
    for text in addresses:
        try:
            ip = _address(text)
        except ValueError:
            raise Refused(f"{text!r} is not an address") from None
        zone = classify(ip)
        if zone not in dest.zones:
            raise Refused(f"{text} is in zone {zone}, outside {', '.join(dest.zones)}")
        if unwrap(ip) in metadata and not (dest.named_by_operator and ip == literal):
            raise Refused(f"{text} is a metadata address")
    return addresses


# a resolver's answer is parsed on every call's check: the same few addresses each time
_address = functools.lru_cache(maxsize=4096)(ipaddress.ip_address)


@dataclass(frozen=True, slots=True)
class _Pin:
    addresses: Sequence[str]
    expires: float


class Destinations:
    """The destination check and the pins it leaves, one per upstream: the egress policy's
    `check` runs it for every call that passes the chain, and the upstream client dials the
    pin (`admit`), checking afresh only when there is none."""

    def __init__(self, upstreams: Iterable[UpstreamEgress], resolver: Resolver,
                 metadata: Collection[IPAddress] = _DEFAULT_METADATA,
                 clock: Callable[[], float] = time.monotonic, pin_ttl_s: float = 30.0,
                 added: Published[Destination] | None = None) -> None:
        """`added`: the destinations of the servers the management API added
        (`published()`), which its registry publishes; the config file's are `add`ed."""
        self._resolver = resolver
        self._metadata = frozenset(unwrap(ip) for ip in metadata)
        self._clock = clock
        self._pin_ttl_s = pin_ttl_s
        self._pins: dict[str, _Pin] = {}
        self._destinations: dict[str, Destination] = {}
        # a destination written as an address: its verdict cannot change, so it is reached once
        # (the addresses it admitted) and not parsed and classified again on every call
        self._literal: dict[str, Sequence[str]] = {}
        self._local: set[str] = set()
        self._added = added if added is not None else self.published()
        self._added.on_change.append(self._forget)
        for upstream in upstreams:
            self.add(upstream)

    @staticmethod
    def published() -> Published[Destination]:
        """The table the management API's servers are published in (name -> UpstreamEgress
        with a host: an administrator's URL, checked as the operator's)."""
        return Published(lambda u: Destination.of(u.host, u.port, u.zones,
                                                  named_by_operator=True))

    def _forget(self, names: set[str]) -> None:
        """Published destinations changed or went: what was checked of them is no more."""
        for name in names:
            self._pins.pop(name, None)
            self._literal.pop(name, None)

    def add(self, upstream: UpstreamEgress) -> None:
        if not upstream.host:  # a local (stdio) process: nothing is dialled, nothing to check
            self._local.add(upstream.name)
            return
        self._local.discard(upstream.name)
        # an upstream's URL is the operator's (or an administrator's, through the API): a
        # metadata address it names literally is what they asked for
        self._destinations[upstream.name] = Destination.of(
            upstream.host, upstream.port, upstream.zones, named_by_operator=True)
        self._pins.pop(upstream.name, None)
        self._literal.pop(upstream.name, None)

    def add_resolved(self, key: str, host: str, port: int, zones: Collection[str]) -> None:
        """A per-caller upstream's URL, filled from caller data (proxy.upstream.tenants):
        checked like an operator's upstream, except that its host is not the operator's own
        writing, so a metadata address is refused even written literally."""
        self._destinations[key] = Destination.of(host, port, zones)
        self._pins.pop(key, None)
        self._literal.pop(key, None)

    def discard(self, name: str) -> None:
        self._destinations.pop(name, None)
        self._pins.pop(name, None)
        self._literal.pop(name, None)
        self._local.discard(name)

    def _destination(self, name: str) -> Destination | None:
        return self._destinations.get(name) or self._added.current.get(name)

    def pinned(self, name: str) -> list[str] | None:
        """The addresses checked most recently for `name`, while the pin lasts."""
        pin = self._pins.get(name)
        if pin is None or pin.expires <= self._clock():
            return None
        return list(pin.addresses)

    async def admit(self, name: str) -> Sequence[str]:
        """For the transport: the pin while it lasts, else a fresh check. Requests that never
        pass the policy chain (GET streams, relayed responses) are checked here too."""
        pin = self._pins.get(name)
        if pin is not None and pin.expires > self._clock():
            return pin.addresses
        return await self.check(name)

    async def check(self, name: str) -> Sequence[str]:
        """Resolve now, refuse or pin. Raise EgressDestinationDenied, or UpstreamUnavailable
        when the name does not resolve (nothing was checked, so nothing may be dialled)."""
        self._pins.pop(name, None)  # a refused or failed check leaves nothing to dial
        if name in self._local:
            return ()
        addresses = self._literal.get(name)
        if addresses is None:
            dest = self._destination(name)
            if dest is None:
                raise _denied(name, "no egress entry for this upstream")
            try:
                addresses = await admit(dest, self._resolver, self._metadata)
            except Refused as exc:
                raise _denied(name, str(exc)) from None
            except OSError:
                raise UpstreamUnavailable() from None
            if dest.literal is not None and self._destination(name) is dest:
                self._literal[name] = addresses
        self._pins[name] = _Pin(addresses, self._clock() + self._pin_ttl_s)
        return addresses


def _denied(upstream: str, why: str) -> EgressDestinationDenied:
    return EgressDestinationDenied(f"egress: upstream {upstream}: {why}", upstream=upstream)

"""Where requests may go: every upstream address is classified into a zone and checked before
it is dialled, and the connection is made to exactly the addresses that were checked.

A check resolves the upstream's host once, refuses the call if any address falls outside the
upstream's zones or is a cloud metadata address the upstream did not name, and pins the
addresses. The transport then dials the pin (`dialling` + `PinnedResolver` for aiohttp), never
resolving again, so a DNS answer that changes between check and connect (rebinding) cannot
move the connection. The data side (who may receive what) is the egress policy's, in
policies/egress.py; this module knows nothing of callers.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from proxy.errors import UpstreamFailure, UpstreamUnavailable

Zone = Literal["loopback", "lan", "remote"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ZONES: tuple[Zone, ...] = ("loopback", "lan", "remote")
API_DEFAULT_ZONES: tuple[Zone, ...] = ("remote",)  # an upstream registered at run time

# Instance metadata and credential endpoints: AWS (IMDS v4/v6, ECS task role, EKS pod
# identity), GCP, Azure (IMDS, WireServer), Alibaba, Tencent, Oracle Classic.
DEFAULT_METADATA_ADDRESSES: tuple[str, ...] = (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "169.254.170.23", "fd00:ec2::23",
    "fd20:ce::254", "168.63.129.16", "100.100.100.200", "169.254.0.23", "192.0.0.192",
)

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
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(name, parts.hostname.lower(), port, tuple(zones), tuple(collections))

    @property
    def literal(self) -> IPAddress | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class _Pin:
    addresses: tuple[str, ...]
    expires: float


class Destinations:
    """The destination check and the pins it leaves, one per upstream."""

    def __init__(self, upstreams: Iterable[UpstreamEgress], resolver: Resolver,
                 metadata: Collection[IPAddress] = _DEFAULT_METADATA,
                 clock: Callable[[], float] = time.monotonic, pin_ttl_s: float = 30.0) -> None:
        self._upstreams = {u.name: u for u in upstreams}
        self._resolver = resolver
        self._metadata = frozenset(unwrap(ip) for ip in metadata)
        self._clock = clock
        self._pin_ttl_s = pin_ttl_s
        self._pins: dict[str, _Pin] = {}

    def add(self, upstream: UpstreamEgress) -> None:
        self._upstreams[upstream.name] = upstream
        self._pins.pop(upstream.name, None)

    def discard(self, name: str) -> None:
        self._upstreams.pop(name, None)
        self._pins.pop(name, None)

    def pinned(self, name: str) -> list[str] | None:
        """The addresses checked most recently for `name`, while the pin lasts."""
        pin = self._pins.get(name)
        if pin is None or pin.expires <= self._clock():
            return None
        return list(pin.addresses)

    async def admit(self, name: str) -> list[str]:
        """For the transport: the pin while it lasts, else a fresh check. Requests that never
        pass the policy chain (GET streams, relayed responses) are checked here too."""
        return self.pinned(name) or await self.check(name)

    async def check(self, name: str) -> list[str]:
        """Resolve now, refuse or pin. Raise EgressDestinationDenied, or UpstreamUnavailable
        when the name does not resolve (nothing was checked, so nothing may be dialled)."""
        self._pins.pop(name, None)  # a refused or failed check leaves nothing to dial
        upstream = self._upstreams.get(name)
        if upstream is None:
            raise _denied(name, "no egress entry for this upstream")
        literal = upstream.literal
        if literal is not None:
            addresses = [upstream.host]
        else:
            try:
                addresses = await self._resolver.resolve(upstream.host, upstream.port)
            except OSError:
                raise UpstreamUnavailable() from None
            if not addresses:
                raise UpstreamUnavailable()
        for text in addresses:
            self._refuse_unless_allowed(upstream, literal, text)
        self._pins[name] = _Pin(tuple(addresses), self._clock() + self._pin_ttl_s)
        return list(addresses)

    def _refuse_unless_allowed(self, upstream: UpstreamEgress, literal: IPAddress | None,
                               text: str) -> None:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise _denied(upstream.name, f"{text!r} is not an address") from None
        zone = classify(ip)
        if zone not in upstream.zones:
            raise _denied(upstream.name,
                          f"{text} is in zone {zone}, outside {', '.join(upstream.zones)}")
        if unwrap(ip) in self._metadata and ip != literal:
            raise _denied(upstream.name, f"{text} is a metadata address")


def _denied(upstream: str, why: str) -> EgressDestinationDenied:
    return EgressDestinationDenied(f"egress: upstream {upstream}: {why}", upstream=upstream)


# -- the transport side: dial the pin, never resolve -------------------------------------------

_DIAL: ContextVar[tuple[str, tuple[str, ...]] | None] = ContextVar("egress_dial", default=None)


@contextmanager
def dialling(host: str, addresses: Iterable[str]) -> Iterator[None]:
    """Around one request to the transport: connections it opens to `host` go to
    `addresses` (from `Destinations.admit`), and to nothing else."""
    token = _DIAL.set((_bare(host), tuple(addresses)))
    try:
        yield
    finally:
        _DIAL.reset(token)


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver, answering only from the pin of the request in progress.

    Use with `aiohttp.TCPConnector(resolver=PinnedResolver(), use_dns_cache=False)`: with the
    cache on, aiohttp shares one lookup between concurrent requests for a host, which could
    hand one upstream's pin to another. aiohttp never asks a resolver about an IP literal;
    those are checked whole by `Destinations.check`. Any other question is an OSError, which
    aiohttp reports as a connect failure: nothing unchecked is dialled."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        dial = _DIAL.get()
        if dial is None or dial[0] != _bare(host):
            raise OSError(f"egress: no checked address for {host}")
        results: list[ResolveResult] = []
        for address in dial[1]:
            fam = socket.AF_INET6 if ":" in address else socket.AF_INET
            if family in (socket.AF_UNSPEC, fam):
                results.append(ResolveResult(
                    hostname=host, host=address, port=port, family=fam,
                    proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV))
        if not results:
            raise OSError(f"egress: no checked address for {host} in family {family!r}")
        return results

    async def close(self) -> None:
        return None


def _bare(host: str) -> str:
    return host.lower().rstrip(".").strip("[]")

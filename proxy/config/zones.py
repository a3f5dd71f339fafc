"""`[egress]` and an upstream's `zones` and `collections`: the zone names, the cloud metadata
addresses, the collection policies, and their checks.

These are rules of the config language, so they live here, below everything that applies
them: proxy.destinations classifies addresses into these zones and dials by them, policies/egress.py
decides who may receive which collection, and both import them from here."""

from __future__ import annotations

import ipaddress
import typing
from urllib.parse import urlsplit

from proxy.config.errors import ConfigError
from proxy.config.values import NAME

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, EgressConfig

Zone = typing.Literal["loopback", "lan", "remote"]
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

CollectionPolicy = typing.Literal["local_only", "lan", "remote"]
COLLECTION_POLICIES: tuple[CollectionPolicy, ...] = ("local_only", "lan", "remote")  # strictest first
MAX_COLLECTIONS = 64  # seed 000's cap on audit.collections
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def check(cfg: Config) -> None:
    """`[egress]`, every upstream's zones and collections, and `server.trusted_proxies`."""
    try:
        validate_egress(cfg.egress,
                        [(u.name, "" if u.stdio else u.url, u.zones, u.collections)
                         for u in cfg.upstreams],
                        cfg.server.trusted_proxies)
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None


def host_port(url: str) -> tuple[str, int]:
    """The host (lower case) and port an http(s) URL is dialled at; ValueError if it has no
    host or a bad port."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url!r} has no host")
    return parts.hostname.lower(), parts.port or (443 if parts.scheme == "https" else 80)


def validate_egress(egress: EgressConfig,
                    upstreams: typing.Sequence[tuple[str, str, typing.Sequence[str],
                                                     typing.Sequence[str]]],
                    trusted_proxies: typing.Sequence[str] = ()) -> None:
    """Raise ValueError naming the first offending key. `upstreams` are (name, url, zones,
    collections) in config order."""
    for label, policy in egress.collections.items():
        if not NAME.match(label):
            raise ValueError(f"egress.collections: {label!r} must be 1-64 letters, digits, "
                             "'-', '_' or '.', starting with a letter or digit")
        if policy not in COLLECTION_POLICIES:
            raise ValueError(f"egress.collections.{label}: {policy!r} is not one of "
                             f"{', '.join(COLLECTION_POLICIES)}")
    for i, address in enumerate(egress.metadata_addresses):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"egress.metadata_addresses[{i}]: {address!r} is not an IP "
                             "address") from None
    for i, (_name, url, zones, labels) in enumerate(upstreams):
        try:
            # none: a local (stdio) process, nothing to dial; a per-caller URL's hosts are
            # each checked as they are made (proxy.destinations, `Destinations.add_resolved`)
            if url and "{" not in url:
                host_port(url)
        except ValueError as exc:
            raise ValueError(f"upstreams[{i}].url: {exc}") from None
        validate_upstream_egress(f"upstreams[{i}]", zones, labels, egress.collections)
    parse_networks(trusted_proxies, "server.trusted_proxies")


def validate_upstream_egress(where: str, zones: typing.Sequence[str],
                             labels: typing.Sequence[str], policies: dict[str, str]) -> None:
    """One upstream's `zones` and `collections`, against `[egress.collections]`."""
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


def parse_networks(values: typing.Iterable[str], key: str) -> tuple[IPNetwork, ...]:
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

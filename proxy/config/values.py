"""The checks of one value that every section uses: a name, a URL, a positive number, one of a
few words. Each raises ConfigError naming the key."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from proxy.config.errors import ConfigError

# the name of an upstream, a virtual endpoint, a rule or a collection label; no ':', which
# delimits bucket keys, and the same rule the management API's bodies apply (proxy.strict)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_name(name: str, where: str, seen: set[str], noun: str) -> None:
    if not NAME.match(name):
        raise ConfigError(f"config: '{where}.name' must be 1-64 letters, digits, '-', '_' "
                          "or '.', starting with a letter or digit")
    if name in seen:
        raise ConfigError(f"config: '{where}.name' repeats the {noun} name '{name}'")
    seen.add(name)


def url(value: str, key: str) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"config: '{key}' is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"config: '{key}' must be an http:// or https:// URL with a host")


def positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"config: '{key}' must be greater than 0")


def one_of(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"config: '{key}' must be one of {', '.join(allowed)}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

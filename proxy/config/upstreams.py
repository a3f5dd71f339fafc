"""`[[upstreams]]`'s checks: an HTTP upstream's URL (or per-caller URL template), timeouts,
headers, era, identity, access rules, and a per_user upstream's OAuth client. A stdio
upstream's own keys are checked in proxy.config.stdio."""

from __future__ import annotations

import re
import typing

from proxy.config import stdio
from proxy.config.errors import ConfigError
from proxy.config.template import UrlTemplate
from proxy.config.values import check_name, positive, url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, UpstreamConfig

_IDENTITY_MODES = ("none", "headers", "jwt")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def check(cfg: Config) -> None:
    seen: set[str] = set()
    for i, up in enumerate(cfg.upstreams):
        _upstream(up, f"upstreams[{i}]", seen, cfg.auth.mode)


def _upstream(up: UpstreamConfig, where: str, seen: set[str], mode: str) -> None:
    check_name(up.name, where, seen, "upstream")
    if up.transport not in ("http", "stdio"):
        raise ConfigError(f"config: '{where}.transport' must be http or stdio")
    if up.stdio:
        stdio.check(up, where, mode)
    else:
        _http(up, where)
    positive(up.timeout_s, f"{where}.timeout_s")
    positive(up.total_timeout_s, f"{where}.total_timeout_s")
    for header in up.headers:
        if not _HEADER_NAME.match(header):
            raise ConfigError(f"config: '{where}.headers' has an invalid header name")
    if up.auth not in ("static", "per_user"):
        raise ConfigError(f"config: '{where}.auth' must be static or per_user")
    if up.auth == "per_user":
        _per_user(up, where, mode)
    if up.era not in ("auto", "legacy", "modern"):
        raise ConfigError(f"config: '{where}.era' must be one of auto, legacy, modern")
    if up.identity not in _IDENTITY_MODES:
        raise ConfigError(f"config: '{where}.identity' must be one of "
                          f"{', '.join(_IDENTITY_MODES)}")
    if up.access.restricts_callers and mode == "none":
        raise ConfigError(f"config: '{where}.access' restricts callers, which needs "
                          "auth.mode = \"jwt\" (every caller is anonymous in mode none)")


def _http(up: UpstreamConfig, where: str) -> None:
    if not up.url:
        raise ConfigError(f"config: missing required key '{where}.url'")
    if up.templated:
        _template(up, where)
    else:
        url(up.url, f"{where}.url")
    for key in stdio.STDIO_ONLY:
        if getattr(up, key):
            raise ConfigError(f"config: '{where}.{key}' is for transport = \"stdio\"")


def _template(up: UpstreamConfig, where: str) -> None:
    try:
        UrlTemplate.parse(up.url, {n: (p.claim, p.attribute, p.pattern)
                                   for n, p in up.placeholders.items()})
    except ValueError as exc:
        raise ConfigError(f"config: '{where}.url' {exc}") from None
    if up.auth == "per_user" and up.oauth.discover:
        raise ConfigError(f"config: '{where}.oauth.discover' cannot be used with a per-caller "
                          "url: name the authorization server's endpoints")
    if not 1 <= up.max_resolved <= 100_000:
        raise ConfigError(f"config: '{where}.max_resolved' must be between 1 and 100000")


def _per_user(up: UpstreamConfig, where: str, mode: str) -> None:
    o = up.oauth
    if up.stdio and o.discover:
        raise ConfigError(f"config: '{where}.oauth.discover' needs a URL to discover "
                          "from; a stdio upstream names its endpoints")
    if not o.discover and not (o.authorization_endpoint and o.token_endpoint
                               and o.client_id):
        raise ConfigError(f"config: '{where}.oauth' needs client_id, "
                          "authorization_endpoint and token_endpoint, or discover = true")
    for key in ("authorization_endpoint", "token_endpoint", "revocation_endpoint",
                "resource"):
        if getattr(o, key):
            url(getattr(o, key), f"{where}.oauth.{key}")
    if mode != "jwt":
        raise ConfigError(f"config: '{where}.auth' = \"per_user\" needs auth.mode = "
                          "\"jwt\": every caller is one anonymous principal otherwise")
    if any(h.lower() == "authorization" for h in up.headers):
        raise ConfigError(f"config: '{where}.headers' sets Authorization, which a "
                          "per_user upstream takes from each person's connection")

"""`[[endpoints]]`'s checks, and the naming rules a virtual endpoint's config must satisfy: the
separator, the MCP name rule an exposed name and an alias follow, which member owns an exposed
name, and the collisions a configuration shows (`config_collision`, which /api/v1 applies to an
endpoint it creates too). proxy.virtual.naming builds the exposed names on these rules."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Mapping

from proxy.config.errors import ConfigError
from proxy.config.values import NAME, check_name, positive

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config, EndpointConfig

NAME_RULE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # an MCP tool or prompt name
SEPARATOR_RULE = re.compile(r"^[A-Za-z0-9_.-]{1,8}$")


def check(cfg: Config) -> None:
    """Each collision the file itself shows stops start-up before any member is contacted."""
    seen: set[str] = set()
    upstreams = [u.name for u in cfg.upstreams]
    for i, ep in enumerate(cfg.endpoints):
        _endpoint(ep, f"endpoints[{i}]", seen, upstreams)
        if ep.access.restricts_callers and cfg.auth.mode == "none":
            raise ConfigError(f"config: 'endpoints[{i}].access' restricts callers, which needs "
                              "auth.mode = \"jwt\" (every caller is anonymous in mode none)")


def _endpoint(ep: EndpointConfig, where: str, seen: set[str], upstreams: list[str]) -> None:
    check_name(ep.name, where, seen, "endpoint")
    if not ep.members:
        raise ConfigError(f"config: '{where}.members' must name at least one upstream")
    for member in ep.members:
        if not NAME.match(member):
            raise ConfigError(f"config: '{where}.members' has an invalid name {member!r}")
    if not SEPARATOR_RULE.match(ep.separator):
        raise ConfigError(f"config: '{where}.separator' must be 1-8 letters, digits, "
                          "'_', '-' or '.'")
    if not 0 < ep.list_timeout_s <= 60:
        raise ConfigError(f"config: '{where}.list_timeout_s' must be greater than 0 and "
                          "at most 60 seconds")
    positive(ep.total_timeout_s, f"{where}.total_timeout_s")
    clash = config_collision(ep.name, ep.members, ep.separator, ep.aliases, upstreams)
    if clash is not None:
        raise ConfigError(f"config: {clash}")
    _search(ep, f"{where}.search")


SEARCH_MODES = ("off", "search")
META_TOOLS = ("search_tools", "call_tool")  # the names tool search lists (proxy/virtual/search)
MAX_RESULTS = 50


def _search(ep: EndpointConfig, where: str) -> None:
    search = ep.search
    if search.mode not in SEARCH_MODES:
        raise ConfigError(f"config: '{where}.mode' must be one of {', '.join(SEARCH_MODES)}")
    if not 1 <= search.max_results <= MAX_RESULTS:
        raise ConfigError(f"config: '{where}.max_results' must be 1 to {MAX_RESULTS}")
    for name in search.always:
        if not NAME_RULE.match(name) or name in META_TOOLS:
            raise ConfigError(f"config: '{where}.always' has {name[:80]!r}, which is no "
                              "exposed tool name (1-64 letters, digits, '_', '-' or '.')")
    if search.mode == "search":
        for alias in ep.aliases:
            if alias in META_TOOLS:
                raise ConfigError(f"config: endpoint {ep.name!r}: alias {alias!r} is the name "
                                  "of a tool search meta-tool")


def owner(name: str, members: Iterable[str], separator: str) -> tuple[str, str] | None:
    """(member, member's name) of an unshortened exposed name, None when no member owns it.
    The start-up checks make this unambiguous: no member's prefix is another's."""
    for member in members:
        prefix = member + separator
        if name.startswith(prefix) and len(name) > len(prefix):
            return member, name[len(prefix):]
    return None


def config_collision(name: str, members: list[str], separator: str,
                     aliases: Mapping[str, str], upstreams: Iterable[str]) -> str | None:
    """The first collision the configuration of endpoint `name` shows, as the text of one
    config error line (the exposed name and both sides), or None."""
    if name in set(upstreams):
        return f"endpoint {name!r} has the name of upstream {name!r}: /mcp/{name} is both"
    seen: set[str] = set()
    for member in members:
        if member in seen:
            return f"endpoint {name!r} lists member {member!r} twice"
        seen.add(member)
    for a in members:
        for b in members:
            if a != b and b.startswith(a + separator):
                return (f"endpoint {name!r}: exposed names '{b}{separator}<tool>' of member "
                        f"{b!r} are also names of member {a!r} (its tool '{b[len(a + separator):]}"
                        f"{separator}<tool>'): the separator {separator!r} runs them together")
    for alias, target in aliases.items():
        if not NAME_RULE.match(alias):
            return (f"endpoint {name!r}: alias {alias!r} must be 1-64 letters, digits, "
                    "'_', '-' or '.'")
        member, colon, tool = target.partition(":")
        if not colon or not tool or member not in seen:
            return (f"endpoint {name!r}: alias {alias!r} = {target!r} must be "
                    "\"<member>:<tool>\" naming one of its members")
        shaped = owner(alias, members, separator)
        if shaped is not None and shaped != (member, tool):
            return (f"endpoint {name!r}: exposed name {alias!r} is both the alias of "
                    f"{target!r} and member {shaped[0]!r}'s namespaced name of its tool "
                    f"{shaped[1]!r}")
    return None

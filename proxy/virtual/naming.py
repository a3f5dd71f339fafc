"""How a virtual endpoint names what its members offer, and how it reads those names back.

An exposed name is `<member><separator><name>` unless an alias names it. A name that breaks the
MCP name rules or runs past 64 characters is shortened deterministically (a readable head and a
digest of the whole), so the same member name is exposed under the same name after a restart,
on every replica. Resource URIs are namespaced reversibly (`tollhouse://<member>/<uri>`). The
start-up checks (`config_collision`) find the collisions the configuration itself shows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

MAX_NAME = 64
NAME_RULE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SEPARATOR_RULE = re.compile(r"^[A-Za-z0-9_.-]{1,8}$")
URI_PREFIX = "tollhouse://"
DIGEST = 10  # hex characters of sha256 in a shortened name


def exposed(member: str, name: str, separator: str) -> str:
    """The name a member's tool or prompt is exposed under (aliases aside)."""
    full = f"{member}{separator}{name}"
    if NAME_RULE.match(full):
        return full
    digest = hashlib.sha256(f"{member}\0{name}".encode()).hexdigest()[:DIGEST]
    head = re.sub(r"[^A-Za-z0-9_.-]", "_", full)[:MAX_NAME - DIGEST - 1]
    return f"{head}-{digest}"


def owner(name: str, members: Iterable[str], separator: str) -> tuple[str, str] | None:
    """(member, member's name) of an unshortened exposed name, None when no member owns it.
    The start-up checks make this unambiguous: no member's prefix is another's."""
    for member in members:
        prefix = member + separator
        if name.startswith(prefix) and len(name) > len(prefix):
            return member, name[len(prefix):]
    return None


def exposed_uri(member: str, uri: str) -> str:
    return f"{URI_PREFIX}{member}/{uri}"


def member_uri(uri: str, members: Iterable[str]) -> tuple[str, str] | None:
    """(member, member's URI) of an exposed URI (or URI template expanded by the client)."""
    if not uri.startswith(URI_PREFIX):
        return None
    member, slash, rest = uri[len(URI_PREFIX):].partition("/")
    if not slash or member not in set(members):
        return None
    return member, rest


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

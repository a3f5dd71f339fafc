"""How a virtual endpoint names what its members offer, and how it reads those names back.

An exposed name is `<member><separator><name>` unless an alias names it. A name that breaks the
MCP name rules or runs past 64 characters is shortened deterministically (a readable head and a
digest of the whole), so the same member name is exposed under the same name after a restart,
on every replica. Resource URIs are namespaced reversibly: an MCP Apps `ui://` URI keeps its
scheme, with the member as its first segment (`ui://<member>/<rest>`: a host renders a UI
resource only under `ui://`), any other URI is wrapped (`tollhouse://<member>/<uri>`). The
rules a configuration must satisfy for this to be unambiguous (the name rule, the separator,
`owner`, `config_collision`) are the config language's, in proxy.config.endpoints.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from proxy.config.endpoints import NAME_RULE, owner

__all__ = ["NAME_RULE", "exposed", "exposed_uri", "member_uri", "owner"]

MAX_NAME = 64
URI_PREFIX = "tollhouse://"
UI_SCHEME = "ui://"  # MCP Apps (SEP-1865): namespaced inside its own scheme
DIGEST = 10  # hex characters of sha256 in a shortened name


def exposed(member: str, name: str, separator: str) -> str:
    """The name a member's tool or prompt is exposed under (aliases aside)."""
    full = f"{member}{separator}{name}"
    if NAME_RULE.match(full):
        return full
    digest = hashlib.sha256(f"{member}\0{name}".encode()).hexdigest()[:DIGEST]
    head = re.sub(r"[^A-Za-z0-9_.-]", "_", full)[:MAX_NAME - DIGEST - 1]
    return f"{head}-{digest}"


def exposed_uri(member: str, uri: str) -> str:
    """The URI (or URI template) a member's resource is exposed under."""
    if uri.startswith(UI_SCHEME):
        return f"{UI_SCHEME}{member}/{uri[len(UI_SCHEME):]}"
    return f"{URI_PREFIX}{member}/{uri}"


def member_uri(uri: str, members: Iterable[str]) -> tuple[str, str] | None:
    """(member, member's URI) of an exposed URI (or URI template expanded by the client)."""
    if uri.startswith(UI_SCHEME):
        prefix, original = UI_SCHEME, UI_SCHEME
    elif uri.startswith(URI_PREFIX):
        prefix, original = URI_PREFIX, ""
    else:
        return None
    member, slash, rest = uri[len(prefix):].partition("/")
    if not slash or member not in set(members):
        return None
    return member, original + rest


"""The names a virtual endpoint exposes for its members' tools, prompts and resources: one
member's name as the endpoint exposes it now (an alias, a namespaced name, a namespaced URI:
`expose`), and the table learned from every list through the endpoint (exposed name ->
member and member's name, per endpoint and kind), by which a call finds its member.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.virtual import naming
from proxy.virtual.route import VirtualRoute


def expose(route: VirtualRoute, kind: str, member: str, original: str) -> str:
    """The name a member's tool, prompt ("tool", "prompt") or URI ("uri") is exposed under."""
    if kind == "uri":
        return naming.exposed_uri(member, original)
    if kind == "tool":
        alias = route.aliased.get((member, original))
        if alias is not None:
            return alias
    return naming.exposed(member, original, route.separator)


class Exposed:
    """The names the members listed, as each endpoint exposes them."""

    def __init__(self) -> None:
        # exposed name -> (member, member's name), per endpoint and kind: learned from lists
        self._names: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}

    def learn(self, route: VirtualRoute, kind: str, listed: Mapping[str, list[str]]) -> None:
        """The names the members listed, as this endpoint exposes them (the first member in
        the endpoint's order keeps a name two would share)."""
        if kind == "uri":
            return
        names = self._names.setdefault((route.name, kind), {})
        claimed: set[str] = set()
        for member in route.members:
            for original in listed.get(member, ()):
                exposed = expose(route, kind, member, original)
                if exposed not in claimed:
                    claimed.add(exposed)
                    names[exposed] = (member, original)

    def owner(self, route: VirtualRoute, kind: str, exposed: str) -> tuple[str, str] | None:
        """(member, member's name) of an exposed name, if a member listed it and the endpoint
        exposes it under this name now: an aliased tool has its alias only (its namespaced
        name is unknown), and a name learned before an alias or a member changed is not."""
        if kind == "uri":
            return naming.member_uri(exposed, route.members)
        owner = self._names.get((route.name, kind), {}).get(exposed)
        if owner is None or owner[0] not in route.members \
                or expose(route, kind, *owner) != exposed:
            return None
        return owner

    def clear(self) -> None:
        """Forget every name learned (as after a restart: learned again on a miss)."""
        self._names.clear()

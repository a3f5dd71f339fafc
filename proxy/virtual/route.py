"""A virtual endpoint as the edge routes it: several upstream members behind one /mcp/<name>,
prepared once from its `[[endpoints]]` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from proxy.config import EndpointConfig
from proxy.config.tables import SearchConfig


@dataclass(frozen=True, slots=True)
class VirtualRoute:
    name: str
    members: tuple[str, ...]
    separator: str
    list_timeout_s: float
    total_timeout_s: float
    aliases: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # exposed -> owner
    aliased: Mapping[tuple[str, str], str] = field(default_factory=dict)  # owner -> exposed
    url_text: str = ""  # no URL of its own: each member has one
    # tool search (proxy/virtual/meta_tools.py)
    search: SearchConfig = field(default_factory=SearchConfig)

    # what the spine reads of any route (proxy/upstream/client.py `UpstreamRoute`): a virtual
    # endpoint is no per-caller template, and its sessions and egress entries go by its name
    template = None

    @property
    def session_endpoint(self) -> str:
        return self.name

    @property
    def dial_key(self) -> str:
        return self.name

    @classmethod
    def from_config(cls, cfg: EndpointConfig) -> VirtualRoute:
        aliases = {}
        for exposed, target in cfg.aliases.items():
            member, _, tool = target.partition(":")
            aliases[exposed] = (member, tool)
        return cls(cfg.name, tuple(cfg.members), cfg.separator, cfg.list_timeout_s,
                   cfg.total_timeout_s, aliases, {v: k for k, v in aliases.items()},
                   search=cfg.search)

    @property
    def searched(self) -> bool:
        """Whether tools/list shows the tool search meta-tools in place of the tools."""
        return self.search.mode == "search"

"""A virtual endpoint's /api/v1 bodies (`/api/v1/endpoints`), built like a server's
(proxy/strict.py): strict JSON, a PATCH field sent as null is a 422."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, model_validator

from proxy.config import AccessConfig, EndpointConfig
from proxy.config.endpoints import MAX_RESULTS, META_TOOLS, NAME_RULE, SEPARATOR_RULE
from proxy.config.tables import SearchConfig
from proxy.strict import NAME, Access, Strict, TableBody, number, unsent

Member = Annotated[str, Field(pattern=NAME)]
SEPARATOR = SEPARATOR_RULE.pattern


def _exposed(name: str) -> str:
    if name in META_TOOLS:
        raise ValueError(f"{name!r} is the name of a tool search meta-tool")
    return name


class SearchIn(Strict):
    """Tool search (docs/virtual-endpoints.md, "Tool search"): the config's
    `[endpoints.search]` table."""

    mode: Literal["off", "search"] = "off"
    max_results: int = Field(SearchConfig.max_results, ge=1, le=MAX_RESULTS)
    always: list[Annotated[str, Field(pattern=NAME_RULE.pattern), AfterValidator(_exposed)]] = Field(
        default_factory=list, max_length=1000)


Search = Annotated[SearchConfig, TableBody(SearchIn)]


class EndpointIn(Strict):
    """Several upstream servers behind one /mcp/<name> (docs/virtual-endpoints.md)."""

    name: str = Field(pattern=NAME)
    members: list[Member] = Field(min_length=1, max_length=64)
    separator: str = Field(EndpointConfig.separator, pattern=SEPARATOR)
    list_timeout_s: float = number(EndpointConfig.list_timeout_s, gt=0, le=60)
    total_timeout_s: float = number(EndpointConfig.total_timeout_s, gt=0, le=86400)
    aliases: dict[str, str] = Field(default_factory=dict)
    access: Access = Field(default_factory=AccessConfig)
    search: Search = Field(default_factory=SearchConfig)

    @model_validator(mode="after")
    def _no_alias_is_a_meta_tool(self) -> EndpointIn:
        if self.search.mode == "search":
            for alias in self.aliases:
                if alias in META_TOOLS:
                    raise ValueError(f"alias {alias!r} is the name of a tool search meta-tool")
        return self


class EndpointPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    members: list[Member] = unsent(min_length=1, max_length=64)
    separator: str = unsent(pattern=SEPARATOR)
    list_timeout_s: float = number(gt=0, le=60)
    total_timeout_s: float = number(gt=0, le=86400)
    aliases: dict[str, str] = unsent()
    access: Access = unsent()
    search: Search = unsent()


class EndpointOut(BaseModel):
    name: str
    members: list[str]
    separator: str
    list_timeout_s: float
    total_timeout_s: float
    aliases: dict[str, str]
    access: Access
    search: Search
    source: Literal["config", "api"]
    mcp_url: str

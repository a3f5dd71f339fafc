"""A virtual endpoint's /api/v1 bodies (`/api/v1/endpoints`), built like a server's
(proxy/strict.py): strict JSON, a PATCH field sent as null is a 422."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from proxy.config import AccessConfig, EndpointConfig
from proxy.config.endpoints import SEPARATOR_RULE
from proxy.strict import NAME, Access, Strict, number, unsent

Member = Annotated[str, Field(pattern=NAME)]
SEPARATOR = SEPARATOR_RULE.pattern


class EndpointIn(Strict):
    """Several upstream servers behind one /mcp/<name> (docs/virtual-endpoints.md)."""

    name: str = Field(pattern=NAME)
    members: list[Member] = Field(min_length=1, max_length=64)
    separator: str = Field(EndpointConfig.separator, pattern=SEPARATOR)
    list_timeout_s: float = number(EndpointConfig.list_timeout_s, gt=0, le=60)
    total_timeout_s: float = number(EndpointConfig.total_timeout_s, gt=0, le=86400)
    aliases: dict[str, str] = Field(default_factory=dict)
    access: Access = Field(default_factory=AccessConfig)


class EndpointPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    members: list[Member] = unsent(min_length=1, max_length=64)
    separator: str = unsent(pattern=SEPARATOR)
    list_timeout_s: float = number(gt=0, le=60)
    total_timeout_s: float = number(gt=0, le=86400)
    aliases: dict[str, str] = unsent()
    access: Access = unsent()


class EndpointOut(BaseModel):
    name: str
    members: list[str]
    separator: str
    list_timeout_s: float
    total_timeout_s: float
    aliases: dict[str, str]
    access: Access
    source: Literal["config", "api"]
    mcp_url: str

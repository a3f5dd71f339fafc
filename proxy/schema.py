"""The strict JSON bodies below the management API: the model basics every /api/v1 body is
built from, and an upstream server's shapes, which `proxy.registry` stores and lists and
/api/v1 validates with (`proxy.api.models` has the others; the OpenAPI document is built from
both).

Request bodies are strict where JSON has a type of its own: a boolean is true or false (never
"yes" or 1), a number is a JSON number (never "5" or true; an integer is a number). A PATCH
field that cannot be null is a 422 when sent as null: its default of None stands for "not
sent", which the routes read as "unchanged"."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Zone = Literal["loopback", "lan", "remote"]


def _remote() -> list[Zone]:
    return ["remote"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def unsent(**constraints: Any) -> Any:
    """The default of a PATCH field that may be left out but not sent as null: None, which
    pydantic does not validate, while an explicit null fails the field's (non-null) type."""
    return Field(None, **constraints)


def number(default: Any = None, **constraints: Any) -> Any:
    """A strict JSON number (an integer is one; "5" and true are not), finite."""
    return Field(default, strict=True, allow_inf_nan=False, **constraints)


class ToolProfileIn(Strict):
    tools_allow: list[str] = Field(default_factory=list)
    tools_deny: list[str] = Field(default_factory=list)


class AccessIn(Strict):
    """Who may use the endpoint, and which tools, prompts and resources (glob patterns)."""

    allow_subjects: list[str] = Field(default_factory=list)
    allow_groups: list[str] = Field(default_factory=list)
    allow_scopes: list[str] = Field(default_factory=list)
    allow_keys: list[str] = Field(default_factory=list)
    tools_allow: list[str] = Field(default_factory=list)
    tools_deny: list[str] = Field(default_factory=list)
    group_tools: dict[str, ToolProfileIn] = Field(default_factory=dict)
    prompts_allow: list[str] = Field(default_factory=list)
    prompts_deny: list[str] = Field(default_factory=list)
    resources_allow: list[str] = Field(default_factory=list)
    resources_deny: list[str] = Field(default_factory=list)


def _no_credentials(url: HttpUrl) -> HttpUrl:
    if url.username or url.password:
        raise ValueError("a server URL may not carry credentials: every administrator "
                         "would see them")
    return url


UpstreamUrl = Annotated[HttpUrl, AfterValidator(_no_credentials)]


class ServerIn(Strict):
    """An upstream MCP server served at /mcp/<name>."""

    name: str = Field(pattern=NAME)
    url: UpstreamUrl
    timeout_s: float = number(30.0, gt=0, le=3600)
    total_timeout_s: float = number(300.0, gt=0, le=86400)
    zones: list[Zone] = Field(default_factory=_remote, min_length=1)
    era: Literal["auto", "legacy", "modern"] = "auto"
    access: AccessIn = Field(default_factory=AccessIn)


class ServerPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    url: UpstreamUrl = unsent()
    timeout_s: float = number(gt=0, le=3600)
    total_timeout_s: float = number(gt=0, le=86400)
    zones: list[Zone] = unsent(min_length=1)
    era: Literal["auto", "legacy", "modern"] = unsent()
    access: AccessIn = unsent()


class ServerOut(BaseModel):
    name: str
    url: str
    timeout_s: float
    total_timeout_s: float
    zones: list[str]
    era: str
    source: Literal["config", "api"]
    mcp_url: str
    access: AccessIn

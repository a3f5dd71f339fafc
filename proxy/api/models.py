"""Request and response bodies of /api/v1, validated with pydantic; the OpenAPI document is
built from these same models.

Request bodies are strict where JSON has a type of its own: a boolean is true or false (never
"yes" or 1), a number is a JSON number (never "5" or true; an integer is a number). A PATCH
field that cannot be null is a 422 when sent as null: its default of None stands for "not
sent", which the routes read as "unchanged"."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, StrictBool

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
USER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
KEY_ID = r"^[a-z0-9]{10}$"
# free text: no control characters but tab and newline
TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
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


class RoleIn(Strict):
    """A custom role: a group its holders are in, for `allow_groups` and `group_tools`."""

    name: str = Field(pattern=NAME)
    description: str = Field("", max_length=500, pattern=TEXT)


class RolePatch(Strict):
    description: str = unsent(max_length=500, pattern=TEXT)


class Role(BaseModel):
    name: str
    description: str
    source: Literal["builtin", "api"]


RoleName = Annotated[str, Field(pattern=NAME)]
Expiry = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


class KeyIn(Strict):
    name: str = Field(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str] = Field(default_factory=list)
    role: Literal["", "admin"] = ""
    expires_in_days: float | None = number(gt=0, le=36500)


class KeyPut(Strict):
    """Every editable field of a key. `endpoints` and `expires_at` are required (null: never
    expires) so that leaving one out cannot widen the key; `id`, if sent, must be the path's."""

    id: str | None = None
    name: str = Field(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str]
    role: Literal["", "admin"] = ""
    expires_at: Expiry | None


class KeyPatch(Strict):
    """The fields sent are changed. Only `expires_at` may be null (no expiry); the others,
    if sent, must have a value (their None default stands for "not sent")."""

    id: str | None = None
    name: str = unsent(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str] = unsent()
    role: Literal["", "admin"] = unsent()
    expires_at: Expiry | None = None


class KeyOut(BaseModel):
    id: str
    name: str
    prefix: str
    endpoints: list[str]
    role: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    status: str


class KeyCreated(KeyOut):
    key: str  # the secret, shown once


class UserIn(Strict):
    name: str = Field(pattern=USER_NAME)
    password: str = Field(min_length=8, max_length=1024)
    admin: StrictBool = False
    roles: list[RoleName] = Field(default_factory=list, max_length=100)


class UserPut(Strict):
    """A user's every editable field: as UserIn, but the password may be left out (it stays);
    a federated user has none here."""

    name: str = Field(pattern=USER_NAME)
    password: str | None = Field(None, min_length=8, max_length=1024)
    admin: StrictBool = False
    roles: list[RoleName] = Field(default_factory=list, max_length=100)


class UserPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    admin: StrictBool = unsent()
    password: str = unsent(min_length=8, max_length=1024)
    roles: list[RoleName] = unsent(max_length=100)


class UserOut(BaseModel):
    id: str
    name: str
    issuer: str
    subject: str
    admin: bool
    roles: list[str]


class Me(BaseModel):
    subject: str
    issuer: str
    name: str
    admin: bool
    via: Literal["cookie", "api_key"]


class AuditPage(BaseModel):
    items: list[dict[str, object]]
    next_cursor: str | None


class UsageRow(BaseModel):
    principal: str
    endpoint: str
    tool: str | None
    calls: int
    ok: int
    denied: int
    error: int
    cancelled: int
    bytes_in: int
    bytes_out: int
    duration_ms: float

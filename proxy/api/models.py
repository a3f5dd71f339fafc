"""Request and response bodies of /api/v1, validated with pydantic; the OpenAPI document is
built from these same models. A server's (`ServerIn`, `ServerPatch`, `ServerOut`) and the
strict-model basics live in `proxy.strict`, below the registry that stores servers, and are
re-exported here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictBool

from proxy.people.accounts import USER_NAME
from proxy.strict import NAME, ServerIn, ServerOut, ServerPatch, Strict, number, unsent

__all__ = ["NAME", "USER_NAME", "ServerIn", "ServerOut", "ServerPatch"]  # re-exported

KEY_ID = r"^[a-z0-9]{10}$"
# free text: no control characters but tab and newline
TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"


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
# an API key's role: "" (an endpoint key, or a management key that reads what a person does),
# "admin", or "auditor" (reads the audit log, usage, policies and the audit evidence's status;
# changes nothing; a management key only: never valid at an MCP endpoint)
KeyRole = Literal["", "admin", "auditor"]
Expiry = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


class KeyIn(Strict):
    name: str = Field(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str] = Field(default_factory=list)
    role: KeyRole = ""
    expires_in_days: float | None = number(gt=0, le=36500)


class MyKeyIn(KeyIn):
    """A person's own key (/api/v1/me/keys) names its endpoints, one at least: left out, as
    an empty list, a key would be valid on every endpoint, those made later too."""

    endpoints: list[str] = Field(json_schema_extra={"minItems": 1})


class KeyPut(Strict):
    """Every editable field of a key. `endpoints` and `expires_at` are required (null: never
    expires) so that leaving one out cannot widen the key; `id`, if sent, must be the path's."""

    id: str | None = None
    name: str = Field(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str]
    role: KeyRole = ""
    expires_at: Expiry | None


class KeyPatch(Strict):
    """The fields sent are changed. Only `expires_at` may be null (no expiry); the others,
    if sent, must have a value (their None default stands for "not sent")."""

    id: str | None = None
    name: str = unsent(min_length=1, max_length=100, pattern=TEXT)
    endpoints: list[str] = unsent()
    role: KeyRole = unsent()
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


# what fills a per-caller upstream URL's placeholders no token claim fills
# (proxy.config.template): names as a claim's, values short text
AttributeName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]
AttributeValue = Annotated[str, Field(max_length=253)]
Attributes = Annotated[dict[AttributeName, AttributeValue], Field(max_length=64)]


class UserIn(Strict):
    name: str = Field(pattern=USER_NAME)
    password: str = Field(min_length=8, max_length=1024)
    admin: StrictBool = False
    roles: list[RoleName] = Field(default_factory=list, max_length=100)
    attributes: Attributes = Field(default_factory=dict)


class UserPut(Strict):
    """A user's every editable field: as UserIn, but the password may be left out (it stays);
    a federated user has none here."""

    name: str = Field(pattern=USER_NAME)
    password: str | None = Field(None, min_length=8, max_length=1024)
    admin: StrictBool = False
    roles: list[RoleName] = Field(default_factory=list, max_length=100)
    attributes: Attributes = Field(default_factory=dict)  # replaced whole


class UserPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    admin: StrictBool = unsent()
    password: str = unsent(min_length=8, max_length=1024)
    roles: list[RoleName] = unsent(max_length=100)
    attributes: Attributes = unsent()  # replaced whole when sent


class UserOut(BaseModel):
    id: str
    name: str
    issuer: str
    subject: str
    admin: bool
    roles: list[str]
    attributes: dict[str, str] = Field(default_factory=dict)


class Me(BaseModel):
    subject: str
    issuer: str
    name: str
    admin: bool
    auditor: bool  # holds the role `auditor`: reads the audit evidence, changes nothing
    # "bearer": a JWT the MCP edge accepts, on the routes of approvals only
    via: Literal["cookie", "api_key", "bearer"]


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

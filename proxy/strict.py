"""The strict JSON bodies below the management API: the model basics every /api/v1 body is
built from, and an upstream server's shapes, which `proxy.servers` stores and lists and
/api/v1 validates with (`proxy.api.models` has the others; the OpenAPI document is built from
both).

Request bodies are strict where JSON has a type of its own: a boolean is true or false (never
"yes" or 1), a number is a JSON number (never "5" or true; an integer is a number). A PATCH
field that cannot be null is a 422 when sent as null: its default of None stands for "not
sent", which the routes read as "unchanged".

A body that carries a config table has one definition, the config's dataclass: `body_of`
derives the body model from its fields (`AccessIn` from `proxy.config.AccessConfig`), and a
field typed `Access` holds the `AccessConfig` itself, which the registries publish to the
access policy as they store it."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    HttpUrl,
    TypeAdapter,
    create_model,
)
from pydantic_core import core_schema

from proxy.config import AccessConfig, ToolProfile, UpstreamConfig
from proxy.config.values import NAME as _NAME
from proxy.config.zones import API_DEFAULT_ZONES, Zone

NAME = _NAME.pattern  # the config's name rule


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def unsent(**constraints: Any) -> Any:
    """The default of a PATCH field that may be left out but not sent as null: None, which
    pydantic does not validate, while an explicit null fails the field's (non-null) type."""
    return Field(None, **constraints)


def number(default: Any = None, **constraints: Any) -> Any:
    """A strict JSON number (an integer is one; "5" and true are not), finite."""
    return Field(default, strict=True, allow_inf_nan=False, **constraints)


# -- a config table as a body: one definition for both ------------------------------------------

def body_of(table: type[Any], name: str,
            nested: Mapping[type[Any], type[BaseModel]] | None = None) -> type[Strict]:
    """The strict body model of the config dataclass `table`: its fields, types and defaults
    (and its docstring, if written), each nested dataclass as the body model `nested` names.
    The model validates and documents the body; `TableBody` hands on the dataclass itself."""
    swap = dict(nested or {})
    hints = typing.get_type_hints(table)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(table):
        default: Any = (Field(default_factory=f.default_factory)
                        if f.default_factory is not dataclasses.MISSING else f.default)
        fields[f.name] = (_swapped(hints[f.name], swap),
                          ... if default is dataclasses.MISSING else default)
    doc = table.__doc__ if not (table.__doc__ or "").startswith(f"{table.__name__}(") else None
    model: type[Strict] = create_model(name, __base__=Strict, __module__=__name__,
                                       __doc__=doc, **fields)
    return model


def _swapped(tp: Any, swap: Mapping[type[Any], type[BaseModel]]) -> Any:
    if tp in swap:
        return swap[tp]
    args = typing.get_args(tp)
    if not args:
        return tp
    return typing.get_origin(tp)[tuple(_swapped(a, swap) for a in args)]


@dataclasses.dataclass(frozen=True)
class TableBody:
    """`Annotated[SomeConfig, TableBody(SomeIn)]`: a field that /api/v1 validates, documents
    and answers as the body model `SomeIn` (derived with `body_of`), holding the config
    dataclass itself, so nothing converts between the two by hand."""

    model: type[BaseModel]

    def __get_pydantic_core_schema__(self, source: type[Any],
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        table = TypeAdapter(source)

        def validate(value: Any, body: Callable[[Any], BaseModel]) -> Any:
            if isinstance(value, source):  # built from the config file already
                return value
            return table.validate_python(body(value).model_dump())

        return core_schema.no_info_wrap_validator_function(
            validate, handler.generate_schema(self.model),
            serialization=core_schema.plain_serializer_function_ser_schema(
                dataclasses.asdict, when_used="unless-none"))


ToolProfileIn = body_of(ToolProfile, "ToolProfileIn")
AccessIn = body_of(AccessConfig, "AccessIn", {ToolProfile: ToolProfileIn})
# who may use a server or virtual endpoint, and which tools, prompts and resources: the config's
# `access` table, as the API's bodies carry it
Access = Annotated[AccessConfig, TableBody(AccessIn)]


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
    timeout_s: float = number(UpstreamConfig.timeout_s, gt=0, le=3600)
    total_timeout_s: float = number(UpstreamConfig.total_timeout_s, gt=0, le=86400)
    zones: list[Zone] = Field(default_factory=lambda: list(API_DEFAULT_ZONES), min_length=1)
    era: Literal["auto", "legacy", "modern"] = "auto"
    access: Access = Field(default_factory=AccessConfig)


class ServerPatch(Strict):
    """The fields sent are changed; none may be null (None stands for "not sent")."""

    url: UpstreamUrl = unsent()
    timeout_s: float = number(gt=0, le=3600)
    total_timeout_s: float = number(gt=0, le=86400)
    zones: list[Zone] = unsent(min_length=1)
    era: Literal["auto", "legacy", "modern"] = unsent()
    access: Access = unsent()


class ServerOut(BaseModel):
    name: str
    url: str
    timeout_s: float
    total_timeout_s: float
    zones: list[str]
    era: str
    source: Literal["config", "api"]
    mcp_url: str
    access: Access

"""The SCIM resources as `scim2-server` asks for them (`AsyncScimStorage`), kept in the database
through `proxy.people.directory`: a User is a person (a `users` row, with its SCIM document
beside it), a Group a SCIM group. A search reads every resource of its type and filters,
sorts and pages them here with `scim2-models`' own filter evaluation: the people of one
gateway are thousands, not millions, and one read keeps `totalResults` and the pages exact.

What a change means for the person (deprovisioning when `active` goes false or they are
deleted, the account back when it goes true) is `Changes`' to do: it runs before the SCIM call
answers."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, Union

from scim2_models import (
    InvalidValueException,
    NotFoundException,
    NotImplementedException,
    PreconditionFailedException,
    Resource,
    ResourceType,
    ResponseParameters,
    SCIMException,
    ScimFilter,
    SearchRequest,
    UniquenessException,
)
from scim2_server.storage import AsyncScimStorage, SearchPage
from scim2_server.utils import parametrize

from proxy.people.directory import Directory, Missing, Row, Stale, Taken, facts_of

R = TypeVar("R")
USER, GROUP = "User", "Group"


class Unavailable(SCIMException):
    """The database is out of reach: 503, in SCIM's shape."""

    status = 503
    scim_type = ""
    _default_detail = "The gateway's database is out of reach; try again"


class Changes(Protocol):
    """What a change to a person means beyond their SCIM resource (proxy.people.deprovision)."""

    async def deactivated(self, user_id: str) -> None: ...

    async def reactivated(self, user_id: str) -> None: ...

    async def deleted(self, user_id: str) -> None:
        """Called before the person's rows are deleted (their credentials are found by them)."""


class NoChanges:
    async def deactivated(self, user_id: str) -> None:
        return None

    async def reactivated(self, user_id: str) -> None:
        return None

    async def deleted(self, user_id: str) -> None:
        return None


class ScimStore(AsyncScimStorage):
    """Users and Groups in the database. `models` gives the model of each resource type."""

    def __init__(self, directory: Directory, models: Callable[[str], type[Resource[Any]]],
                 changes: Changes | None = None) -> None:
        self._directory = directory
        self._models = models
        self.changes: Changes = changes or NoChanges()

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        try:
            return await asyncio.to_thread(fn, *args)
        except Taken as exc:
            raise UniquenessException(detail=f"{exc} is taken") from None
        except Stale:
            raise PreconditionFailedException() from None
        except self._directory.errors:
            raise Unavailable() from None

    async def _changed(self, change: Callable[[str], Awaitable[None]], user_id: str) -> None:
        """What the change means for the person, before the call answers; a step that could
        not be taken (a store out of reach) answers 503, and the identity provider sends the
        call again (every step runs again: each is harmless twice)."""
        try:
            await change(user_id)
        except Exception:  # noqa: BLE001 - logged where it failed; SCIM's 503 here
            raise Unavailable() from None

    async def get(self, resource_type: ResourceType, resource_id: str, *,
                  response_parameters: ResponseParameters[Any] | None = None) -> Resource[Any]:
        read = self._directory.person if resource_type.name == USER else self._directory.group
        try:
            row = await self._run(read, resource_id)
        except Missing:
            raise NotFoundException(detail=f"{resource_type.name} {resource_id!r} not found"
                                    ) from None
        return self._resource(resource_type.name or "", row)

    async def search(self, resource_types: list[ResourceType],
                     search_request: SearchRequest[Any], *, position: Any = None) -> SearchPage:
        if len(resource_types) != 1:
            raise NotImplementedException(detail="search one resource type at a time")
        name = resource_types[0].name or ""
        rows = await self._run(self._directory.people if name == USER
                               else self._directory.groups)
        resources = [self._resource(name, row) for row in rows]
        found = _filtered(search_request, self._models(name), resources)
        descending = (search_request.sort_by is not None
                      and search_request.sort_order == SearchRequest.SortOrder.descending)
        if search_request.sort_by is not None:
            found.sort(key=lambda r: _sort_key(search_request, r), reverse=descending)
        start = search_request.start_index_0 or 0
        stop = None if search_request.count is None else start + search_request.count
        return SearchPage(len(found), found[start:stop])

    async def create(self, resource_type: ResourceType, resource: Resource[Any]
                     ) -> Resource[Any]:
        doc = _document(resource)
        if resource_type.name == USER:
            facts = facts_of(doc)
            row = await self._run(self._directory.create_person, doc, facts)
            if not facts.active:
                await self._changed(self.changes.deactivated, row.id)
            return self._resource(USER, await self._run(self._directory.person, row.id))
        members = _members(resource)
        try:
            row = await self._run(self._directory.create_group, doc, doc.get("displayName", ""),
                                  doc.get("externalId"), members)
        except Missing as exc:
            raise InvalidValueException(detail=f"no User {exc}") from None
        return self._resource(GROUP, row)

    async def update(self, resource_type: ResourceType, resource: Resource[Any], *,
                     expected_version: str | None = None) -> Resource[Any]:
        expected = _version(expected_version)
        doc = _document(resource)
        rid = str(resource.id)
        try:
            if resource_type.name == USER:
                row, was, now = await self._run(self._directory.replace_person, rid, doc,
                                                facts_of(doc), expected)
                if was and not now:
                    await self._changed(self.changes.deactivated, rid)
                elif now and not was:
                    await self._changed(self.changes.reactivated, rid)
                return self._resource(USER, row)
            row = await self._run(self._directory.replace_group, rid, doc,
                                  doc.get("displayName", ""), doc.get("externalId"),
                                  _members(resource), expected)
        except Missing as exc:
            if str(exc) == rid:
                raise NotFoundException(detail=f"{resource_type.name} {rid!r} not found"
                                        ) from None
            raise InvalidValueException(detail=f"no User {exc}") from None
        return self._resource(GROUP, row)

    async def delete(self, resource_type: ResourceType, resource_id: str, *,
                     expected_version: str | None = None) -> None:
        expected = _version(expected_version)
        try:
            if resource_type.name == USER:
                await self._run(self._directory.person, resource_id)  # NotFound before anything
                await self._changed(self.changes.deleted, resource_id)
                await self._run(self._directory.delete_person, resource_id, expected)
            else:
                await self._run(self._directory.delete_group, resource_id, expected)
        except Missing:
            raise NotFoundException(detail=f"{resource_type.name} {resource_id!r} not found"
                                    ) from None

    def _resource(self, name: str, row: Row) -> Resource[Any]:
        doc = dict(row.doc)
        doc["id"] = row.id
        doc["meta"] = {"resourceType": name, "created": _iso(row.created),
                       "lastModified": _iso(row.updated), "version": f'W/"{row.version}"'}
        if name == USER:
            doc.pop("groups", None)
            if row.related:
                doc["groups"] = [{"value": gid, "display": display, "$ref": f"Groups/{gid}",
                                  "type": "direct"} for gid, display in row.related]
        else:
            # who is in the group is scim_members' (a person deleted since has left it); a
            # member's display is the one the identity provider sent, or their userName
            sent = {m.get("value"): m.get("display") for m in doc.pop("members", None) or ()
                    if isinstance(m, dict)}
            if row.related:
                doc["members"] = [{"value": uid, "display": sent.get(uid) or display,
                                   "$ref": f"Users/{uid}", "type": "User"}
                                  for uid, display in row.related]
        return self._models(name).model_validate(doc)


def _document(resource: Resource[Any]) -> dict[str, Any]:
    """What is stored of a resource: as sent, without what the gateway computes or never
    keeps (id, meta, a person's groups, a password)."""
    doc = resource.model_dump()
    for key in ("id", "meta", "groups", "password"):
        doc.pop(key, None)
    if "members" in doc:  # kept for their display only (see ScimStore._resource)
        doc["members"] = [{"value": m.get("value"), "display": m.get("display")}
                          for m in doc["members"] if isinstance(m, dict)]
    return doc


def _members(resource: Resource[Any]) -> list[str]:
    members = getattr(resource, "members", None) or []
    return [str(m.value) for m in members if getattr(m, "value", None)]


def _version(expected: str | None) -> int | None:
    """The version an If-Match names (`W/"3"`); one this store never issued matches nothing."""
    if expected is None:
        return None
    digits = expected.removeprefix("W/").strip('"')
    if not digits.isdigit():
        raise PreconditionFailedException()
    return int(digits)


def _filtered(search_request: SearchRequest[Any], model: type[Resource[Any]],
              resources: list[Resource[Any]]) -> list[Resource[Any]]:
    scim_filter = search_request.filter
    if scim_filter is None:
        return resources
    if not scim_filter.models:
        scim_filter = parametrize(ScimFilter, Union[model])(str(scim_filter))  # noqa: UP007
    return [r for r in resources if scim_filter.match(r)]


def _sort_key(search_request: SearchRequest[Any], resource: Resource[Any]
              ) -> tuple[bool, Any, str]:
    value = search_request.sort_value(resource)
    return value is None, value if value is not None else "", str(resource.id)


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()

"""/api/v1/policies: the Cedar policies the gateway decides with (docs/policies.md), those of
the config file's `[policy] files` (read-only, `source: config`) and those created here
(stored, `source: api`, proxy.policy_store), and their bodies.

A body's `text` holds exactly one Cedar policy; its id is the body's `id` or the text's
`@id("...")` (both given, they must agree), its mode the body's `mode` or the text's
`@mode("...")` (likewise; neither: enforce). Before a policy is stored the whole set, the
config's and the API's with this change, is validated as the Cedar gate validates it, against
the tools as last listed: a fault is a 422 naming the policy and the problem. An id the config
file uses is a 409. Each change is one audit record of the management API's, its principal the
administrator (also stored as the policy's `author`), its method `policies/create`,
`policies/replace` or `policies/delete` and its note naming the policy and its version."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field
from quart import Response

from policies.cedar.gate import Gate
from policies.cedar.load import Mode, Policy, PolicyError
from proxy.api.bodies import json_response, read, same_as_path
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.models import TEXT
from proxy.audit import AuditRecord
from proxy.errors import Conflict, Invalid, NotFound
from proxy.held import held
from proxy.policy_store import Check, PolicyStore, Stored, parse_one
from proxy.strict import Strict

POLICY_ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"  # a path segment: no slash
MAX_TEXT = 65536


class PolicyIn(Strict):
    """One Cedar policy: its text, and its id and mode unless the text's annotations say."""

    id: str | None = Field(None, pattern=POLICY_ID)
    text: str = Field(min_length=1, max_length=MAX_TEXT, pattern=TEXT)
    mode: Literal["enforce", "shadow"] | None = None


class PolicyOut(BaseModel):
    id: str
    mode: Literal["enforce", "shadow"]
    text: str
    source: Literal["config", "api"]
    version: int | None  # the API's: 1, then one more on each replace; null for the config's
    author: str | None  # who created or last replaced it (the API's)
    created_at: float | None
    updated_at: float | None
    file: str  # the config's file, or "api"


def _stored(row: Stored) -> PolicyOut:
    return PolicyOut(id=row.id, mode=row.mode, text=row.text, source="api",
                     version=row.version, author=row.author, created_at=row.created_at,
                     updated_at=row.updated_at, file=row.policy.file)


def _configured(policy: Policy) -> PolicyOut:
    return PolicyOut(id=policy.id, mode=policy.mode, text=policy.text, source="config",
                     version=None, author=None, created_at=None, updated_at=None,
                     file=policy.file)


def _serving() -> tuple[PolicyStore, Gate | None]:
    """The API's policies and the gate deciding now (None: no gate was built)."""
    serving = held().serving
    store = serving.deps.policies if serving is not None else None
    if serving is None or store is None:
        raise NotFound("policies are not managed through this API here")
    return store, serving.gateway.live.gate


def _configs(gate: Gate | None) -> Sequence[Policy]:
    return () if gate is None else gate.files


async def policies(who: Caller, api: Api) -> Response:
    """Every policy: the config file's, then the API's, each by id; and `version`, the
    digest of them all that each decided call's audit record names (null: no gate)."""
    store, gate = _serving()
    rows = await store.rows()
    items = [_configured(p) for p in sorted(_configs(gate), key=lambda p: p.id)]
    items += [_stored(r) for r in rows]
    if gate is not None:
        gate.refresh()  # the store's latest change, as the next call would take it
    return json_response({"items": items, "version": None if gate is None else gate.version})


async def policy(who: Caller, api: Api, policy_id: str) -> Response:
    store, gate = _serving()
    found = next((p for p in _configs(gate) if p.id == policy_id), None)
    if found is not None:
        return json_response(_configured(found))
    row = await store.get(policy_id)
    if row is None:
        raise NotFound(f"policy '{policy_id}' not found")
    return json_response(_stored(row))


async def create_policy(who: Caller, api: Api, record: AuditRecord) -> Response:
    body = await read(PolicyIn)
    store, gate = _serving()
    parsed = _parsed(body, body.id)
    _not_the_configs(gate, parsed.id)
    row = await store.create(parsed, body.text, _author(who), _check(gate))
    _named(record, "create", row)
    return json_response(_stored(row), 201)


async def put_policy(who: Caller, api: Api, record: AuditRecord, policy_id: str) -> Response:
    body = await read(PolicyIn, same_as_path("id", policy_id))
    store, gate = _serving()
    _not_the_configs(gate, policy_id)
    parsed = _parsed(body, policy_id)
    row = await store.replace(parsed, body.text, _author(who), _check(gate))
    _named(record, "replace", row)
    return json_response(_stored(row))


async def delete_policy(who: Caller, api: Api, record: AuditRecord, policy_id: str
                        ) -> Response:
    store, gate = _serving()
    _not_the_configs(gate, policy_id)
    await store.delete(policy_id)
    record.method = "policies/delete"
    record.note = f"policy {policy_id} deleted"
    return Response(b"", 204)


def _author(who: Caller) -> str:
    return f"{who.issuer}|{who.subject}"  # as the audit record names its principal


def _named(record: AuditRecord, verb: str, row: Stored) -> None:
    """The change's audit record says which policy it was, and its version now."""
    record.method = f"policies/{verb}"
    record.note = f"policy {row.id} version {row.version}"


def _not_the_configs(gate: Gate | None, policy_id: str) -> None:
    if any(p.id == policy_id for p in _configs(gate)):
        raise Conflict(f"policy '{policy_id}' is defined in the config file, which the API "
                       "cannot change")


def _problem(field: str, msg: str) -> Invalid:
    return Invalid([{"loc": ["body", field], "msg": msg, "type": "value_error"}])


def _parsed(body: PolicyIn, wanted: str | None) -> Policy:
    """The body's one policy, its id and mode settled (`wanted`: the body's or the path's
    id); a 422 when the text does not parse, holds no policy or several, or disagrees."""
    shown = wanted or "(new)"
    try:
        policy = parse_one(body.text, shown, "enforce")
    except PolicyError as exc:
        raise _problem("text", str(exc)) from None
    notes: dict[str, Any] = policy.est.get("annotations") or {}
    named, moded = notes.get("id"), notes.get("mode")
    if wanted is not None and named is not None and named != wanted:
        raise _problem("text", f"the text's @id(\"{named}\") differs from the id '{wanted}'")
    policy_id = wanted or named
    if policy_id is None:
        raise _problem("id", "give an id, or an @id(\"...\") annotation in the text")
    if not isinstance(policy_id, str) or not _is_id(policy_id):
        raise _problem("text", f"@id(\"{policy_id}\"): an id is letters, digits and _ . : - "
                               "(at most 128), beginning with a letter or digit")
    if body.mode is not None and moded is not None and moded != body.mode:
        raise _problem("mode", f"the text's @mode(\"{moded}\") differs from mode "
                               f"'{body.mode}'")
    mode: Mode = body.mode or ("shadow" if moded == "shadow" else "enforce")
    return parse_one(body.text, policy_id, mode)


def _is_id(value: str) -> bool:
    return re.fullmatch(POLICY_ID, value) is not None


def _check(gate: Gate | None) -> Check:
    """What the store asks before it writes: the gate admits the API's policies as the
    change would leave them (with the config's), or the change is a 422 naming the fault."""

    def check(added: Sequence[Policy]) -> None:
        if gate is None:
            return
        try:
            gate.admits(added)
        except PolicyError as exc:
            raise _problem("text", str(exc)) from None

    return check

"""Builders for what a policy or a gateway step is handed: a caller (`principal`), a call's
context (`context`), and JSON-RPC messages (`message`, `tool_call`, `answer`), each parsed
from the bytes a client would send, as the gateway parses them. Every default is the tests'
usual: caller `alice` of issuer `i`, endpoint `e`, upstream `http://u/`."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.jsonrpc import McpMessage, parse

UPSTREAM_URL = "http://u/"


def principal(subject: str = "alice", issuer: str = "i", *, groups: tuple[str, ...] = (),
              key: str | None = None, **fields: Any) -> Principal:
    """A caller; `groups` and `key` (its API key's id) as plain values, other `Principal`
    fields as they are."""
    return Principal(subject=subject, issuer=issuer, groups=frozenset(groups), api_key_id=key,
                     **fields)


def context(caller: Principal | None = None, endpoint: str = "e", **fields: Any) -> CallContext:
    """A call's context at `endpoint` (upstream `UPSTREAM_URL`) for `caller` (`principal()`
    unless given); other `CallContext` fields as they are."""
    fields.setdefault("upstream_url", UPSTREAM_URL)
    return CallContext(principal=caller if caller is not None else principal(),
                       endpoint=endpoint, **fields)


def message(method: str, *, id: Any = 1, **params: Any) -> McpMessage:
    """A request (a notification with `id=None`) with `params`, parsed from its bytes."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id is not None:
        body["id"] = id
    return parse(orjson.dumps(body))


def bare(method: str, *, id: Any = 1) -> McpMessage:
    """A request with no params at all."""
    return parse(orjson.dumps({"jsonrpc": "2.0", "id": id, "method": method}))


def tool_call(name: str = "t", *, id: Any = 1, **params: Any) -> McpMessage:
    """A tools/call of tool `name`; `params` beside the name (`arguments=...`)."""
    return message("tools/call", id=id, name=name, **params)


def answer(result: Any = None, *, id: Any = 1) -> McpMessage:
    """A response carrying `result` (an empty object unless given)."""
    return parse(orjson.dumps({"jsonrpc": "2.0", "id": id,
                               "result": {} if result is None else result}))

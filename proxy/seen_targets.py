"""What the Cedar policies are validated against before any list has been relayed since
start-up: the tools each server listed as last seen (`server_tools`, proxy.seen), with their
hints and argument schemas as kept there (a pinned definition, `tool_pins`, takes precedence),
and the names the users' attributes use. A tool without a known schema (never listed, or its
schema over proxy.seen.MAX_SCHEMA) is left out: a policy that reads its arguments is then
validated once the tool is listed (policies.cedar.gate, `pending`)."""

from __future__ import annotations

from typing import Any

import orjson

from policies.cedar.schema import Target
from proxy.storage.db import Database


def stored_targets(database: Database) -> tuple[list[Target], list[str]]:
    """(the targets with a known argument schema, the users' attribute names); empty when
    the tables cannot be read (a database not migrated yet, or out of reach)."""
    try:
        targets, names = read_targets(database)
    except (*database.errors, *database.missing_table):
        return [], []
    return [t for t in targets if t.input_schema is not None], names


def read_targets(database: Database) -> tuple[list[Target], list[str]]:
    """(every tool last seen, with its hints and argument schema where known, the users'
    attribute names); raises the database's errors (`tollhouse policy` names them)."""
    with database.transaction() as conn:
        seen = conn.execute("SELECT server, tools FROM server_tools").fetchall()
        pins = conn.execute("SELECT endpoint, name, definition FROM tool_pins").fetchall()
        users = conn.execute("SELECT attributes FROM users").fetchall()
    definitions: dict[tuple[str, str], dict[str, Any]] = {}
    for endpoint, name, definition in pins:
        parsed = _json(definition)
        if isinstance(parsed, dict) and isinstance(parsed.get("inputSchema"), dict):
            definitions[(str(endpoint), str(name))] = parsed
    targets = []
    for server, tools in seen:
        listed = _json(tools)
        for tool in listed if isinstance(listed, list) else ():
            name = tool.get("name") if isinstance(tool, dict) else None
            if isinstance(name, str):
                pinned = definitions.get((str(server), name), {})
                targets.append(Target.tool(str(server), {**tool, **pinned, "name": name}))
    names: set[str] = set()
    for (text,) in users:
        attributes = _json(text)
        if isinstance(attributes, dict):
            names.update(k for k, v in attributes.items() if isinstance(v, str))
    return targets, sorted(names)


def _json(text: Any) -> Any:
    try:
        return orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return None

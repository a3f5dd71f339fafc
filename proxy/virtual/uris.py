"""A member's resource URIs wherever a virtual endpoint's client reads them, exposed as the
endpoint names them (`naming.exposed_uri`: `ui://<member>/<rest>` for an MCP Apps UI
resource, `tollhouse://<member>/<uri>` for any other), so that every URI a client is shown
reads back through the endpoint to the member that gave it:

- the UI resource a tool names (MCP Apps, SEP-1865), in its `tools/list` item and in a
  `tools/call` result's `_meta`: `_meta.ui.resourceUri`, the older `_meta["ui/resourceUri"]`,
  and the OpenAI Apps SDK's `_meta["openai/outputTemplate"]`;
- a `resources/read` result's `contents[].uri`;
- a resource link's `uri` and an embedded resource's `resource.uri`, in a `tools/call`
  result's `content` and in a `prompts/get` result's messages;
- a member's `notifications/resources/updated`.

The policies read the member's own URIs (they run on the member's view of the call): this is
what the client is shown afterwards (`Leg.shown`). A resource list's and a template list's
items are renamed where the lists are merged (proxy/virtual/lists.py).
"""

from __future__ import annotations

from typing import Any

from proxy.chain import Rewrite
from proxy.virtual.naming import exposed_uri

META_KEYS = ("ui/resourceUri", "openai/outputTemplate")  # flat _meta keys naming a UI resource


def meta(member: str, value: object) -> dict[str, Any] | None:
    """A `_meta` with the UI resource it names exposed (a copy), None when it names none."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] | None = None
    ui = value.get("ui")
    if isinstance(ui, dict) and isinstance(ui.get("resourceUri"), str):
        out = {**value, "ui": {**ui, "resourceUri": exposed_uri(member, ui["resourceUri"])}}
    for key in META_KEYS:
        if isinstance(value.get(key), str):
            out = out if out is not None else dict(value)
            out[key] = exposed_uri(member, value[key])
    return out


def tool(member: str, item: dict[str, Any]) -> dict[str, Any]:
    """A `tools/list` item with the UI resource its `_meta` names exposed."""
    shown = meta(member, item.get("_meta"))
    return item if shown is None else {**item, "_meta": shown}


def shown(member: str, method: str | None) -> Rewrite | None:
    """What the client is shown of a member's result to a routed call: its URIs exposed."""
    if method == "tools/call":
        return lambda result: _tool_result(member, result)
    if method == "resources/read":
        return lambda result: _contents(member, result.get("contents"))
    if method == "prompts/get":
        return lambda result: _messages(member, result.get("messages"))
    return None


def updated(member: str, params: dict[str, Any]) -> bool:
    """A member's `notifications/resources/updated`, its URI exposed (True: changed)."""
    uri = params.get("uri")
    if not isinstance(uri, str):
        return False
    params["uri"] = exposed_uri(member, uri)
    return True


def _tool_result(member: str, result: dict[str, Any]) -> bool:
    changed = _blocks(member, result.get("content"))
    shown_meta = meta(member, result.get("_meta"))
    if shown_meta is not None:
        result["_meta"] = shown_meta
        changed = True
    return changed


def _blocks(member: str, blocks: object) -> bool:
    """Content blocks (a list, or one block), each resource link's and embedded resource's
    URI exposed in place."""
    if isinstance(blocks, dict):
        blocks = [blocks]
    if not isinstance(blocks, list):
        return False
    changed = False
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "resource_link" and isinstance(block.get("uri"), str):
            block["uri"] = exposed_uri(member, block["uri"])
            changed = True
        elif kind == "resource" and isinstance(block.get("resource"), dict):
            changed = _contents(member, [block["resource"]]) or changed
    return changed


def _contents(member: str, contents: object) -> bool:
    """Resource contents, each one's URI exposed in place."""
    if not isinstance(contents, list):
        return False
    changed = False
    for item in contents:
        if isinstance(item, dict) and isinstance(item.get("uri"), str):
            item["uri"] = exposed_uri(member, item["uri"])
            changed = True
    return changed


def _messages(member: str, messages: object) -> bool:
    """A prompt's messages, the resources in their content exposed in place."""
    if not isinstance(messages, list):
        return False
    changed = False
    for message in messages:
        if isinstance(message, dict):
            changed = _blocks(member, message.get("content")) or changed
    return changed

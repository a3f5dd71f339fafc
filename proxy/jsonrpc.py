"""Parse one client message into an `McpMessage`, once, for every later step to read.

The original bytes are kept and forwarded as they are: the gateway never re-serializes what it
relays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.errors import InvalidRequest, ParseError

Kind = Literal["request", "notification", "response"]


@dataclass(frozen=True, slots=True)
class McpMessage:
    kind: Kind
    id: Any
    method: str | None
    params: dict[str, Any] | None
    body: bytes
    # a tasks/get, tasks/result or tasks/cancel: the tool its task runs, from the task's
    # binding (proxy.mcp.tasks), so that every policy decides it as it decides that tool
    task_tool: str | None = None
    # a tools/call a virtual endpoint's `call_tool` meta-tool asked for (proxy/virtual/
    # meta_tools.py): "search", which the audit records beside the tool's own name
    via: str | None = None

    @property
    def tool(self) -> str | None:
        """The tool name of a tools/call (or of the task a tasks/* request names), for policy
        and audit."""
        if self.task_tool is not None:
            return self.task_tool
        if self.method == "tools/call" and self.params is not None:
            name = self.params.get("name")
            return name if isinstance(name, str) else None
        return None


def parse(body: bytes) -> McpMessage:
    """Raise ParseError for a body that is not JSON or not a JSON-RPC 2.0 object (seed 004),
    InvalidRequest for a batch or a JSON-RPC object that is not one well-formed message."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ParseError() from None
    if isinstance(obj, list):
        raise InvalidRequest("Invalid Request: batches are not supported")
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
        raise ParseError("Parse error: not a JSON-RPC 2.0 object")
    request_id = obj.get("id")
    has_id = "id" in obj
    if has_id and not _valid_id(request_id):
        raise InvalidRequest("Invalid Request: id must be a string or an integer")
    method = obj.get("method")
    if method is not None:
        if not isinstance(method, str) or not method:
            raise InvalidRequest("Invalid Request: method must be a non-empty string")
        params = obj.get("params")
        if params is not None and not isinstance(params, dict):
            raise InvalidRequest("Invalid Request: params must be an object")
        kind: Kind = "request" if has_id else "notification"
        return McpMessage(kind, request_id, method, params, body)
    if has_id and ("result" in obj) != ("error" in obj):
        return McpMessage("response", request_id, None, None, body)
    raise InvalidRequest("Invalid Request: neither a request, a notification nor a response")


def request_id_of(body: bytes) -> Any:
    """Best effort: the id of a body that failed later checks, so the error can echo it."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and _valid_id(obj.get("id")):
        return obj.get("id")
    return None


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def response_outcome(obj: Any, request_id: Any) -> tuple[bool, str | None] | None:
    """For an upstream message: None if it is not the response to `request_id`, else
    (ok, error_message). A response is what a client takes as one: its id equal and of the same
    type (`true` is not 1, nor 1.0), and exactly one of result and error."""
    if not isinstance(obj, dict) or "method" in obj or ("result" in obj) == ("error" in obj):
        return None
    upstream_id = obj.get("id")
    if type(upstream_id) is not type(request_id) or upstream_id != request_id:
        return None
    if "result" in obj:
        return True, None
    error = obj.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return False, f"upstream error {code}"


def upstream_error_type(error_message: str) -> str:
    """The JSON-RPC code of a `response_outcome` error message (metrics' error_type)."""
    return error_message.rpartition(" ")[2]

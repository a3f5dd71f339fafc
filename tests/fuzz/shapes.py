"""What the fuzz targets hold an answer to: seed 004's JSON-RPC codes on the MCP edge with their
HTTP statuses, and the one wire shape an error of the edge's checks takes."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import GatewayError, render
from proxy.mcp import eras

# seed 004, "JSON-RPC codes on the MCP edge": the codes a check before dispatch can answer
EDGE_CODES = {-32700: 400, -32600: 400, -32602: 400, -32601: 404, -32020: 400, -32022: 400}
MIRRORED = ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def assert_edge_error(exc: GatewayError, request_id: Any) -> None:
    """`exc`, rendered on the MCP edge for `request_id`, is seed 004's JSON-RPC error shape
    with a code of its table and that code's status (and the data the table names)."""
    assert request_id is None or valid_id(request_id), request_id
    status, headers, body = render(exc, request_id)
    assert headers["Content-Type"] == "application/json"
    obj = orjson.loads(body)
    assert isinstance(obj, dict) and set(obj) == {"jsonrpc", "id", "error"}, obj
    assert obj["jsonrpc"] == "2.0" and obj["id"] == request_id, obj
    error = obj["error"]
    assert set(error) <= {"code", "message", "data"} and {"code", "message"} <= set(error)
    code = error["code"]
    assert code in EDGE_CODES and status == EDGE_CODES[code], (code, status)
    message = error["message"]
    assert isinstance(message, str) and message and "\n" not in message, message
    data = error.get("data")
    if code == -32022:
        assert data is not None and set(data) == {"supported", "requested"}, data
        assert data["supported"] == list(eras.MODERN_VERSIONS)
    elif code == -32020:
        assert data is not None and set(data) == {"mismatch"} and data["mismatch"] in MIRRORED
    elif code == -32601:
        assert data is not None and set(data) == {"method"} and isinstance(data["method"], str)
    else:
        assert data is None, data

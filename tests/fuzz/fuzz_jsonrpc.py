"""JSON-RPC parsing and classification of one client body (proxy.jsonrpc), and the reading of
an upstream message as the answer to a call.

Input: the raw body. Holds: the parse raises only ParseError (-32700) or InvalidRequest
(-32600), each rendered in seed 004's shape with the id the edge would echo; a message that
parses is one of the three documented kinds with the fields that kind has, keeps the body as
it came, and agrees with a second, independent reading of the same JSON.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy import jsonrpc
from proxy.errors import InvalidRequest, ParseError
from tests.fuzz.shapes import assert_edge_error, valid_id


def check(data: bytes) -> None:
    try:
        obj: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = ParseError
    try:
        msg = jsonrpc.parse(data)
    except (ParseError, InvalidRequest) as exc:
        # the edge echoes the id of a body that is a JSON-RPC object but no valid message
        request_id = jsonrpc.request_id_of(data)
        if isinstance(obj, dict) and valid_id(obj.get("id")):
            assert request_id == obj["id"]
        else:
            assert request_id is None
        if obj is ParseError or not isinstance(obj, (dict, list)) or (
                isinstance(obj, dict) and obj.get("jsonrpc") != "2.0"):
            assert isinstance(exc, ParseError), (obj, exc)
        else:
            assert isinstance(exc, InvalidRequest), (obj, exc)
        assert_edge_error(exc, request_id if isinstance(exc, InvalidRequest) else None)
        return
    assert isinstance(obj, dict) and obj["jsonrpc"] == "2.0"
    assert msg.body is data
    if msg.kind == "request" or msg.kind == "notification":
        assert isinstance(msg.method, str) and msg.method == obj["method"]
        assert msg.params is None or (isinstance(msg.params, dict)
                                      and msg.params == obj["params"])
        assert ("id" in obj) == (msg.kind == "request")
        assert msg.tool is None or (msg.method == "tools/call" and msg.tool == obj["params"]
                                    ["name"])
    else:
        assert msg.kind == "response", msg.kind
        assert msg.method is None and msg.params is None and obj.get("method") is None
        assert ("result" in obj) != ("error" in obj)
    if "id" in obj:
        assert valid_id(msg.id) and msg.id == obj["id"] and jsonrpc.request_id_of(data) == msg.id
    else:
        assert msg.id is None
    # the relay's reading of the same bytes coming from an upstream, as the answer to a call
    for request_id in (msg.id, 1, "1"):
        outcome = jsonrpc.response_outcome(obj, request_id)
        if outcome is not None:
            ok, error = outcome
            assert obj.get("id") == request_id and "method" not in obj
            assert ok == ("result" in obj) and (error is None) == ok
            assert error is None or error.startswith("upstream error ")

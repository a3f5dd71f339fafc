"""The checks of one MCP POST before anything is forwarded: the parse, the era, and the
2026-07-28 envelope against its mirrored headers (proxy.mcp.guards.parse, proxy.mcp.eras.settle),
as proxy.mcp.gateway runs them.

Input: header lines (`name: value`, latin-1, a name sent twice counts as duplicated, the last
value kept, as the ASGI edge builds its map), a blank line, then the body. Holds: the only
exceptions are the edge's typed errors, each rendered in seed 004's JSON-RPC shape with a code
of its table and the id the gateway echoes; a request that passes is legacy or modern, and a
modern one really satisfies every row of seed 003's validation table.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.audit.record import id_text
from proxy.errors import (
    HeaderMismatch,
    InvalidEnvelope,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    UnsupportedVersion,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras, guards
from tests.fuzz.shapes import assert_edge_error

TYPED = (ParseError, InvalidRequest, InvalidEnvelope, HeaderMismatch, UnsupportedVersion,
         MethodNotFound)


def split(data: bytes) -> tuple[dict[str, str], frozenset[str], bytes]:
    head, _, body = data.partition(b"\n\n")
    headers: dict[str, str] = {}
    duplicated: set[str] = set()
    for line in head.split(b"\n"):
        name, colon, value = line.partition(b":")
        if not colon or not name.strip():
            continue
        key = name.strip().lower().decode("latin-1")
        if key in headers:
            duplicated.add(key)
        headers[key] = value.strip(b" \t").decode("latin-1")
    return headers, frozenset(duplicated), body


def check(data: bytes) -> None:
    headers, duplicated, body = split(data)
    version = headers.get("mcp-protocol-version")
    msg: McpMessage | None = None
    try:
        msg = guards.parse(body, version)
        era = eras.settle(msg, headers, duplicated)
    except TYPED as exc:
        request_id = msg.id if msg is not None else guards.late_id(exc, body)
        assert_edge_error(exc, request_id)
        return
    if msg.kind == "request":
        assert isinstance(id_text(msg.id), str)
    if era == "modern":
        _modern(msg, headers, duplicated, version)
    else:
        assert era == "legacy", era
        meta = (msg.params or {}).get("_meta")
        assert not (isinstance(meta, dict) and eras.PV in meta)
        assert version is None or version in eras.KNOWN_VERSIONS
        assert msg.method == "initialize" or not eras.claims_modern(version)
        if msg.method == "initialize":
            envelope = eras.envelope_of_initialize(msg)
            assert isinstance(envelope[eras.CLIENT_CAPS], dict)


def _modern(msg: McpMessage, headers: Mapping[str, str], duplicated: frozenset[str],
            version: str | None) -> None:
    assert msg.kind != "response" and msg.params is not None
    meta = msg.params["_meta"]
    assert meta[eras.PV] == version and version in eras.MODERN_VERSIONS
    assert isinstance(meta[eras.CLIENT_CAPS], dict)
    assert "mcp-session-id" not in headers and "mcp-protocol-version" not in duplicated
    info = meta.get(eras.CLIENT_INFO)
    assert info is None or (isinstance(info.get("name"), str)
                            and isinstance(info.get("version"), str))
    assert eras.LOG_LEVEL not in meta or meta[eras.LOG_LEVEL] in eras.LOG_LEVELS
    name = eras.client_name(msg)
    assert name is None or (isinstance(name, str) and len(name) <= 100)
    if msg.kind == "request":
        assert msg.method in eras.MODERN_METHODS and headers["mcp-method"] == msg.method
        assert "mcp-method" not in duplicated
        field = eras.NAMED.get(msg.method)
        if field is not None:
            assert "mcp-name" not in duplicated
            assert eras.decode_header(headers["mcp-name"]) == msg.params[field]

"""The two protocol eras on one endpoint: which one a request belongs to, and the checks a
2026-07-28 (sessionless) request must pass before anything is forwarded or used for policy.

Legacy (2025-11-25 and earlier): `initialize`, sessions, the GET stream. Modern (2026-07-28): every
request carries a `params._meta` envelope mirrored by `MCP-Protocol-Version`, `Mcp-Method` and
`Mcp-Name` headers, so an intermediary can route without a session. The answers are seed 003's
validation table, with seed 004's codes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping
from typing import Any, Literal

from proxy.errors import (
    GatewayError,
    HeaderMismatch,
    InvalidEnvelope,
    InvalidRequest,
    MethodNotFound,
    UnsupportedVersion,
)
from proxy.jsonrpc import McpMessage

Era = Literal["legacy", "modern"]

MODERN_VERSIONS = ("2026-07-28",)
LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
PV = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPS = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
# the syslog (RFC 5424) severities MCP's LoggingLevel names; any other value is -32602 (seed 004)
LOG_LEVELS = frozenset({"debug", "info", "notice", "warning", "error", "critical", "alert",
                        "emergency"})

# methods of the 2026-07-28 revision; anything else is 404 -32601 on the modern leg
MODERN_METHODS = frozenset({
    "server/discover", "tools/list", "tools/call", "prompts/list", "prompts/get",
    "resources/list", "resources/templates/list", "resources/read", "completion/complete",
    "subscriptions/listen"})
# methods whose target is mirrored in Mcp-Name, and the params field it mirrors
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
CACHEABLE = frozenset({"server/discover", "tools/list", "prompts/list", "resources/list",
                       "resources/templates/list", "resources/read"})


KNOWN_VERSIONS = frozenset(LEGACY_VERSIONS + MODERN_VERSIONS)


def check_header(version: str | None) -> None:
    """An MCP-Protocol-Version header naming a revision of neither era is -32022 (seed 003),
    checked before the header decides anything else (the era, whether a session is read).
    `supported` lists the 2026-07-28 revisions, as seed 003 has it: a legacy client learns
    its version from initialize and never reads it."""
    if version is not None and version not in KNOWN_VERSIONS:
        raise UnsupportedVersion(data={"supported": list(MODERN_VERSIONS),
                                       "requested": version})


def claims_modern(version: str | None) -> bool:
    """A header value naming a revision newer than the handshake era."""
    return version is not None and version not in LEGACY_VERSIONS


def classify(msg: McpMessage, headers: Mapping[str, str]) -> Era:
    """Body first, cross-checked with the header. An `initialize` is a legacy opening unless it
    carries the 2026-07-28 envelope: that revision removed it, and `validate` answers 404 -32601
    as for any method it lacks. An `initialize` whose only claim is `protocolVersion:
    "2026-07-28"` negotiates down (seed 003)."""
    meta = (msg.params or {}).get("_meta")
    if isinstance(meta, dict) and PV in meta:
        return "modern"
    if msg.method == "initialize":
        return "legacy"
    return "modern" if claims_modern(headers.get("mcp-protocol-version")) else "legacy"


def settle(msg: McpMessage, headers: Mapping[str, str], duplicated: Collection[str]) -> Era:
    """The message's era, once its checks pass: a modern request is validated (where a header
    of neither era is -32022 unless an envelope contradicts it); a legacy one may carry no
    header of neither era."""
    era = classify(msg, headers)
    if era == "modern":
        validate(msg, headers, duplicated)
    else:
        check_header(headers.get("mcp-protocol-version"))
    return era


def validate(msg: McpMessage, headers: Mapping[str, str], duplicated: Collection[str]) -> None:
    """Raise the first failed check of a modern request; return when it may proceed.

    The order is the official SDK's ladder: the envelope's presence (-32602), then the mirrored
    headers against the body (-32020, whatever revisions the two name), then whether the
    revision is served (-32022), then the rest of the envelope's shape. A header naming a
    revision of neither era on a request with no envelope is -32022 before anything else."""
    header_version = headers.get("mcp-protocol-version")
    meta = (msg.params or {}).get("_meta")
    if not (isinstance(meta, dict) and PV in meta):
        check_header(header_version)
    if "mcp-session-id" in headers:
        raise InvalidRequest("Invalid Request: Mcp-Session-Id is not used with protocol "
                             "version 2026-07-28")
    if msg.kind == "response":
        raise InvalidRequest("Invalid Request: a 2026-07-28 client sends no responses")
    if not isinstance(meta, dict) or PV not in meta or not isinstance(meta.get(CLIENT_CAPS),
                                                                         dict):
        raise InvalidEnvelope()
    version = meta[PV]
    if header_version is None or header_version != version \
            or "mcp-protocol-version" in duplicated:
        raise _mismatch("MCP-Protocol-Version")
    if msg.kind != "notification":
        if headers.get("mcp-method") != msg.method or "mcp-method" in duplicated:
            raise _mismatch("Mcp-Method")
        field = NAMED.get(msg.method or "")
        if field is not None:
            target = (msg.params or {}).get(field)
            sent = decode_header(headers.get("mcp-name"))
            if not isinstance(target, str) or sent != target or "mcp-name" in duplicated:
                raise _mismatch("Mcp-Name")
    if version not in MODERN_VERSIONS:
        raise UnsupportedVersion(data={"supported": list(MODERN_VERSIONS),
                                       "requested": version})
    _check_envelope(meta)
    if msg.kind != "notification" and msg.method not in MODERN_METHODS:
        raise MethodNotFound(data={"method": msg.method})


def _check_envelope(meta: dict[str, Any]) -> None:
    """The envelope's optional members, once its version is known to be served."""
    info = meta.get(CLIENT_INFO)
    if info is not None and not (isinstance(info, dict) and isinstance(info.get("name"), str)
                                 and isinstance(info.get("version"), str)):
        raise InvalidEnvelope()
    if LOG_LEVEL in meta:
        level = meta[LOG_LEVEL]
        if not isinstance(level, str) or level not in LOG_LEVELS:
            raise InvalidEnvelope("Invalid _meta envelope: unknown log level")


def _mismatch(header: str) -> GatewayError:
    return HeaderMismatch(f"Header mismatch: {header}", data={"mismatch": header})


def decode_header(value: str | None) -> str | None:
    """`=?base64?<standard base64 of UTF-8>?=` decoded; a plain value as it is. A malformed or
    non-canonical encoding decodes to None, so it can never match."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    if len(value) < 11:  # "=?base64?=": prefix and suffix overlap, no payload, not an encoding
        return None
    payload = value[9:-2]
    try:
        raw = base64.b64decode(payload, validate=True)
        if base64.b64encode(raw).decode("ascii") != payload:
            return None
        return raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def client_name(msg: McpMessage) -> str | None:
    """clientInfo.name, for display in the audit log only (never for a decision)."""
    meta = (msg.params or {}).get("_meta")
    info = meta.get(CLIENT_INFO) if isinstance(meta, dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    return name[:100] if isinstance(name, str) else None


def envelope_of_initialize(msg: McpMessage) -> dict[str, Any]:
    """A legacy client's initialize as the 2026-07-28 envelope its later requests will carry
    on a bridge: its capabilities, and its clientInfo when well-formed."""
    params = msg.params or {}
    caps = params.get("capabilities")
    info = params.get("clientInfo")
    envelope: dict[str, Any] = {CLIENT_CAPS: caps if isinstance(caps, dict) else {}}
    if isinstance(info, dict) and isinstance(info.get("name"), str) \
            and isinstance(info.get("version"), str):
        envelope[CLIENT_INFO] = {"name": info["name"], "version": info["version"]}
    return envelope


def discover_from_initialize(result: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """A DiscoverResult for a legacy upstream, built from its initialize result."""
    caps = {k: v for k, v in (result.get("capabilities") or {}).items()
            if k in ("prompts", "resources", "tools", "logging", "completions", "experimental")}
    # list_changed and subscribe need subscriptions/listen, which a legacy upstream can't feed
    for key in ("prompts", "resources", "tools"):
        if isinstance(caps.get(key), dict):
            caps[key] = {k: v for k, v in caps[key].items()
                         if k not in ("listChanged", "subscribe")}
    info = result.get("serverInfo")
    if not isinstance(info, dict):
        info = {"name": endpoint, "version": ""}
    out: dict[str, Any] = {"supportedVersions": list(MODERN_VERSIONS), "capabilities": caps,
                           "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                           "_meta": {SERVER_INFO: info}}
    if isinstance(result.get("instructions"), str):
        out["instructions"] = result["instructions"]
    return out

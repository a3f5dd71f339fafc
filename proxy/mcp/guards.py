"""The spine's first checks, after the body cap at the edge: what is checked about an MCP exchange
before its message is trusted: the browser Origin, the media types, the caller's address for
lockouts, and the parse itself (with the one version check that needs no envelope).

Each check raises the GatewayError seed 004 names; none reads a store or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy import jsonrpc
from proxy.auth.peer import client_ip
from proxy.destinations import IPNetwork
from proxy.errors import (
    GatewayError,
    InvalidRequest,
    NotAcceptable,
    OriginNotAllowed,
    UnsupportedMediaType,
    UnsupportedVersion,
)
from proxy.jsonrpc import McpMessage
from proxy.mcp import eras
from proxy.mcp.exchange import EdgeRequest


def check_origin(headers: Mapping[str, str], allowed: frozenset[str]) -> None:
    """A browser request from an origin the gateway does not allow: 403, before credentials."""
    origin = headers.get("origin")
    if origin is not None and origin.rstrip("/").lower() not in allowed:
        raise OriginNotAllowed()


def check_media(headers: Mapping[str, str]) -> None:
    ctype = headers.get("content-type", "")
    # the media type exactly (application/jsonx is not JSON), parameters such as charset allowed
    if ctype != "application/json" and \
            ctype.partition(";")[0].strip().lower() != "application/json":
        raise UnsupportedMediaType()
    accept = headers.get("accept")
    if accept is None:
        return
    accept = accept.lower()
    if "*/*" in accept:
        return
    if "application/json" not in accept or "text/event-stream" not in accept:
        raise NotAcceptable()


def caller(req: EdgeRequest, trusted_proxies: Sequence[IPNetwork]) -> str | None:
    """The address auth-failure lockouts key on: the socket peer, or, when the peer is a
    trusted proxy, the client address it wrote in X-Forwarded-For (read as the egress policy
    reads it), so one caller behind the proxy cannot lock out everyone behind it. The peer
    when the caller cannot be told (a proxy that sent only `Forwarded`)."""
    if not trusted_proxies or not req.forwarded:
        return req.peer
    address = client_ip(req.peer, req.forwarded, trusted_proxies)
    return str(address) if address is not None else req.peer


def parse(body: bytes, version: str | None) -> McpMessage:
    """The message; a body that is none carries no envelope to weigh a header of neither era
    against, so such a header is -32022 first."""
    try:
        return jsonrpc.parse(body)
    except GatewayError:
        eras.check_header(version)
        raise


def late_id(exc: GatewayError, body: bytes) -> Any:
    """Errors raised before parsing answer id null (seed 004); later ones echo the id, and
    so does an unsupported MCP-Protocol-Version, checked before parsing but about the body."""
    if isinstance(exc, (InvalidRequest, UnsupportedVersion)) and body:
        return jsonrpc.request_id_of(body)
    return None

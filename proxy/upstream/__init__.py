"""The upstream boundary: one client for every proxied call (pooled connections on the
transport chosen by measurement, bench/README.md), and the one place where an httpx failure
becomes a GatewayError (`map_errors`, `read_body`, `BodyChunks`, `rejection`): nothing above it
imports httpx's exceptions."""

from proxy.upstream.client import (
    NO_CALL,
    BodyChunks,
    UpstreamClient,
    UpstreamRoute,
    build_transport,
    map_errors,
    read_body,
    read_head,
    rejection,
)

__all__ = ["NO_CALL", "BodyChunks", "UpstreamClient", "UpstreamRoute", "build_transport",
           "map_errors", "read_body", "read_head", "rejection"]

"""The upstream boundary: one client for every proxied call (pooled connections on the
transport chosen by measurement, bench/README.md), and the one place where httpx is used: what
the client returns is an `UpstreamAnswer`, and an httpx failure becomes a GatewayError here
(`map_errors`, `UpstreamAnswer.chunks` and `aread`, `read_head`, `rejection`), so nothing above
it imports httpx."""

from proxy.upstream.answer import (
    NO_CALL,
    BodyChunks,
    UpstreamAnswer,
    map_errors,
    read_head,
    rejection,
)
from proxy.upstream.client import UpstreamClient, UpstreamRoute, build_transport

__all__ = ["NO_CALL", "BodyChunks", "UpstreamAnswer", "UpstreamClient", "UpstreamRoute",
           "build_transport", "map_errors", "read_head", "rejection"]

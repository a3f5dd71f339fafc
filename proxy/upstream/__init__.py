"""Step 5 of the path: forward to the upstream over one pooled httpx client, and map every
httpx failure to a GatewayError at this one boundary."""

from proxy.upstream.client import (
    NO_CALL,
    UpstreamClient,
    UpstreamRoute,
    build_transport,
    map_errors,
    rejection,
)

__all__ = ["NO_CALL", "UpstreamClient", "UpstreamRoute", "build_transport", "map_errors",
           "rejection"]

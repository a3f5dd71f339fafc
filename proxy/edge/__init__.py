"""Step 1 of the path. `McpEdge` serves /mcp/<endpoint> as plain ASGI in front of the Quart
app and turns each call into the gateway's `EdgeRequest` and back; `routes` holds the few plain
routes that stay on Quart (with `proxy.app`, the only Quart importers)."""

from proxy.edge.asgi import McpEdge
from proxy.edge.routes import register

__all__ = ["McpEdge", "register"]

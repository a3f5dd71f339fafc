"""Step 1 of the path, and with `proxy.app` the only code that imports Quart: the routes under
/mcp/<endpoint>, turned into the gateway's plain `EdgeRequest` and back."""

from proxy.edge.routes import register

__all__ = ["register"]

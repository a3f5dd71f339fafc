"""The few plain Quart routes beside the MCP edge (health, the NUL guard, the error handlers).
The MCP edge itself is `proxy.mcp.asgi.McpEdge`."""

from proxy.web.routes import register

__all__ = ["register"]

"""Tollhouse: a reverse-proxy policy gateway in front of upstream MCP servers."""

__version__ = "0.1.0"

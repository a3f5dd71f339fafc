"""Copyable configurations of the common MCP clients for one endpoint's URL. The OAuth sign-in
of each client is its own; with an API key, the key goes in an Authorization header (shown as
a placeholder: the console never puts a secret in a page after its creation)."""

from __future__ import annotations

import orjson

KEY = "th_YOUR_KEY"


def _json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def configs(name: str, url: str) -> list[tuple[str, str, str]]:
    """(client, where it goes, text) for each client."""
    auth = {"Authorization": f"Bearer {KEY}"}
    return [
        ("Claude Code", "a shell",
         (f"claude mcp add --transport http {name} {url}\n"
         f"# with an API key:\nclaude mcp add --transport http {name} {url} "
         f"--header \"Authorization: Bearer {KEY}\"")),
        ("Claude Desktop", "claude_desktop_config.json",
         _json({"mcpServers": {name: {"command": "npx", "args": ["-y", "mcp-remote", url]}}})),
        ("VS Code", ".vscode/mcp.json",
         _json({"servers": {name: {"type": "http", "url": url, "headers": auth}}})),
        ("Cursor", "~/.cursor/mcp.json",
         _json({"mcpServers": {name: {"url": url, "headers": auth}}})),
        ("MCP Inspector", "a shell",
         (f"npx @modelcontextprotocol/inspector\n# Transport: Streamable HTTP, URL: {url}\n"
         f"npx @modelcontextprotocol/inspector --cli {url} --transport http "
         f"--method tools/list --header \"Authorization: Bearer {KEY}\"")),
    ]

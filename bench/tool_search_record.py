"""Record the tool lists of real MCP servers published on the npm registry and PyPI, for the
tool-search benchmark (bench/tool_search.py) and its tests: each server, at a pinned version,
is installed into .stdio-servers/tool-search/ (gitignored), started over stdio, and asked
`tools/list` by the official SDK client; its tools are written as they came, one JSON file per
server, under bench/data/tool_search/. The lists are committed, so the benchmark and the tests
read them without npm; run this again to refresh them (or after changing a version):

    .venv/bin/python -m bench.tool_search_record

A server that needs a credential to start is given a dummy one: listing its tools calls
nothing outside.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ROOT / ".stdio-servers" / "tool-search"
DATA = Path(__file__).resolve().parent / "data" / "tool_search"


@dataclass(frozen=True)
class Server:
    name: str  # the member name the benchmark gives it
    registry: str  # "npm" or "pypi"
    package: str
    version: str
    command: str  # the executable the package installs
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


SERVERS = (
    Server("everything", "npm", "@modelcontextprotocol/server-everything", "2026.8.31",
           "mcp-server-everything", ("stdio",)),
    Server("filesystem", "npm", "@modelcontextprotocol/server-filesystem", "2026.8.31",
           "mcp-server-filesystem", ("{tmp}",)),
    Server("memory", "npm", "@modelcontextprotocol/server-memory", "2026.8.31",
           "mcp-server-memory"),
    Server("github", "npm", "@modelcontextprotocol/server-github", "2025.4.8",
           "mcp-server-github", env={"GITHUB_PERSONAL_ACCESS_TOKEN": "dummy"}),
    Server("gitlab", "npm", "@modelcontextprotocol/server-gitlab", "2025.4.25",
           "mcp-server-gitlab", env={"GITLAB_PERSONAL_ACCESS_TOKEN": "dummy"}),
    Server("slack", "npm", "@modelcontextprotocol/server-slack", "2025.4.25",
           "mcp-server-slack", env={"SLACK_BOT_TOKEN": "dummy", "SLACK_TEAM_ID": "T0"}),
    Server("maps", "npm", "@modelcontextprotocol/server-google-maps", "0.6.2",
           "mcp-server-google-maps", env={"GOOGLE_MAPS_API_KEY": "dummy"}),
    Server("brave", "npm", "@modelcontextprotocol/server-brave-search", "0.6.2",
           "mcp-server-brave-search", env={"BRAVE_API_KEY": "dummy"}),
    Server("puppeteer", "npm", "@modelcontextprotocol/server-puppeteer", "2025.5.12",
           "mcp-server-puppeteer", env={"PUPPETEER_SKIP_DOWNLOAD": "1"}),
    Server("thinking", "npm", "@modelcontextprotocol/server-sequential-thinking", "2026.8.31",
           "mcp-server-sequential-thinking"),
    Server("redis", "npm", "@modelcontextprotocol/server-redis", "2025.4.25",
           "mcp-server-redis", ("redis://127.0.0.1:6379",)),
    Server("git", "pypi", "mcp-server-git", "2026.10.19", "mcp-server-git"),
    Server("fetch", "pypi", "mcp-server-fetch", "2026.10.24", "mcp-server-fetch"),
    Server("time", "pypi", "mcp-server-time", "2026.10.19", "mcp-server-time"),
)


def install(server: Server) -> Path:
    """The server's executable, installed at its pinned version if it is not yet."""
    if server.registry == "npm":
        where = PREFIX / "npm"
        exe = where / "node_modules" / ".bin" / server.command
        if not exe.exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(where),
                            f"{server.package}@{server.version}"], check=True,
                           env={**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1"})
        return exe
    where = PREFIX / "venv"
    if not (where / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    exe = where / "bin" / server.command
    if not exe.exists():
        subprocess.run([str(where / "bin" / "pip"), "install", "--quiet",
                        f"{server.package}=={server.version}"], check=True)
    return exe


async def record(server: Server, tmp: str) -> dict[str, object]:
    exe = install(server)
    args = [a.replace("{tmp}", tmp) for a in server.args]
    params = StdioServerParameters(command=str(exe), args=args,
                                   env={"PATH": os.environ["PATH"], **server.env})
    async with Client(params, mode="legacy") as client:
        listed = await client.list_tools()
    tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]
    return {"server": server.name, "registry": server.registry, "package": server.package,
            "version": server.version, "tools": tools}


async def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None:
        raise SystemExit("npm is needed to install the npm servers")
    with tempfile.TemporaryDirectory() as tmp:
        for server in SERVERS:
            try:
                listed = await record(server, tmp)
            except Exception as exc:  # noqa: BLE001 - one server's failure is reported
                print(f"{server.name}: failed: {exc!r}", file=sys.stderr)
                continue
            out = DATA / f"{server.name}.json"
            out.write_text(json.dumps(listed, indent=1, sort_keys=True) + "\n")
            print(f"{server.name}: {len(listed['tools'])} tools "  # type: ignore[arg-type]
                  f"({server.package}@{server.version})")


if __name__ == "__main__":
    asyncio.run(main())

"""The MCP Apps example server `@modelcontextprotocol/server-basic-vanillajs` from the npm
registry, at a pinned version, in its own project-local prefix (.stdio-servers/apps/,
gitignored, apart from server-everything's tree): `ensure()` installs it when it is missing and
npm is here, as tests/stdio/everything.py does for the reference server."""

from __future__ import annotations

from tests.npm_servers import ROOT, NpmServer

VERSION = "2.0.3"
SERVER = NpmServer("@modelcontextprotocol/server-basic-vanillajs", VERSION, ROOT / "apps")
PACKAGE = SERVER.package
DIRECTORY = SERVER.directory
INSTALLED = SERVER.installed
COMMAND = ["npx", "--no-install", "mcp-server-basic-vanillajs", "--stdio"]  # run in DIRECTORY
installed_version = SERVER.installed_version
ensure = SERVER.ensure


def html() -> str:
    """The UI the server serves (its dist/mcp-app.html), to compare with what is read."""
    return (INSTALLED / "dist" / "mcp-app.html").read_text()


if __name__ == "__main__":
    reason = ensure()
    print(reason or f"{PACKAGE} installed in {DIRECTORY}")

"""The MCP Apps example server `@modelcontextprotocol/server-basic-vanillajs` from the npm
registry, at a pinned version, in its own project-local prefix (.stdio-servers/apps/,
gitignored, apart from server-everything's tree): `ensure()` installs it when it is missing and
npm is here, as tests/stdio/everything.py does for the reference server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.locks import installing

VERSION = "2.0.3"
PACKAGE = f"@modelcontextprotocol/server-basic-vanillajs@{VERSION}"
DIRECTORY = Path(__file__).resolve().parents[2] / ".stdio-servers" / "apps"
INSTALLED = DIRECTORY / "node_modules" / "@modelcontextprotocol" / "server-basic-vanillajs"
COMMAND = ["npx", "--no-install", "mcp-server-basic-vanillajs", "--stdio"]  # run in DIRECTORY


def installed_version() -> str | None:
    try:
        return str(json.loads((INSTALLED / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def ensure() -> str | None:
    """None once the pinned version is installed; otherwise why it cannot be."""
    if installed_version() == VERSION:
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not installed: the MCP Apps example server cannot be fetched"
    with installing(DIRECTORY):
        if installed_version() == VERSION:  # another pass installed it meanwhile
            return None
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                               str(DIRECTORY), PACKAGE], capture_output=True, text=True,
                              timeout=600, check=False)
    if done.returncode != 0 or installed_version() != VERSION:
        raise RuntimeError(f"npm install {PACKAGE} failed: {done.stderr[-2000:]}")
    return None


def html() -> str:
    """The UI the server serves (its dist/mcp-app.html), to compare with what is read."""
    return (INSTALLED / "dist" / "mcp-app.html").read_text()


if __name__ == "__main__":
    reason = ensure()
    print(reason or f"{PACKAGE} installed in {DIRECTORY}")

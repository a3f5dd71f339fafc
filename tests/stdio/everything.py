"""`@modelcontextprotocol/server-everything` from the npm registry, at a pinned version, in a
project-local directory (.stdio-servers/, gitignored). `.ci/run` installs it; `ensure()` does
too when it is missing and npm is here, so the suite runs the same from a plain `make test`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.locks import installing

VERSION = "2026.8.31"
PACKAGE = f"@modelcontextprotocol/server-everything@{VERSION}"
DIRECTORY = Path(__file__).resolve().parents[2] / ".stdio-servers"
INSTALLED = DIRECTORY / "node_modules" / "@modelcontextprotocol" / "server-everything"


def installed_version() -> str | None:
    import json

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
        return "npm is not installed: the Node stdio server cannot be fetched"
    with installing(DIRECTORY):
        if installed_version() == VERSION:  # another pass installed it meanwhile
            return None
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                               str(DIRECTORY), PACKAGE], capture_output=True, text=True,
                              timeout=600, check=False)
    if done.returncode != 0 or installed_version() != VERSION:
        raise RuntimeError(f"npm install {PACKAGE} failed: {done.stderr[-2000:]}")
    return None


if __name__ == "__main__":  # .ci/run
    reason = ensure()
    print(reason or f"{PACKAGE} installed in {DIRECTORY}")

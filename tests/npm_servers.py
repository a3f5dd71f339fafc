"""MCP servers from the npm registry at pinned versions, each in a project-local prefix under
.stdio-servers/ (gitignored): `NpmServer.ensure()` installs one when it is missing and npm is
here (under a lock, so parallel passes install it once), so the suite runs the same from a
plain `make test` as from `.ci/run`."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.locks import installing

ROOT = Path(__file__).resolve().parents[1] / ".stdio-servers"


@dataclass(frozen=True)
class NpmServer:
    """`name` (an npm package) at `version`, installed with `--prefix directory`."""

    name: str
    version: str
    directory: Path

    @property
    def package(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def installed(self) -> Path:
        return self.directory / "node_modules" / self.name

    def installed_version(self) -> str | None:
        try:
            return str(json.loads((self.installed / "package.json").read_text())["version"])
        except (OSError, ValueError, KeyError):
            return None

    def ensure(self) -> str | None:
        """None once the pinned version is installed; otherwise why it cannot be."""
        if self.installed_version() == self.version:
            return None
        npm = shutil.which("npm")
        if npm is None:
            return f"npm is not installed: {self.package} cannot be fetched"
        with installing(self.directory):
            if self.installed_version() == self.version:  # another pass installed it meanwhile
                return None
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                                   str(self.directory), self.package], capture_output=True,
                                  text=True, timeout=600, check=False)
        if done.returncode != 0 or self.installed_version() != self.version:
            raise RuntimeError(f"npm install {self.package} failed: {done.stderr[-2000:]}")
        return None

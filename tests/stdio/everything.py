"""`@modelcontextprotocol/server-everything` from the npm registry, at a pinned version, in a
project-local directory (.stdio-servers/, gitignored). `.ci/run` installs it; `ensure()` does
too when it is missing and npm is here, so the suite runs the same from a plain `make test`."""

from __future__ import annotations

from tests.npm_servers import ROOT, NpmServer

VERSION = "2026.8.31"
SERVER = NpmServer("@modelcontextprotocol/server-everything", VERSION, ROOT)
PACKAGE = SERVER.package
DIRECTORY = SERVER.directory
INSTALLED = SERVER.installed
installed_version = SERVER.installed_version
ensure = SERVER.ensure


if __name__ == "__main__":  # .ci/run
    reason = ensure()
    print(reason or f"{PACKAGE} installed in {DIRECTORY}")

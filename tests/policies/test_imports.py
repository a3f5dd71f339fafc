"""policies/ is decisions only: loading every module of it, in a fresh interpreter, loads no web
framework, HTTP client, JWT library or database driver, not even through a proxy/ module it
imports (ARCHITECTURE.md, "Packages")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

FORBIDDEN = ("quart", "hypercorn", "httpx", "aiohttp", "jwt", "sqlite3", "psycopg")

_PROBE = """
import importlib, pkgutil, sys
import orjson
import policies
names = [m.name for m in pkgutil.walk_packages(policies.__path__, "policies.")]
for name in names:
    importlib.import_module(name)
roots = sorted({m.partition(".")[0] for m in sys.modules})
sys.stdout.write(orjson.dumps({"modules": names, "roots": roots}).decode())
"""


def test_importing_every_policy_module_loads_no_framework() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, capture_output=True,
                          check=True, timeout=60)
    loaded = orjson.loads(done.stdout)
    assert "policies.egress" in loaded["modules"]  # the walk found the package's modules
    assert sorted(set(FORBIDDEN) & set(loaded["roots"])) == []

"""What tests/deploy reads: the repository's deployment files, and a config loader for them.

The deployment configs use tables that other parts of issue 15 add to proxy/config.py in
their own branches (`[observability]`, `server.sse_heartbeat_s`). Until those land, `load_config`
drops exactly those keys, and only while proxy.config does not know them, so everything else
in the files is validated by the real loader now, and all of it once they are merged.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.config import Config, ServerConfig, from_dict

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _fields(cls: type[Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def load_config(text: str, env: Mapping[str, str]) -> Config:
    """`text` (a config file's content) through proxy.config, as `tollhouse serve` would."""
    raw = tomllib.loads(text)
    if "observability" not in _fields(Config):
        raw.pop("observability", None)
    if "sse_heartbeat_s" not in _fields(ServerConfig):
        raw.get("server", {}).pop("sse_heartbeat_s", None)
    return from_dict(raw, env, base_dir=ROOT)


_COMPOSE_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def compose_interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?message}` and `$$`, as `docker compose`
    substitutes them from the environment and .env."""
    def repl(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise KeyError(f"{name}: {arg}")
        return ""

    return _COMPOSE_VAR.sub(repl, value)


def compose_variables(value: str) -> list[tuple[str, str | None]]:
    """Each `${VAR...}` in `value`: its name and its operator (None, ':-' or ':?')."""
    return [(m.group(1), m.group(2)) for m in _COMPOSE_VAR.finditer(value) if m.group(1)]

"""A stdio upstream's checks (`transport = "stdio"`): the command, its environment, one
process or one per person, its limits, and the user it runs as."""

from __future__ import annotations

import re
import typing

from proxy.config.errors import ConfigError
from proxy.config.values import positive

if typing.TYPE_CHECKING:
    from proxy.config.tables import UpstreamConfig

STDIO_ONLY = ("command", "args", "env", "cwd", "token_env", "run_as")  # refused on HTTP
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check(up: UpstreamConfig, where: str, mode: str) -> None:
    if up.url:
        raise ConfigError(f"config: '{where}.url' is not for a stdio upstream (it has a "
                          "command)")
    if not up.command:
        raise ConfigError(f"config: missing required key '{where}.command'")
    if up.headers or up.identity != "none":
        raise ConfigError(f"config: '{where}' is a stdio upstream: headers and identity "
                          "are for HTTP upstreams")
    if up.era == "modern":
        raise ConfigError(f"config: '{where}.era' must be auto or legacy: a stdio server "
                          "speaks 2025-11-25")
    for name in (*up.env, *([up.token_env] if up.token_env else [])):
        if not _ENV_NAME.match(name):
            raise ConfigError(f"config: '{where}.env' has an invalid variable name")
    _processes(up, where, mode)
    _limits(up, where)
    if up.run_as:
        import pwd

        try:
            pwd.getpwnam(up.run_as)
        except KeyError:
            raise ConfigError(f"config: '{where}.run_as': no user {up.run_as!r} on this "
                              "host") from None


def _processes(up: UpstreamConfig, where: str, mode: str) -> None:
    if up.process not in ("shared", "per_user"):
        raise ConfigError(f"config: '{where}.process' must be shared or per_user")
    if up.token_env and up.auth != "per_user":
        raise ConfigError(f"config: '{where}.token_env' needs auth = \"per_user\" (the "
                          "token is the person's own, from the connect flow)")
    if up.auth == "per_user" and (up.process != "per_user" or not up.token_env):
        raise ConfigError(f"config: '{where}.auth' = \"per_user\" on a stdio upstream needs "
                          "process = \"per_user\" and token_env: one process per person, "
                          "with that person's token")
    if up.max_processes < 1:
        raise ConfigError(f"config: '{where}.max_processes' must be at least 1")
    if up.process == "per_user" and mode != "jwt":
        raise ConfigError(f"config: '{where}.process' = \"per_user\" needs auth.mode = "
                          "\"jwt\": every caller is one anonymous principal otherwise")


def _limits(up: UpstreamConfig, where: str) -> None:
    for key in ("idle_stop_s", "start_timeout_s"):
        positive(getattr(up, key), f"{where}.{key}")
    for key in ("memory_limit_mb", "open_files_limit", "cpu_limit_s"):
        if getattr(up, key) < 0:
            raise ConfigError(f"config: '{where}.{key}' must be 0 (none) or more")
    if 0 < up.memory_limit_mb < 256:
        raise ConfigError(f"config: '{where}.memory_limit_mb' must be 0 or at least 256")
    if 0 < up.open_files_limit < 16:
        raise ConfigError(f"config: '{where}.open_files_limit' must be 0 or at least 16")
    if up.max_line_bytes < 1024:
        raise ConfigError(f"config: '{where}.max_line_bytes' must be at least 1024")

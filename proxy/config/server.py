"""`[server]`'s checks: the listen address, the public URL and origins, the sizes and times,
and the worker processes with their event loop."""

from __future__ import annotations

import importlib.util
import typing

from proxy.config.errors import ConfigError
from proxy.config.values import positive, url

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config


def check(cfg: Config) -> None:
    server = cfg.server
    if ":" not in server.listen:
        raise ConfigError("config: 'server.listen' must be host:port")
    try:
        port = server.port
    except ValueError:
        raise ConfigError("config: 'server.listen' must end in a port number") from None
    if not 0 <= port <= 65535:
        raise ConfigError("config: 'server.listen' port must be between 0 and 65535")
    url(server.public_url, "server.public_url")
    for i, origin in enumerate(server.allowed_origins):
        url(origin, f"server.allowed_origins[{i}]")
    positive(server.max_request_bytes, "server.max_request_bytes")
    positive(server.max_response_bytes, "server.max_response_bytes")
    positive(server.session_idle_timeout_s, "server.session_idle_timeout_s")
    positive(server.max_sessions, "server.max_sessions")
    if not 0 < server.shutdown_grace_s <= 3600:
        raise ConfigError("config: 'server.shutdown_grace_s' must be greater than 0 and at most "
                          "3600 seconds")
    if not 100 <= server.gc_threshold <= 1_000_000:
        raise ConfigError("config: 'server.gc_threshold' must be between 100 and 1000000")
    if server.gc_sweep_s != 0 and not 0.01 <= server.gc_sweep_s <= 3600:
        raise ConfigError("config: 'server.gc_sweep_s' must be 0 (no timed collections) or "
                          "between 0.01 and 3600 seconds")
    if server.sse_heartbeat_s != 0 and not 0.05 <= server.sse_heartbeat_s <= 3600:
        raise ConfigError("config: 'server.sse_heartbeat_s' must be 0 (no heartbeat) or between "
                          "0.05 and 3600 seconds")
    if not 30 <= server.connect_link_ttl_s <= 3600:
        raise ConfigError("config: 'server.connect_link_ttl_s' must be between 30 and 3600 "
                          "seconds")


def check_processes(cfg: Config) -> None:
    """`server.workers` and `server.event_loop`: more than one worker needs a shared state."""
    if not 1 <= cfg.server.workers <= 64:
        raise ConfigError("config: 'server.workers' must be between 1 and 64")
    if cfg.server.event_loop not in ("asyncio", "uvloop"):
        raise ConfigError("config: 'server.event_loop' must be asyncio or uvloop")
    if cfg.server.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError("config: 'server.event_loop' = uvloop needs the uvloop package, "
                          "which is not installed here (pip install uvloop)")
    if cfg.server.workers > 1 and not cfg.state.shared:
        raise ConfigError(f"config: 'server.workers' = {cfg.server.workers} needs a shared "
                          "'state.url' (redis://...): with \"memory\" each worker would keep "
                          "its own sessions, cancellations and limits")

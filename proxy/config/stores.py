"""`[database]` and `[state]`'s checks: where the records and the live state are kept. A store
URL may hold a password, so no message shows more of it than the scheme."""

from __future__ import annotations

import typing
from urllib.parse import urlsplit

from proxy.config.errors import ConfigError
from proxy.config.values import positive

if typing.TYPE_CHECKING:
    from proxy.config.tables import Config

STATE_SCHEMES = ("redis://", "rediss://")


def check_database(cfg: Config) -> None:
    positive(cfg.database.busy_timeout_s, "database.busy_timeout_s")
    if not 0 <= cfg.database.audit_commit_window_ms <= 1000:
        raise ConfigError("config: 'database.audit_commit_window_ms' must be between 0 and 1000")
    if cfg.database.audit_journal not in ("auto", "on", "off"):
        raise ConfigError("config: 'database.audit_journal' must be \"auto\", \"on\" or "
                          "\"off\"")
    if not cfg.database.url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError("config: 'database.url' must be sqlite:///PATH or "
                          "postgresql://USER:PASSWORD@HOST:PORT/DBNAME")


def check_state(cfg: Config) -> None:
    state = cfg.state
    # only the scheme is ever shown: a store URL may hold a password
    if state.url != "memory" and not state.url.startswith(STATE_SCHEMES):
        scheme = state.url.partition("://")[0] if "://" in state.url else state.url
        raise ConfigError(f"config: 'state.url' must be \"memory\", redis://HOST:PORT/DB or "
                          f"rediss://HOST:PORT/DB ({scheme[:20]!r} is not one)")
    if state.shared:
        try:
            parts = urlsplit(state.url)
            port = parts.port
            db = parts.path.strip("/")
        except ValueError:
            raise ConfigError("config: 'state.url' is not a valid Redis URL (its port is not a "
                              "number)") from None
        if not parts.hostname or (db and not db.isdigit()) or port == 0:
            raise ConfigError("config: 'state.url' must name a host, and a database number "
                              "if any: redis://HOST:PORT/DB")
    if not state.key_prefix or len(state.key_prefix) > 64 or any(
            c.isspace() or not c.isprintable() for c in state.key_prefix):
        raise ConfigError("config: 'state.key_prefix' must be 1-64 printable characters "
                          "without spaces")
    if not 0.05 <= state.timeout_s <= 30:
        raise ConfigError("config: 'state.timeout_s' must be between 0.05 and 30 seconds")

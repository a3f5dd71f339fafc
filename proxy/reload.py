"""SIGHUP: what of a re-read config file applies live, and what keeps its start-up value.

The tables each call decides by (upstreams, their access rules and tool profiles, identity,
headers and timeouts, `[[rate_limits]]`, `[metering]`, `[egress] collections`) apply from
the next call. The rest is fixed while the process runs: the listen address, the database,
the state store and the workers, and with them every key that start-up wires into a
long-lived object (all of `[server]`, `[auth]`, `[oauth_server]`, the metadata addresses, and
per-user upstreams, whose connections and sign-in routes exist only as started). A reload
that changes one of those keeps its running value and names the key in its one log line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from proxy.config import Config, UpstreamConfig

# the tables and keys that keep their start-up values, in the order the log line names them
FIXED = ("server", "auth", "database", "state", "oauth_server", "egress.metadata_addresses")


def fixed_changes(running: Config, read: Config) -> list[str]:
    """The keys that differ between the running config and the one read, and cannot change
    live: `server.listen`, `database.url`, `upstreams.github (per_user)`..."""
    changed: list[str] = []
    for path in FIXED:
        changed.extend(_differences(_at(running, path), _at(read, path), path))
    kept = _per_user(running)
    for up in read.upstreams:
        if up.name in kept and kept[up.name] != up or (up.name not in kept
                                                       and up.auth == "per_user"):
            changed.append(f"upstreams.{up.name} (per_user)")
    read_names = {u.name for u in read.upstreams}
    changed.extend(f"upstreams.{name} (per_user)" for name in kept if name not in read_names)
    return changed


def applied(running: Config, read: Config) -> Config:
    """The config a reload applies: `read`, with every fixed key as it runs now."""
    kept = _per_user(running)
    upstreams = [u for u in read.upstreams if u.auth != "per_user" and u.name not in kept]
    egress = dataclasses.replace(read.egress,
                                 metadata_addresses=running.egress.metadata_addresses)
    return dataclasses.replace(read, server=running.server, auth=running.auth,
                               database=running.database, state=running.state,
                               oauth_server=running.oauth_server, egress=egress,
                               upstreams=[*upstreams, *kept.values()])


def _per_user(cfg: Config) -> dict[str, UpstreamConfig]:
    return {u.name: u for u in cfg.upstreams if u.auth == "per_user"}


def _at(cfg: Config, path: str) -> Any:
    value: Any = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _differences(old: Any, new: Any, path: str) -> Iterator[str]:
    """Each leaf key under `path` whose value differs (a list or a table of tables counts as
    one key)."""
    if old == new:
        return
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new):
        for f in dataclasses.fields(old):
            yield from _differences(getattr(old, f.name), getattr(new, f.name),
                                    f"{path}.{f.name}")
        return
    yield path

"""SIGHUP: what of a re-read config file applies live, and what keeps its start-up value.

The tables each call decides by (upstreams, their access rules and tool profiles, identity,
headers and timeouts, `[[rate_limits]]`, `[metering]`, `[egress] collections`) apply from
the next call. The rest is fixed while the process runs: the listen address, the database,
the state store and the workers, the audit exports, and with them every key that start-up wires into a
long-lived object (all of `[server]`, `[auth]`, `[oauth_server]`, the metadata addresses, and
per-user upstreams, whose connections and sign-in routes exist only as started). A reload
that changes one of those keeps its running value and names the key in its one log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.compiled import build_gate, compile
from proxy.config import Config, ConfigError, UpstreamConfig, load, validate
from proxy.confine import Environment

if TYPE_CHECKING:
    from policies.cedar.gate import Gate
    from proxy.runtime.serving import Serving

log = logging.getLogger("tollhouse")

# the tables and keys that keep their start-up values, in the order the log line names them
# (the metrics, tracer and log format are built once, at start; so are the audit exports'
# workers and the audit writer's list of them)
FIXED = ("server", "auth", "database", "state", "oauth_server", "egress.metadata_addresses",
         "observability", "audit.exports")


async def reload(serving: Serving, path: Path, env: Environment | None = None) -> bool:
    """SIGHUP: apply the config file at `path` from the next call on, as the module says.
    One log line either way; a file that fails changes nothing. `${VAR}` is read from `env`,
    the environment the process started with (its secrets are out of os.environ), and a
    name read for the first time leaves os.environ as well."""
    try:
        running = serving.gateway.live.cfg
        try:
            read = await asyncio.to_thread(load, path, env)  # off the loop: files are read
        finally:
            if env is not None:
                env.withdraw()
        fixed = fixed_changes(running, read)
        cfg = applied(running, read)
        await asyncio.to_thread(validate, cfg, path.parent)
        # the Cedar policies read and validated before anything changes: a bad one refuses
        # the reload and the running policies stay
        gate = await asyncio.to_thread(build_gate, cfg, path.parent, serving.deps)
        await _apply(serving, cfg, gate)
    except ConfigError as exc:
        log.error("config reload from %s refused, nothing changed: %s", path, exc)
        return False
    except Exception as exc:  # noqa: BLE001 - a hook that does not import, a bad key file
        log.error("config reload from %s refused, nothing changed: %s: %s", path,
                  type(exc).__name__, exc)
        return False
    if fixed:
        log.warning("config reloaded from %s; these keys cannot change while serving and "
                    "keep their running values until a restart: %s", path, ", ".join(fixed))
    else:
        log.info("config reloaded from %s", path)
    return True


async def _apply(serving: Serving, cfg: Config, gate: Gate | None) -> None:
    """Compile the new config as start-up does (proxy.compiled), then swap it in within one
    step of the event loop: the route table, the registries' view, the policy chain."""
    gateway, local = serving.gateway, serving.services.local
    running = gateway.live
    serving.services.identity.prepare(cfg)
    gateway.auth.keep_claims(cfg)  # a per-caller URL added or changed may name a new claim
    gone = {u.name for u in running.cfg.upstreams} - {u.name for u in cfg.upstreams}
    async with serving.registry.changing():  # from here on nothing awaits: no call sees
        live = compile(cfg, serving.deps, running, gate)  # half of it
        local.keep_only({u.name for u in cfg.upstreams if u.stdio})
        serving.swap(live, gone)
    if serving.outbox is not None:
        serving.outbox.use(live.backend, cfg.metering)


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
                               observability=running.observability,
                               audit=dataclasses.replace(read.audit,
                                                         exports=running.audit.exports),
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

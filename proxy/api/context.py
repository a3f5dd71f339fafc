"""What the management API's handlers work with: one `Api`, built when the app starts serving
(proxy.runtime.serving), which `proxy.api.endpoint` hands every handler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cachetools import TTLCache

from policies.guardrails.pinning import Pins
from proxy.audit import AuditSink
from proxy.auth.group_roles import GroupRoles
from proxy.auth.keys import KeyIndex
from proxy.destinations import IPNetwork
from proxy.people.accounts import Accounts
from proxy.people.signin import Web
from proxy.pin_store import DatabasePins
from proxy.seen import LastSeen
from proxy.servers import Registry
from proxy.state.lockouts import LockoutStore
from proxy.state.sessions import SessionStore
from proxy.storage import db

if TYPE_CHECKING:
    from proxy.approvals import Approvals
    from proxy.auth.authenticator import Authenticator
    from proxy.people.deprovision import Deprovisioner
    from proxy.virtual.registry import Endpoints

AGGREGATES_S = 15.0  # how stale an audit aggregate may be


@dataclass
class Api:
    registry: Registry
    keys: KeyIndex | None  # the API keys that authenticate; None without auth.mode = "jwt"
    database: db.Target
    web: Web | None  # browser sign-in: None when no person signs in here
    lockouts: LockoutStore
    accounts: Accounts
    # drops what the gateway keeps in memory of a person (their upstream tokens), by
    # principal key, when their user is deleted
    forget_person: Callable[[str], None] | None = None
    trusted_proxies: tuple[IPNetwork, ...] = ()
    # the guardrails' pinned tool definitions (/api/v1/pins), where approvals are audited
    pins: Pins | None = None
    pin_store: DatabasePins | None = None
    audit: AuditSink | None = None
    endpoints: Endpoints | None = None  # the virtual endpoints (proxy.virtual.registry)
    # what the gateway last saw of each server (proxy.seen) and the live sessions, with
    # whether the store is this process's ("process") or every replica's ("cluster")
    seen: LastSeen | None = None
    sessions: SessionStore | None = None
    sessions_scope: str = "process"
    # what a person deleted loses first, on every replica (proxy.people.deprovision)
    deprovision: Deprovisioner | None = None
    # approvals (/api/v1/approvals, proxy.api.approvals): the decisions, and the MCP edge's
    # authenticator, by which an approver's bearer JWT is known there as at the edge
    approvals: Approvals | None = None
    edge: Authenticator | None = None
    # the groups mapped to roles (/api/v1/group-roles, proxy.auth.group_roles)
    group_roles: GroupRoles | None = None
    # the audit aggregates (/usage, /usage/series, /usage/summary) by query, for AGGREGATES_S:
    # a chart or the overview reloaded within that time reads no table again
    aggregates: TTLCache[Any, Any] = field(
        default_factory=lambda: TTLCache(maxsize=256, ttl=AGGREGATES_S))

    async def endpoint_names(self) -> list[str]:
        """The MCP endpoints this gateway serves: its servers' and its virtual ones'."""
        virtual = [e.name for e in await self.endpoints.list()] if self.endpoints else []
        return sorted({*await self.registry.names(), *virtual})

    async def aggregate(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """`fn(database, **kwargs)` in a worker thread, or its answer of the last
        AGGREGATES_S."""
        key = (fn.__name__, tuple(sorted(kwargs.items())))
        found = self.aggregates.get(key)
        if found is None:
            found = self.aggregates[key] = await asyncio.to_thread(
                lambda: fn(self.database, **kwargs))
        return found


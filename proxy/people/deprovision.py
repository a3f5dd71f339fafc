"""Deprovisioning (docs/provisioning.md): what a person set `active: false` or deleted, through
SCIM (`proxy.scim.storage.Changes`) or `/api/v1/users`, loses before that call answers, and
what reactivating gives back (the account, nothing else).

In this order, so that nothing of theirs works from the first step on: the keys their
credentials are refused by are written to `deprovisioned` (proxy.auth.deprovisioned: every
gateway's authenticator looks at the table's counter before each token it decides, so a
still-valid token of a configured issuer or of this gateway's authorization server is refused
on every replica from the moment the row is committed); then their browser sessions end, their
OAuth grants are revoked (the access tokens of each refused wherever the live-state store
reaches, the refresh rows deleted), their own API keys (`me:<id>:`) revoked, their MCP sessions
ended (the next request with one is 404 "session not found"), their pending approvals dropped,
and each upstream account they connected revoked at the upstream's revocation endpoint where it
has one and deleted from the vault. Every step is audited in one record of the person
(`people/deactivate`, `people/delete`, `people/reactivate`), each API key revoked in one of its
own (`keys/revoke`).

The live-state steps reach every replica through a shared store (Redis); with the memory store
there is one process, which is the one answering."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from proxy.audit.record import AuditRecord, AuditSink
from proxy.audit.rollup import MANAGEMENT
from proxy.auth import keys as api_keys
from proxy.auth.deprovisioned import Deprovisioned, link_keys, subject_key
from proxy.auth.principal import Principal
from proxy.errors import StoreUnavailable
from proxy.people.accounts import Accounts, User
from proxy.people.directory import Directory
from proxy.state.browser import BrowserSessions
from proxy.state.sessions import Session, SessionStore
from proxy.storage import db

log = logging.getLogger("tollhouse.people")

WHO = "tollhouse:deprovisioning"  # the principal of the records it writes
T = TypeVar("T")


class Grants(Protocol):
    """What deprovisioning asks of the authorization server (proxy.oauth.server)."""

    async def revoke_person(self, user_id: str) -> int: ...


class Approvals(Protocol):
    """What it asks of the approvals (proxy.approvals.Approvals.drop_for)."""

    async def drop_for(self, principal: Principal) -> int: ...


class Connected(Protocol):
    """What it asks of the per-user upstream connections (proxy.connect.manager)."""

    async def statuses(self, principal: str) -> dict[str, str]: ...

    async def disconnect(self, name: str, principal: str) -> None: ...

    def forget(self, principal: str, upstream: str | None = None) -> None: ...


@dataclass
class Lost:
    """What one deprovisioning took, for its record."""

    browser_sessions: int = 0
    grants: int = 0
    api_keys: int = 0
    mcp_sessions: int = 0
    approvals: int = 0
    upstreams: int = 0

    def note(self) -> str:
        return (f"browser sessions {self.browser_sessions}, OAuth grants {self.grants}, "
                f"API keys {self.api_keys}, MCP sessions {self.mcp_sessions}, pending "
                f"approvals {self.approvals}, upstream accounts {self.upstreams}")


@dataclass
class Held:
    """What a person holds open now: browser sessions (how many: their ids are secrets), MCP
    sessions, and the upstream accounts they connected (upstream to status)."""

    browser_sessions: int
    mcp_sessions: list[Session]
    upstreams: dict[str, str]


@dataclass
class Deprovisioner:
    """`proxy.scim.storage.Changes`, and what `/api/v1/users` calls before it deletes."""

    database: db.Target
    accounts: Accounts
    sessions: SessionStore
    audit: AuditSink
    deprovisioned: Deprovisioned | None = None
    browser: BrowserSessions | None = None
    grants: Grants | None = None
    connections: Connected | None = None
    # the approvals, once the gateway has them (proxy.runtime.serving sets it)
    approvals: Approvals | None = None

    def __post_init__(self) -> None:
        self._directory = Directory(self.database)

    async def deactivated(self, user_id: str) -> None:
        await self._take(user_id, "people/deactivate")

    async def deleted(self, user_id: str) -> None:
        """Before the person's rows are deleted (their credentials are found by them)."""
        await self._take(user_id, "people/delete")

    async def reactivated(self, user_id: str) -> None:
        """Active again: their keys refuse nothing any more (the account alone comes back:
        every credential taken stays taken)."""
        await self._db(self._directory.forgive, user_id)
        if self.deprovisioned is not None:
            await self.deprovisioned.changed()
        user = await self._db(self.accounts.get, user_id)
        self._record("people/reactivate", user_id, user, "the account is active again")

    async def held(self, user: User) -> Held:
        """What the person holds open now (GET /api/v1/users/<name>/sessions)."""
        principal = user.principal().key
        browser = await self.browser.count_for(user.id) if self.browser is not None else 0
        upstreams = await self.connections.statuses(principal) \
            if self.connections is not None else {}
        return Held(browser, await self.sessions.of(principal),
                    {n: s for n, s in upstreams.items() if s != "not_connected"})

    async def end_sessions(self, user: User, keep: str | None = None) -> Lost:
        """End the person's browser sessions (but `keep`: the caller's own, when they end
        their own) and MCP sessions, revoke their OAuth grants and upstream accounts; the
        person stays active, and their API keys stay (DELETE /api/v1/users/<name>/sessions,
        whose one audit record says what it took)."""
        lost = Lost()
        if self.browser is not None:
            lost.browser_sessions = await self.browser.end_for(user.id, keep=keep)
        await self._grants(user, lost)
        await self._sessions(user, lost)
        await self._upstreams(user, lost)
        return lost

    async def _take(self, user_id: str, action: str) -> None:
        """Every credential of the person taken; StoreUnavailable (503: the identity provider
        or script sends the call again, and every step runs again) if any step failed."""
        try:
            user = await self._db(self.accounts.get, user_id)
            if user is None:
                return
            facts = await self._db(self._directory.facts, user_id)
            keys = {subject_key(user.issuer, user.subject)}
            if facts is not None:
                keys |= link_keys(facts.keys())
            await self._db(self._directory.refuse, user_id, keys)
        except self.accounts.errors:
            raise StoreUnavailable("deprovisioning: the database is out of reach") from None
        if self.deprovisioned is not None:
            await self.deprovisioned.changed()  # this replica refuses them from now on
        lost = Lost()
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("browser sessions", lambda: self._browser(user, lost)),
            ("OAuth grants", lambda: self._grants(user, lost)),
            ("API keys", lambda: self._keys(user, lost)),
            ("MCP sessions", lambda: self._sessions(user, lost)),
            ("approvals", lambda: self._approvals(user, lost)),
            ("upstream accounts", lambda: self._upstreams(user, lost)),
        ]
        failed = []
        for what, step in steps:
            try:
                await step()
            except Exception:  # the other steps still run; the record says which failed
                log.exception("deprovisioning %s: %s failed", user.id, what)
                failed.append(what)
        note = lost.note() + (f"; failed: {', '.join(failed)}" if failed else "")
        self._record(action, user_id, user, note, failed=bool(failed))
        if failed:
            raise StoreUnavailable(f"deprovisioning: {', '.join(failed)} could not be taken")

    async def _browser(self, user: User, lost: Lost) -> None:
        if self.browser is not None:
            lost.browser_sessions = await self.browser.end_for(user.id)

    async def _grants(self, user: User, lost: Lost) -> None:
        if self.grants is not None:
            lost.grants = await self.grants.revoke_person(user.id)

    async def _keys(self, user: User, lost: Lost) -> None:
        owned = await self._db(api_keys.list_keys, self.database,
                               name_prefix=f"me:{user.id}:")
        for key in owned:
            if key.revoked_at is None and await self._db(api_keys.revoke, self.database,
                                                         key.id):
                lost.api_keys += 1
                self.audit.emit(AuditRecord(
                    endpoint=MANAGEMENT, method="keys/revoke", principal=WHO,
                    note=f"API key {key.id} revoked: its owner {user.name} (id {user.id}) "
                         "was deprovisioned"))

    async def _sessions(self, user: User, lost: Lost) -> None:
        lost.mcp_sessions = await self.sessions.end_for(user.principal().key)

    async def _approvals(self, user: User, lost: Lost) -> None:
        if self.approvals is not None:
            lost.approvals = await self.approvals.drop_for(user.principal())

    async def _upstreams(self, user: User, lost: Lost) -> None:
        if self.connections is None:
            return
        principal = user.principal().key
        for name, status in (await self.connections.statuses(principal)).items():
            if status != "not_connected":
                await self.connections.disconnect(name, principal)  # revoked, then deleted
                lost.upstreams += 1
        self.connections.forget(principal)

    def _record(self, action: str, user_id: str, user: User | None, note: str,
                failed: bool = False) -> None:
        """One record of the person: who they are (name, issuer|subject, users id) and what
        they lost, in its note."""
        who = f"{user.name} ({user.issuer}|{user.subject}, id {user_id})" if user is not None \
            else f"id {user_id}"
        self.audit.emit(AuditRecord(endpoint=MANAGEMENT, method=action, principal=WHO,
                                    status="error" if failed else "ok",
                                    note=f"{who}: {note}"[:1000]))

    async def _db(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await asyncio.to_thread(lambda: fn(*args, **kw))

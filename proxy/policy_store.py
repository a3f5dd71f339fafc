"""The Cedar policies created through /api/v1/policies (issue 37), stored in the `policies`
table every gateway on the database shares and mirrored in memory (proxy.mirror) for the Cedar
gate (policies.cedar.gate) to decide with, beside the config file's.

Each row is one policy: its id (the policy's id in decisions and audit records), its Cedar
text, its mode, its version (1 when created, one more on each replace), when it was created
and last changed, and who changed it last. What the gate reads is `policies` (each parsed, its
`file` "api" and its id the row's) and `version`, a counter that moves whenever they change: a
gate compares it on each call it decides and rebuilds its compiled set when it moved. A change
made through any gateway's API reaches every gateway (every replica and worker) within the
mirrors' poll interval (`proxy.mirror.POLL_S`, one second), this one's at once.

Validation is the caller's (`check`, given the whole set the change would leave: the gate's
`admits`); a write goes to the database first, inside the mirror's `changing()`, and is applied
once committed, as the server registry's are (proxy.servers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from policies.cedar.load import Mode, Policy, PolicyError, parse
from proxy.errors import Conflict, NotFound
from proxy.mirror import Mirrors
from proxy.storage import db

log = logging.getLogger("tollhouse.policies")

FILE = "api"  # the `file` of a policy created through the API, in ids and error lines
Check = Callable[[Sequence[Policy]], None]  # raises PolicyError: the set may not be stored


@dataclass(frozen=True)
class Stored:
    """One row of the table, and the policy parsed from it."""

    id: str
    text: str
    mode: Mode
    version: int
    created_at: float
    updated_at: float
    author: str | None
    policy: Policy


def parse_one(text: str, policy_id: str, mode: Mode) -> Policy:
    """The one policy `text` holds, with `policy_id` as its id and `mode` as its mode; raise
    PolicyError (one line, naming the policy) when it does not parse or holds none or several."""
    found = parse(text, FILE)
    if len(found) != 1:
        raise PolicyError(f"policy: {FILE}: policy {policy_id}: the text must hold exactly one "
                          f"policy, not {len(found)}")
    return replace(found[0], id=policy_id, mode=mode)


class PolicyStore:
    """The API's policies, in the database for every gateway and in memory for this one's
    gate (`policies`, `version`)."""

    def __init__(self, database: db.Database, mirrors: Mirrors) -> None:
        self._database = database
        self._rows: dict[str, Stored] = {}
        self.policies: tuple[Policy, ...] = ()
        self.version = 0  # moves with every change applied here
        self._listeners: list[Callable[[], None]] = []
        self._mirror = mirrors.mirror("policies", self._read_version, self._read_all,
                                      self._apply, errors=database.errors)
        self._apply(self._mirror.load_now())

    # -- reading -------------------------------------------------------------------------------

    def _apply(self, rows: dict[str, Stored]) -> None:
        if rows == self._rows:
            return
        self._rows = rows
        self.policies = tuple(r.policy for r in sorted(rows.values(), key=lambda r: r.id))
        self.version += 1
        for listener in self._listeners:
            listener()

    def listen(self, listener: Callable[[], None]) -> None:
        """`listener()` after each change applied (on the event loop, nothing awaited)."""
        self._listeners.append(listener)

    async def sync(self) -> None:
        """Catch up with changes other gateways made, if any."""
        await self._mirror.sync()

    async def rows(self) -> list[Stored]:
        await self.sync()
        return sorted(self._rows.values(), key=lambda r: r.id)

    async def get(self, policy_id: str) -> Stored | None:
        await self.sync()
        return self._rows.get(policy_id)

    # -- writing -------------------------------------------------------------------------------

    async def create(self, policy: Policy, text: str, author: str, check: Check) -> Stored:
        """Store `policy` (parsed from `text`) once `check` admits the set with it."""
        async with self._mirror.changing():
            await self._mirror.catch_up()  # validated against the set as it is now
            if policy.id in self._rows:
                raise Conflict(f"policy '{policy.id}' already exists")
            check([*self._rows_but(policy.id), policy])
            return await self._write(self._insert, policy, text, author)

    async def replace(self, policy: Policy, text: str, author: str, check: Check) -> Stored:
        async with self._mirror.changing():
            await self._mirror.catch_up()
            if policy.id not in self._rows:
                raise NotFound(f"policy '{policy.id}' not found")
            check([*self._rows_but(policy.id), policy])
            return await self._write(self._update, policy, text, author)

    async def delete(self, policy_id: str) -> None:
        async with self._mirror.changing():
            try:
                await self._mirror.run(self._delete, policy_id)
            finally:  # deleted, or gone already: as it is now
                await self._mirror.catch_up()

    def _rows_but(self, policy_id: str) -> list[Policy]:
        return [r.policy for r in self._rows.values() if r.id != policy_id]

    async def _write(self, fn: Callable[..., None], *args: Any) -> Stored:
        policy: Policy = args[0]
        try:
            await self._mirror.run(fn, *args)
        finally:  # written, or refused (another gateway wrote): see what is there now
            await self._mirror.catch_up()
        stored = self._rows.get(policy.id)
        if stored is None:  # deleted by another gateway in between
            raise NotFound(f"policy '{policy.id}' not found")
        return stored

    # -- the table (blocking: on the mirrors' pool) -----------------------------------------------

    def _read_version(self) -> int:
        with self._database.transaction() as conn:
            row = conn.execute(self._database.sql(
                "SELECT version FROM policies_version WHERE id = 1"), ()).fetchone()
        return int(row[0]) if row else 0

    def _read_all(self) -> tuple[int, dict[str, Stored]]:
        sql = self._database.sql
        with self._database.transaction() as conn:
            version = conn.execute(sql("SELECT version FROM policies_version WHERE id = 1"),
                                   ()).fetchone()
            rows = conn.execute(sql("SELECT id, text, mode, version, created_at, updated_at, "
                                    "author FROM policies"), ()).fetchall()
        found: dict[str, Stored] = {}
        for pid, text, mode, n, created, updated, author in rows:
            try:
                if mode not in ("enforce", "shadow"):
                    raise PolicyError(f"mode {mode!r}")
                policy = parse_one(text, pid, mode)
            except PolicyError as exc:  # written by a newer or older gateway: not decided
                log.error("policy %r in the database cannot be read (%s); it is not applied",
                          pid, exc)
                continue
            found[pid] = Stored(pid, text, mode, int(n), float(created), float(updated),
                                author, policy)
        return (int(version[0]) if version else 0), found

    def _insert(self, policy: Policy, text: str, author: str) -> None:
        now = time.time()
        try:
            with self._database.transaction() as conn:
                conn.execute(self._database.sql(
                    "INSERT INTO policies (id, text, mode, version, created_at, updated_at, "
                    "author) VALUES (?, ?, ?, 1, ?, ?, ?)"),
                    (policy.id, text, policy.mode, now, now, author))
        except self._database.integrity_errors:
            raise Conflict(f"policy '{policy.id}' already exists") from None

    def _update(self, policy: Policy, text: str, author: str) -> None:
        with self._database.transaction() as conn:
            cur = conn.execute(self._database.sql(
                "UPDATE policies SET text = ?, mode = ?, version = version + 1, "
                "updated_at = ?, author = ? WHERE id = ?"),
                (text, policy.mode, time.time(), author, policy.id))
            if cur.rowcount != 1:
                raise NotFound(f"policy '{policy.id}' not found")

    def _delete(self, policy_id: str) -> None:
        with self._database.transaction() as conn:
            cur = conn.execute(self._database.sql("DELETE FROM policies WHERE id = ?"),
                               (policy_id,))
            if cur.rowcount != 1:
                raise NotFound(f"policy '{policy_id}' not found")


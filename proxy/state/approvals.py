"""Approvals: a tool call held for a person's yes (proxy/approvals.py), shared by every replica,
so a decision taken on one releases the call waiting on another, and a retry on any finds it.

An approval is bound to one call: its `binding` is a digest of the caller, the endpoint, the
tool, the arguments' digest and the policy version (policies.approvals). `open` is the one step
a call takes: it uses a granted approval of its binding (once: `approved` becomes `used`),
finds the pending one, or makes a new one when the caller holds fewer than `max_pending`
pending approvals. `decide` turns a pending approval into `approved` (usable once, until
`decided_at + expires_s`) or `denied`, once; `expire` turns one past its time into `expired`,
once, whoever notices (the sweep), so that each expiry is audited once. A decision is
announced: in memory to the waiters of this process, in Redis on the `approvals` channel to
every replica's (`wait`), with a poll every `POLL_S` for a message missed while a
subscription was down.

Keys (Redis): `ap:a:<id>` a hash (`doc`: the approval's fixed JSON; `status`, `expires_at`
(ms), `decided_by`, `decided_at` (ms), `comment`), kept `KEEP_S` past its expiry so that a late
decision is answered 409 rather than 404; `ap:b:<binding>` the id of the binding's live
approval (PX its expiry); `ap:c:<digest of the caller>` a sorted set of the caller's pending
ids by expiry (the bound); `ap:i` a sorted set of every live id by expiry (the list, the
sweep). `open`, `decide`, `expire` and `drop` are one Lua script each; time is Redis's (TIME).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import orjson

if TYPE_CHECKING:
    from proxy.state.shared import Shared

Status = Literal["pending", "approved", "denied", "used", "expired"]
Opened = Literal["granted", "pending", "new", "full"]
Decided = Literal["decided", "missing", "conflict", "expired"]
KEEP_S = 3600.0  # an approval past its expiry is still answered (409, "expired") this long
POLL_S = 1.0  # a waiter reads the approval this often besides the announcements
MAX_ENTRIES = 100_000  # the memory store's bound on approvals kept


@dataclass(frozen=True, slots=True)
class Approval:
    """One approval. The fixed part is what the call was (`binding` names it exactly); the
    rest is its state. Times are wall-clock seconds. `arguments` are shown to approvers only
    (never audited, never in an answer to the caller)."""

    id: str
    rule: str
    caller: str  # the principal's key
    subject: str  # the principal's subject, shown
    endpoint: str
    tool: str
    digest: str  # of the arguments
    version: str  # of the policies that held the call
    binding: str
    approvers: tuple[str, ...]
    wait_s: float
    expires_s: float
    created_at: float
    expires_at: float
    arguments: dict[str, Any] = field(default_factory=dict)
    status: Status = "pending"
    decided_by: str = ""
    decided_at: float | None = None
    comment: str = ""

    def doc(self) -> bytes:
        return orjson.dumps({
            "id": self.id, "rule": self.rule, "caller": self.caller, "subject": self.subject,
            "endpoint": self.endpoint, "tool": self.tool, "digest": self.digest,
            "version": self.version, "binding": self.binding, "approvers": self.approvers,
            "wait_s": self.wait_s, "expires_s": self.expires_s, "created_at": self.created_at,
            "arguments": self.arguments})

    @classmethod
    def from_doc(cls, doc: bytes | str, state: dict[str, Any]) -> Approval:
        d = orjson.loads(doc)
        d["approvers"] = tuple(d.get("approvers") or ())
        return cls(**d, **state)

    def with_state(self, **state: Any) -> Approval:
        return replace(self, **state)


def new_id() -> str:
    return "apr_" + secrets.token_urlsafe(18)


def caller_digest(caller: str) -> str:
    return hashlib.sha256(caller.encode()).hexdigest()[:32]


class ApprovalStore(Protocol):
    async def open(self, fresh: Approval, max_pending: int) -> tuple[Opened, Approval | None]:
        """For `fresh.binding`: ("granted", it) when an approval of the binding was granted
        and is now used; ("pending", it) when one waits; else ("new", fresh) once stored, or
        ("full", None) when its caller already holds `max_pending` pending approvals."""

    async def get(self, approval_id: str) -> Approval | None: ...

    async def decide(self, approval_id: str, approve: bool, approver: str, comment: str
                     ) -> tuple[Decided, Approval | None, bool]:
        """A pending approval decided, once: ("decided", it, False). Otherwise ("missing",
        None), ("conflict", it: decided already), or ("expired", it, whether this call is
        the one that marked it expired)."""

    async def expire_due(self, limit: int = 100) -> list[Approval]:
        """The approvals past their expiry that this call marked expired (each once)."""

    async def pending(self, limit: int = 500) -> list[Approval]:
        """Pending approvals not yet expired, oldest first."""

    async def drop(self, caller: str) -> list[Approval]:
        """Forget `caller`'s pending approvals (a person deprovisioned); those dropped."""

    async def wait(self, approval_id: str, timeout_s: float) -> Approval | None:
        """The approval once decided (or expired), or as it is after `timeout_s`."""

    def start(self) -> None:
        """Inside the serving loop: listen for decisions (a shared store)."""


class _Waiters:
    """This process's calls waiting on approvals: each decision heard sets their events."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    def told(self, approval_id: str) -> None:
        for event in self._events.get(approval_id, ()):
            event.set()

    async def wait(self, approval_id: str, timeout_s: float) -> bool:
        event = asyncio.Event()
        self._events.setdefault(approval_id, set()).add(event)
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            held = self._events.get(approval_id)
            if held is not None:
                held.discard(event)
                if not held:
                    del self._events[approval_id]


async def _wait_for(store: ApprovalStore, waiters: _Waiters, approval_id: str,
                    timeout_s: float, clock: Callable[[], float]) -> Approval | None:
    """`clock` is the approvals' own (their expiry); the wait itself is real time (a call
    waits `wait_s` whatever a test's clock says)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await store.get(approval_id)
        if found is None or found.status != "pending" or found.expires_at <= clock():
            return found
        left = deadline - time.monotonic()
        if left <= 0:
            return found
        await waiters.wait(approval_id, min(left, POLL_S))


class MemoryApprovals:
    def __init__(self, clock: Callable[[], float] = time.time,
                 max_entries: int = MAX_ENTRIES) -> None:
        self._clock = clock
        self._max = max_entries
        self._by_id: dict[str, Approval] = {}
        self._bound: dict[str, str] = {}
        self._waiters = _Waiters()

    def start(self) -> None:
        return None

    async def open(self, fresh: Approval, max_pending: int) -> tuple[Opened, Approval | None]:
        now = self._clock()
        held = self._by_id.get(self._bound.get(fresh.binding, ""))
        if held is not None and held.expires_at > now:
            if held.status == "approved":
                used = self._by_id[held.id] = held.with_state(status="used")
                del self._bound[fresh.binding]
                return "granted", used
            if held.status == "pending":
                return "pending", held
        mine = sum(1 for a in self._by_id.values() if a.caller == fresh.caller
                   and a.status == "pending" and a.expires_at > now)
        if mine >= max_pending:
            return "full", None
        self._forget_old(now)
        self._by_id[fresh.id] = fresh
        self._bound[fresh.binding] = fresh.id
        return "new", fresh

    def _forget_old(self, now: float) -> None:
        if len(self._by_id) < self._max:
            return
        for old in [a for a in self._by_id.values() if a.expires_at + KEEP_S <= now]:
            self._unbind(old)
            del self._by_id[old.id]
        while len(self._by_id) >= self._max:  # still full: the oldest go
            self._unbind(self._by_id.pop(next(iter(self._by_id))))

    def _unbind(self, approval: Approval) -> None:
        if self._bound.get(approval.binding) == approval.id:
            del self._bound[approval.binding]

    async def get(self, approval_id: str) -> Approval | None:
        found = self._by_id.get(approval_id)
        if found is None or found.expires_at + KEEP_S <= self._clock():
            return None
        return found

    async def decide(self, approval_id: str, approve: bool, approver: str, comment: str
                     ) -> tuple[Decided, Approval | None, bool]:
        now = self._clock()
        found = await self.get(approval_id)
        if found is None:
            return "missing", None, False
        if found.status == "pending" and found.expires_at <= now:
            return "expired", self._expire(found), True
        if found.status != "pending":
            return ("expired" if found.status == "expired" else "conflict"), found, False
        decided = found.with_state(
            status="approved" if approve else "denied", decided_by=approver, decided_at=now,
            comment=comment, expires_at=now + found.expires_s if approve else found.expires_at)
        self._by_id[approval_id] = decided
        if not approve:
            self._unbind(decided)
        self._waiters.told(approval_id)
        return "decided", decided, False

    def _expire(self, found: Approval) -> Approval:
        expired = self._by_id[found.id] = found.with_state(status="expired")
        self._unbind(expired)
        self._waiters.told(found.id)
        return expired

    async def expire_due(self, limit: int = 100) -> list[Approval]:
        now = self._clock()
        due = [a for a in self._by_id.values()
               if a.status in ("pending", "approved") and a.expires_at <= now][:limit]
        return [self._expire(a) for a in due]

    async def pending(self, limit: int = 500) -> list[Approval]:
        now = self._clock()
        live = [a for a in self._by_id.values() if a.status == "pending" and a.expires_at > now]
        return sorted(live, key=lambda a: a.created_at)[:limit]

    async def drop(self, caller: str) -> list[Approval]:
        dropped = [a for a in self._by_id.values() if a.caller == caller
                   and a.status == "pending"]
        for approval in dropped:
            self._unbind(approval)
            del self._by_id[approval.id]
            self._waiters.told(approval.id)
        return dropped

    async def wait(self, approval_id: str, timeout_s: float) -> Approval | None:
        return await _wait_for(self, self._waiters, approval_id, timeout_s, self._clock)


# KEYS: approval hash, binding, caller set, index. ARGV: id, doc, max pending, expires_s (ms),
# keep (ms)
_OPEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('GET', KEYS[2])
if held then
  local hkey = ARGV[6] .. held
  local st = redis.call('HMGET', hkey, 'status', 'expires_at', 'doc')
  if st[1] and tonumber(st[2]) > now then
    if st[1] == 'approved' then
      redis.call('HSET', hkey, 'status', 'used')
      redis.call('DEL', KEYS[2])
      redis.call('ZREM', KEYS[4], held)
      local rest = redis.call('HMGET', hkey, 'decided_by', 'decided_at', 'comment')
      return {'granted', st[3], 'used', st[2], rest[1], rest[2], rest[3]}
    end
    if st[1] == 'pending' then
      return {'pending', st[3], 'pending', st[2], '', '', ''}
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then
  return {'full'}
end
local expires = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'status', 'pending', 'expires_at', expires)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], expires, ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('ZADD', KEYS[4], expires, ARGV[1])
return {'new', ARGV[2], 'pending', tostring(expires), '', '', ''}
"""

# KEYS: approval hash, index, caller-set prefix, binding prefix. ARGV: id, status, approver,
# comment, keep (ms), channel
_DECIDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'doc')
if not st[1] then
  return {'missing'}
end
local doc = cjson.decode(st[3])
if st[1] == 'pending' and tonumber(st[2]) <= now then
  redis.call('HSET', KEYS[1], 'status', 'expired')
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3] .. doc['caller_digest'], ARGV[1])
  redis.call('PUBLISH', ARGV[6], ARGV[1])
  return {'expired', '1'}
end
if st[1] ~= 'pending' then
  return {st[1] == 'expired' and 'expired' or 'conflict', '0'}
end
local expires = tonumber(st[2])
if ARGV[2] == 'approved' then
  expires = now + math.floor(tonumber(doc['expires_s']) * 1000)
  redis.call('SET', KEYS[4] .. doc['binding'], ARGV[1], 'PX', expires - now)
  redis.call('PEXPIRE', KEYS[1], expires - now + tonumber(ARGV[5]))
  redis.call('ZADD', KEYS[2], expires, ARGV[1])
else
  if redis.call('GET', KEYS[4] .. doc['binding']) == ARGV[1] then
    redis.call('DEL', KEYS[4] .. doc['binding'])
  end
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'decided_by', ARGV[3], 'decided_at', now,
           'comment', ARGV[4], 'expires_at', expires)
redis.call('ZREM', KEYS[3] .. doc['caller_digest'], ARGV[1])
redis.call('PUBLISH', ARGV[6], ARGV[1])
return {'decided', '0'}
"""

# KEYS: approval hash, index, caller-set prefix, binding prefix. ARGV: id, channel, drop (1/0)
_EXPIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local st = redis.call('HMGET', KEYS[1], 'status', 'expires_at', 'doc')
if not st[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
local doc = cjson.decode(st[3])
local live = st[1] == 'pending' or st[1] == 'approved'
if ARGV[3] == '1' then
  if st[1] ~= 'pending' then
    return 0
  end
elseif not live or tonumber(st[2]) > now then
  if not live then
    redis.call('ZREM', KEYS[2], ARGV[1])
  end
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3] .. doc['caller_digest'], ARGV[1])
if redis.call('GET', KEYS[4] .. doc['binding']) == ARGV[1] then
  redis.call('DEL', KEYS[4] .. doc['binding'])
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'status', 'expired')
end
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
"""

_STATE = ("status", "expires_at", "decided_by", "decided_at", "comment")


class RedisApprovals:
    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        base = shared.key("ap:")
        self._hash, self._bound, self._callers = base + "a:", base + "b:", base + "c:"
        self._index = base + "i"
        self._channel = shared.key("approvals")
        self._open = shared.script(_OPEN, "approvals")
        self._decide = shared.script(_DECIDE, "approvals")
        self._expire = shared.script(_EXPIRE, "approvals")
        self._waiters = _Waiters()

    def start(self) -> None:
        self._shared.subscribe(self._channel, self._heard)

    def _heard(self, data: bytes) -> None:
        self._waiters.told(data.decode(errors="replace"))

    def _doc(self, fresh: Approval) -> bytes:
        doc = orjson.loads(fresh.doc())
        doc["caller_digest"] = caller_digest(fresh.caller)
        return orjson.dumps(doc)

    async def open(self, fresh: Approval, max_pending: int) -> tuple[Opened, Approval | None]:
        reply = await self._open(
            [self._hash + fresh.id, self._bound + fresh.binding,
             self._callers + caller_digest(fresh.caller), self._index],
            [fresh.id, self._doc(fresh), max_pending, round(fresh.expires_s * 1000),
             round(KEEP_S * 1000), self._hash])
        kind = _text(reply[0])
        if kind == "full":
            return "full", None
        state = dict(zip(_STATE, [_text(r) for r in reply[2:]], strict=True))
        return kind, _approval(reply[1], state)  # type: ignore[return-value]

    async def get(self, approval_id: str) -> Approval | None:
        if not _plausible(approval_id):
            return None
        raw = await self._shared.command("approvals", "HMGET", self._hash + approval_id,
                                         "doc", *_STATE)
        if not raw or raw[0] is None:
            return None
        return _approval(raw[0], dict(zip(_STATE, [_text(r) for r in raw[1:]], strict=True)))

    def _keys(self, approval_id: str) -> list[str]:
        return [self._hash + approval_id, self._index, self._callers, self._bound]

    async def decide(self, approval_id: str, approve: bool, approver: str, comment: str
                     ) -> tuple[Decided, Approval | None, bool]:
        if not _plausible(approval_id):
            return "missing", None, False
        reply = await self._decide(self._keys(approval_id), [
            approval_id, "approved" if approve else "denied", approver, comment,
            round(KEEP_S * 1000), self._channel])
        kind = _text(reply[0])
        if kind == "missing":
            return "missing", None, False
        return kind, await self.get(approval_id), _text(reply[1]) == "1"  # type: ignore[return-value]

    async def expire_due(self, limit: int = 100) -> list[Approval]:
        now_ms = await self._now_ms()
        due = await self._shared.command("approvals", "ZRANGEBYSCORE", self._index, "-inf",
                                         now_ms, "LIMIT", 0, limit)
        out: list[Approval] = []
        for raw in due or ():
            approval_id = _text(raw)
            if await self._expire(self._keys(approval_id), [approval_id, self._channel, "0"]):
                found = await self.get(approval_id)
                if found is not None:
                    out.append(found)
        return out

    async def _now_ms(self) -> int:
        seconds, micros = await self._shared.command("approvals", "TIME")
        return int(seconds) * 1000 + int(micros) // 1000

    async def pending(self, limit: int = 500) -> list[Approval]:
        now_ms = await self._now_ms()
        ids = await self._shared.command("approvals", "ZRANGEBYSCORE", self._index,
                                         f"({now_ms}", "+inf", "LIMIT", 0, limit * 2)
        found = [await self.get(_text(i)) for i in ids or ()]
        live = [a for a in found if a is not None and a.status == "pending"]
        return sorted(live, key=lambda a: a.created_at)[:limit]

    async def drop(self, caller: str) -> list[Approval]:
        ids = await self._shared.command("approvals", "ZRANGE",
                                         self._callers + caller_digest(caller), 0, -1)
        dropped: list[Approval] = []
        for raw in ids or ():
            approval_id = _text(raw)
            found = await self.get(approval_id)
            if found is not None and await self._expire(self._keys(approval_id),
                                                        [approval_id, self._channel, "1"]):
                dropped.append(found)
        return dropped

    async def wait(self, approval_id: str, timeout_s: float) -> Approval | None:
        return await _wait_for(self, self._waiters, approval_id, timeout_s, time.time)


def _plausible(approval_id: str) -> bool:
    """An id this code could have made (`new_id`): anything else is not looked up."""
    return (approval_id.startswith("apr_") and len(approval_id) <= 64
            and all(c.isalnum() or c in "_-" for c in approval_id))


def _text(raw: Any) -> str:
    if raw is None:
        return ""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _approval(doc: Any, state: dict[str, str]) -> Approval:
    raw = orjson.loads(doc)
    raw.pop("caller_digest", None)
    decided_at = state.get("decided_at") or ""
    return Approval.from_doc(orjson.dumps(raw), {
        "status": state.get("status") or "pending",
        "expires_at": int(float(state.get("expires_at") or 0)) / 1000,
        "decided_by": state.get("decided_by") or "",
        "decided_at": int(float(decided_at)) / 1000 if decided_at else None,
        "comment": state.get("comment") or ""})

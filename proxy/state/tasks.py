"""Which caller created each task (MCP tasks, 2025-11-25): the binding every `tasks/*` request
is checked against, shared by every replica so that any of them serves a task's requests.

A task id is the upstream's, and an upstream that keeps one task store for all its clients
(a stateless server: every caller reaches it with the gateway's one credential) would answer
any caller's `tasks/get` for it; so the gateway binds the id, as the client sees it, to the
endpoint and the caller that created it (`bind`, before the answer that carries the id goes
out), answers every other caller as if the task did not exist, and shows each caller only its
own tasks in `tasks/list` (`owned`). `finish` marks a task's end once, whichever replica sees
it first, for its one completion record in the audit log.

A binding lives as long as the task does (its `ttl`, at most `MAX_TTL_S`). Keys:
`tk:b:<len>:<endpoint>:<task id>` (the binding, JSON, SET PX), `tk:o:<len>:<endpoint>:<owner>`
(a set of the owner's tasks, each `<len>:<tool><task id>`, its expiry moved to the longest
binding's), `tk:f:<len>:
<endpoint>:<task id>` (the end's mark, SET NX PX). `bind` is one Lua script; `finish` is one
too (the binding read and the mark set together).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from proxy.state.shared import Shared

MAX_TTL_S = 7 * 24 * 3600.0  # a task kept longer upstream is forgotten here after this
DEFAULT_TTL_S = 24 * 3600.0  # a task whose ttl the upstream left unlimited (null)


@dataclass(frozen=True, slots=True)
class TaskBinding:
    """Who created a task, on which endpoint, running which tool (and, on a virtual endpoint,
    which member owns it under which id of its own)."""

    owner: str  # the principal's key
    subject: str  # the principal's subject, for the completion's audit record
    tool: str
    created_at: float  # wall time
    member: str | None = None
    upstream_id: str | None = None  # the member's own id (a virtual endpoint's task)

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, data: bytes | str) -> TaskBinding | None:
        try:
            obj = orjson.loads(data)
            return cls(**obj) if isinstance(obj, dict) else None
        except (orjson.JSONDecodeError, TypeError):
            return None


def ttl_of(task: dict[str, Any]) -> float:
    """How long a task's binding is kept: its `ttl` (milliseconds), within the bounds."""
    ttl = task.get("ttl")
    if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl > 0:
        return min(ttl / 1000, MAX_TTL_S)
    return DEFAULT_TTL_S


class TaskStore(Protocol):
    async def bind(self, endpoint: str, task_id: str, binding: TaskBinding,
                   ttl_s: float) -> None:
        """Keep `binding` for the task `task_id` of `endpoint`."""

    async def binding(self, endpoint: str, task_id: str) -> TaskBinding | None:
        """The task's binding, or None (never bound, or forgotten)."""

    async def owned(self, endpoint: str, owner: str) -> dict[str, str]:
        """The tasks `owner` created on `endpoint` (some possibly forgotten): id -> tool."""

    async def finish(self, endpoint: str, task_id: str) -> TaskBinding | None:
        """The binding, the first time the task's end is marked; None after (or unbound)."""


def _key(endpoint: str, rest: str) -> str:
    return f"{len(endpoint)}:{endpoint}:{rest}"


class MemoryTaskStore:
    def __init__(self, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._max = max_entries
        # key -> (expiry, binding, endpoint, task id)
        self._bound: OrderedDict[str, tuple[float, TaskBinding, str, str]] = OrderedDict()
        self._owned: dict[str, dict[str, str]] = {}
        self._finished: set[str] = set()

    async def bind(self, endpoint: str, task_id: str, binding: TaskBinding,
                   ttl_s: float) -> None:
        key = _key(endpoint, task_id)
        self._bound[key] = (self._clock() + ttl_s, binding, endpoint, task_id)
        self._bound.move_to_end(key)
        self._owned.setdefault(_key(endpoint, binding.owner), {})[task_id] = binding.tool
        while len(self._bound) > self._max:
            old, held = self._bound.popitem(last=False)
            self._forget(old, held)

    def _forget(self, key: str, held: tuple[float, TaskBinding, str, str]) -> None:
        self._finished.discard(key)
        _, binding, endpoint, task_id = held
        owner = _key(endpoint, binding.owner)
        owned = self._owned.get(owner)
        if owned is not None:
            owned.pop(task_id, None)
            if not owned:
                del self._owned[owner]

    async def binding(self, endpoint: str, task_id: str) -> TaskBinding | None:
        key = _key(endpoint, task_id)
        held = self._bound.get(key)
        if held is None:
            return None
        if held[0] <= self._clock():
            del self._bound[key]
            self._forget(key, held)
            return None
        return held[1]

    async def owned(self, endpoint: str, owner: str) -> dict[str, str]:
        return dict(self._owned.get(_key(endpoint, owner), {}))

    async def finish(self, endpoint: str, task_id: str) -> TaskBinding | None:
        binding = await self.binding(endpoint, task_id)
        key = _key(endpoint, task_id)
        if binding is None or key in self._finished:
            return None
        self._finished.add(key)
        return binding


_BIND = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
"""

_FINISH = """
local bound = redis.call('GET', KEYS[1])
if not bound then
  return false
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then
  ttl = 1
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ttl) then
  return bound
end
return false
"""


class RedisTaskStore:
    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        base = shared.key("tk:")
        self._bound, self._owned, self._done = base + "b:", base + "o:", base + "f:"
        self._bind = shared.script(_BIND, "tasks")
        self._finish = shared.script(_FINISH, "tasks")

    async def bind(self, endpoint: str, task_id: str, binding: TaskBinding,
                   ttl_s: float) -> None:
        await self._bind([self._bound + _key(endpoint, task_id),
                          self._owned + _key(endpoint, binding.owner)],
                         [binding.dumps(), max(1, round(ttl_s * 1000)),
                          f"{len(binding.tool)}:{binding.tool}{task_id}"])

    async def binding(self, endpoint: str, task_id: str) -> TaskBinding | None:
        held = await self._shared.command("tasks", "GET", self._bound + _key(endpoint, task_id))
        return None if held is None else TaskBinding.loads(held)

    async def owned(self, endpoint: str, owner: str) -> dict[str, str]:
        members = await self._shared.command("tasks", "SMEMBERS",
                                             self._owned + _key(endpoint, owner))
        owned: dict[str, str] = {}
        for member in members or ():  # "<len>:<tool><task id>"
            text = member.decode() if isinstance(member, bytes) else str(member)
            size, _, rest = text.partition(":")
            if size.isdigit():
                owned[rest[int(size):]] = rest[:int(size)]
        return owned

    async def finish(self, endpoint: str, task_id: str) -> TaskBinding | None:
        held = await self._finish([self._bound + _key(endpoint, task_id),
                                   self._done + _key(endpoint, task_id)], [])
        return TaskBinding.loads(held) if held else None

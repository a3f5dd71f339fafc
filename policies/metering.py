"""The metering hook, last in the chain so that a call denied by anything else is never billed.

Before a metered call is forwarded, the hook is asked to authorize it; it may allow, or deny with
a `reason` and optionally a `user_message` for the person. A hook that cannot answer within
`timeout_ms` refuses the call (fail closed), or allows it with `on_error = "allow"`; both are
audited. After the call, the gateway records one usage event through a durable outbox (the
call id set here is its idempotency key).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from proxy.bounded import within
from proxy.errors import MeteringDenied, ToolResultDenial

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.config import MeteringConfig
    from proxy.jsonrpc import McpMessage


class MeteringBackend(Protocol):
    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        """{"allow": true} or {"allow": false, "reason": "...", "user_message": "..."}."""

    async def record(self, event: dict[str, Any]) -> None:
        """Deliver one usage event; raise to have it retried."""


class _RandomBytes:
    """The operating system's random bytes (`os.urandom`), read 4 KiB at a time and handed
    out in slices. os.urandom lets the GIL go around its getrandom call, so a call per metered
    request gave the audit writer and the outbox threads the GIL at that moment and the event
    loop waited to get it back (up to 20 us a call in process while they were busy;
    bench/README.md, "Every policy on: the commit window and the writer's threads"). A slice is
    as random as the call would have been; the buffer is dropped in a forked child (parent and
    child would otherwise hand out the same bytes)."""

    SIZE = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()  # (the loop is the only caller today; cheap if not)
        self._buf = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._buf, self._at = b"", 0

    def take(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._buf):
                self._buf, at = os.urandom(max(self.SIZE, n)), 0
            self._at = at + n
            return self._buf[at:at + n]


_random = _RandomBytes()


def new_call_id() -> str:
    """A usage event's idempotency key: 24 hex digits, the time in milliseconds (48 bits) then
    48 random bits. Keys made later sort later, so each lands at the right edge of the unique
    indexes on it (the audit log's audit_call_id, the outbox's primary key) and a commit of a
    batch writes a leaf page or two of each, not one per record at a random place (on SQLite
    the writer spent about twice the time on a metered record with random keys). Unguessable
    all the same: two calls of one millisecond differ in 48 random bits."""
    return f"{time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF:012x}{_random.take(6).hex()}"


class Metering:
    name: ClassVar[str] = "metering"
    order: ClassVar[int] = 500

    def __init__(self, cfg: MeteringConfig, backend: MeteringBackend) -> None:
        self._methods = frozenset(cfg.methods)
        self._timeout_s = cfg.timeout_ms / 1000
        self._fail_open = cfg.on_error == "allow"
        self._backend = backend

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        if call.method not in self._methods or call.kind != "request":
            return
        call_id = new_call_id()
        request = {"call_id": call_id, "principal": ctx.principal.subject,
                   "endpoint": ctx.endpoint, "tool": call.tool,
                   "arguments_bytes": ctx.arguments_size, "at": time.time()}
        if ctx.principal.actor:  # an agent acting for the principal: the hook may key on it
            request["actor"] = ctx.principal.actor
        try:
            # (no timer when the hook answers without waiting: an in-process one mostly does)
            decision = await within(self._backend.authorize(request), self._timeout_s)
            allow = decision.get("allow")
            if not isinstance(allow, bool):
                raise ValueError("the hook's answer has no boolean 'allow'")  # noqa: TRY004
        except (Exception, TimeoutError) as exc:  # noqa: BLE001 - any hook failure is one case
            what = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            if not self._fail_open:
                self._deny_unavailable(call, what)
            ctx.audit_note = f"metering: authorize {what}; allowed by on_error"
            ctx.call_id = call_id
            return
        if allow:
            ctx.call_id = call_id
            return
        reason = decision.get("reason")
        reason = reason if isinstance(reason, str) and reason else "denied by the metering hook"
        user_message = decision.get("user_message")
        if isinstance(user_message, str) and user_message and call.method == "tools/call":
            raise ToolResultDenial(reason, user_message, "gateway.metering.denied")
        raise MeteringDenied(reason)

    def _deny_unavailable(self, call: McpMessage, what: str) -> None:
        reason = f"metering: authorize {what}"
        if call.method == "tools/call":
            raise ToolResultDenial(reason, "The call could not be authorized for billing; "
                                   "try again shortly.", "gateway.metering.unavailable")
        raise MeteringDenied("metering unavailable")

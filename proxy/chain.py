"""The policy protocol and the chain that runs policies in their declared order.

Policies see plain objects (`McpMessage`, `CallContext`), never the web framework or the HTTP
client, so each is tested with plain objects and could run behind another server.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from proxy.auth.principal import Principal
from proxy.errors import GatewayError, InternalError
from proxy.jsonrpc import McpMessage
from proxy.traced import CURRENT

if TYPE_CHECKING:
    from proxy.mcp.tasks import TaskCall

Rewrite = Callable[[dict[str, Any]], bool]
Verdict = Literal["kept", "changed", "dropped"]
# a notification on a call's stream (the whole JSON-RPC message), edited in place
Notice = Callable[[dict[str, Any]], Verdict]
# the notifications a `Notice` is given: those that carry what an upstream says (a log entry's
# data, a progress message, a task's status message); the relay passes any other on unread
NOTICED = frozenset({"notifications/message", "notifications/progress",
                     "notifications/tasks/status"})


@dataclass(slots=True)
class CallContext:
    """What a policy may read about one call, and, below the line, what a policy tells the
    steps after it (typed fields, each written by the one policy that owns it)."""

    principal: Principal
    endpoint: str
    upstream_url: str
    era: str = "legacy"
    session_hash: str | None = None
    arguments_size: int = 0
    api_key_id: str | None = None
    peer_ip: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    clock: Callable[[], float] = field(default=time.monotonic)
    dial_key: str = ""  # the egress entry of a per-caller upstream's resolved URL
    # the chain run again for a call held for approval and now approved (proxy/approvals.py):
    # a policy that counts calls (rate limits) counted it on the first run
    recheck: bool = False
    # a virtual endpoint's own view of a call: what its members answer is decided per member,
    # with the member's context (proxy.virtual), so a policy that decides by the upstream's
    # own names (Cedar) stands aside here
    virtual: bool = False
    # -- outputs ---------------------------------------------------------------------------
    call_id: str | None = None  # metering: the usage event's idempotency key
    audit_note: str | None = None  # metering: e.g. a hook that failed and on_error allowed
    message: McpMessage | None = None  # guardrails: the call as forwarded (arguments redacted)
    policy: dict[str, Any] | None = None  # cedar: the decision's audit object
    task: TaskCall | None = None  # the spine (proxy.mcp.tasks): the task a tasks/* names
    approval: dict[str, Any] | None = None  # approvals: the approval this call used up


class Policy(Protocol):
    name: ClassVar[str]
    order: ClassVar[int]

    def check(self, call: McpMessage, ctx: CallContext) -> Awaitable[None]:
        """Return to allow; raise a GatewayError subclass (a PolicyDenied) to deny. An
        `async def` as a rule; a policy that most calls do not concern may answer those with
        an awaitable already finished (policies.cedar.gate), and save the chain a coroutine."""


@runtime_checkable
class Rewriter(Protocol):
    """A policy that edits what an upstream answers (hiding names from a */list result)."""

    def rewriter(self, call: McpMessage, ctx: CallContext) -> Rewrite | None:
        """The edit for this call; None when there is nothing to do."""


@runtime_checkable
class Hider(Protocol):
    """A `Rewriter` that can say, narrower than its rewriter, whether it may hide a name."""

    def hides(self, listing: McpMessage, ctx: CallContext) -> bool: ...


@runtime_checkable
class Noticer(Protocol):
    """A policy that reads the notifications an upstream sends on a call's stream."""

    def noticer(self, call: McpMessage, ctx: CallContext) -> Notice | None:
        """The reader for this call; None when it reads none."""


@runtime_checkable
class NoticeScope(Protocol):
    """A `Noticer` that can say, per endpoint, whether it reads any notification."""

    def notices(self, endpoint: str) -> bool: ...


class Chain:
    """Policies sorted by `order`; two with the same order are a start-up error. Which of
    them also rewrite answers or read notifications is settled here, once, by the protocols
    they implement (`Rewriter`, `Noticer`)."""

    def __init__(self, policies: Sequence[Policy]) -> None:
        ordered = sorted(policies, key=lambda p: p.order)
        for a, b in itertools.pairwise(ordered):
            if a.order == b.order:
                raise ValueError(f"policies {a.name!r} and {b.name!r} share order {a.order}")
        self.policies: tuple[Policy, ...] = tuple(ordered)
        self._rewriters: tuple[Rewriter, ...] = tuple(
            p for p in ordered if isinstance(p, Rewriter))
        self._noticers: tuple[Noticer, ...] = tuple(p for p in ordered if isinstance(p, Noticer))
        # what each says of itself, settled here and not on every call (a protocol's
        # isinstance walks its members)
        self._hiding = tuple((p, p if isinstance(p, Hider) else None) for p in self._rewriters)
        self._scoped = tuple(p if isinstance(p, NoticeScope) else None for p in self._noticers)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.policies]

    def rewriter(self, call: McpMessage, ctx: CallContext) -> Rewrite | None:
        """Response-side work for this call (hiding what the caller may not use in a */list
        result): one function that edits a result in place and says whether it changed it,
        or None when no policy has anything to do, which is the common case."""
        found: list[Rewrite] = [f for p in self._rewriters
                                if (f := p.rewriter(call, ctx)) is not None]
        if not found:
            return None
        if len(found) == 1:
            return found[0]

        def all_of(result: dict[str, Any]) -> bool:
            return any([f(result) for f in found])  # noqa: C419 - every rewriter must run

        return all_of

    def noticer(self, call: McpMessage, ctx: CallContext) -> Notice | None:
        """What inspects the notifications an upstream sends on this call's stream before (or
        after) its answer: one function that edits one in place and says whether it is kept,
        changed or dropped; None, the common case, when no policy reads them (the relay then
        parses nothing more than it did)."""
        found: list[Notice] = [f for p in self._noticers
                               if (f := p.noticer(call, ctx)) is not None]
        if not found:
            return None
        if len(found) == 1:
            return found[0]

        def all_of(message: dict[str, Any]) -> Verdict:
            verdict: Verdict = "kept"
            for f in found:
                seen = f(message)
                if seen == "dropped":
                    return seen
                if seen == "changed":
                    verdict = seen
            return verdict

        return all_of

    def hides(self, listing: McpMessage, ctx: CallContext) -> bool:
        """Whether any policy may hide from this caller a name that `listing` (a */list)
        gives, so that a name the upstream does not have must answer as a hidden one does
        (proxy.mcp.names); one that rewrites the list and says nothing narrower is taken to."""
        return any(hider.hides(listing, ctx) if hider is not None
                   else p.rewriter(listing, ctx) is not None for p, hider in self._hiding)

    def notices(self, endpoint: str) -> bool:
        """Whether any policy may read the notifications of a call on `endpoint` (one whose
        `noticer` says nothing narrower is taken to read them all)."""
        return any(scope.notices(endpoint) if scope is not None else True
                   for scope in self._scoped)

    async def run(self, call: McpMessage, ctx: CallContext, *,
                  only: Collection[str] | None = None, without: Collection[str] = ()) -> None:
        """`only`, `without`: a virtual endpoint runs some policies per member (proxy/virtual)."""
        trace = CURRENT.get()  # tracing on: each decision is an event of the message's span
        policies = self.policies if only is None and not without else [
            p for p in self.policies
            if (only is None or p.name in only) and p.name not in without]
        for policy in policies:
            try:
                await policy.check(call, ctx)
            except GatewayError as exc:
                if exc.decided_by is None:
                    exc.decided_by = policy.name  # the denial metric's `policy` label
                if trace is not None:
                    trace.decided(policy.name, exc)
                raise
            except Exception as exc:  # fail closed: a broken policy forwards nothing
                failed = InternalError(f"policy {policy.name} failed: {type(exc).__name__}")
                if trace is not None:
                    trace.decided(policy.name, failed)
                raise failed from exc
            if trace is not None:
                trace.decided(policy.name, None)

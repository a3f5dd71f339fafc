"""Approval gates (`[[approvals]]`): a tool call a rule names waits for a person's yes, bound to
exactly that call.

`Approvals` is the chain's policy at order 450: after every other policy (access, Cedar, rate
limits, egress, guardrails on the arguments) and before metering, so a call a person refuses
is never billed and never reaches the upstream. For a tools/call a rule matches (its
endpoints, its tool globs, its Cedar `when`: policies.approvals.when) it asks the approval
store (proxy.state.approvals) once: an approval granted for this exact call is used up and
the call goes on (`ctx.approval` names it for the audit record); otherwise the call is held:
`ApprovalRequired` carries the pending approval (the one already asked for this call, or a new
one), which the spine turns into a wait for the decision (proxy/approvals.py).

What an approval is bound to (`binding`): the caller (the principal's key), the endpoint, the
tool, a digest of the arguments (their canonical JSON: keys sorted) and the policy version (a
digest of the rule and of the Cedar policies' version, so a change of either voids it). A
caller holds at most `MAX_PENDING` pending approvals; past that a new call a rule holds is
refused, retryable (`gateway.approval.too_many`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from policies.approvals.when import Condition
from policies.cedar.book import TargetBook
from proxy.config.approvals import ApprovalRule
from proxy.errors import ApprovalRequired, ToolResultDenial
from proxy.state.approvals import Approval, ApprovalStore, new_id

if TYPE_CHECKING:
    from proxy.chain import CallContext
    from proxy.jsonrpc import McpMessage

MAX_PENDING = 20  # pending approvals one caller may hold at once
SHOWN_MAX = 8192  # the arguments' JSON kept to show approvers, at most (bytes)


def arguments_digest(arguments: Any) -> str:
    """The digest an approval binds the arguments by: their canonical JSON (keys sorted)."""
    return hashlib.sha256(orjson.dumps(arguments if arguments is not None else {},
                                       option=orjson.OPT_SORT_KEYS)).hexdigest()


def binding_of(caller: str, endpoint: str, tool: str, digest: str, version: str) -> str:
    parts = orjson.dumps([caller, endpoint, tool, digest, version])
    return hashlib.sha256(parts).hexdigest()[:40]


def shown(arguments: Any) -> dict[str, Any]:
    """The arguments as approvers see them, or a note of their size when too large."""
    data = orjson.dumps(arguments if isinstance(arguments, dict) else {})
    if len(data) > SHOWN_MAX:
        return {"(not shown)": f"the arguments are {len(data)} bytes"}
    return arguments if isinstance(arguments, dict) else {}


@dataclass(frozen=True)
class Rule:
    """One `[[approvals]]` table, compiled."""

    name: str
    endpoints: frozenset[str]
    tools: re.Pattern[str]
    when: Condition | None
    approvers: tuple[str, ...]
    wait_s: float
    expires_s: float
    version: str  # a digest of the table as written

    @classmethod
    def of(cls, rule: ApprovalRule, book: TargetBook, claims: tuple[str, ...]) -> Rule:
        text = orjson.dumps([rule.name, sorted(rule.endpoints), rule.tools, rule.when,
                             rule.approvers, rule.wait_s, rule.expires_s])
        return cls(rule.name, frozenset(rule.endpoints),
                   re.compile("|".join(fnmatch.translate(t) for t in rule.tools)),
                   Condition(rule.name, rule.when, book, claims) if rule.when.strip() else None,
                   tuple(rule.approvers), rule.wait_s, rule.expires_s,
                   hashlib.sha256(text).hexdigest()[:12])

    def names(self, endpoint: str, tool: str) -> bool:
        return (not self.endpoints or endpoint in self.endpoints) and bool(
            self.tools.match(tool))


class TooManyPending(ToolResultDenial):
    """The caller holds `MAX_PENDING` pending approvals already."""

    def __init__(self) -> None:
        super().__init__("approvals: too many pending approvals for this caller",
                         f"This call needs approval, and you already have {MAX_PENDING} "
                         "calls waiting for one; retry once some are decided.",
                         "gateway.approval.too_many", retry_after_ms=30_000)


class Approvals:
    """The chain's approval gate. `link(id)` is an approval's console URL; `cedar_version()`
    the Cedar policies' version now (part of the policy version an approval is bound to)."""

    name: ClassVar[str] = "approvals"
    order: ClassVar[int] = 450

    def __init__(self, rules: Sequence[ApprovalRule], store: ApprovalStore, book: TargetBook,
                 *, link: Callable[[str], str], claims: tuple[str, ...] = (),
                 cedar_version: Callable[[], str] = lambda: "",
                 clock: Callable[[], float] = time.time) -> None:
        self.rules = tuple(Rule.of(r, book, claims) for r in rules)  # PolicyError at load
        self._store = store
        self._link = link
        self._cedar_version = cedar_version
        self._clock = clock

    @classmethod
    def wanted(cls, rules: Sequence[ApprovalRule]) -> bool:
        return bool(rules)

    def rule_for(self, call: McpMessage, ctx: CallContext) -> Rule | None:
        params = call.params or {}
        tool = params.get("name")
        if call.method != "tools/call" or ctx.virtual or not isinstance(tool, str):
            return None
        arguments = params.get("arguments")
        arguments = arguments if isinstance(arguments, Mapping) else {}
        for rule in self.rules:
            if rule.names(ctx.endpoint, tool) and (rule.when is None or rule.when.holds(
                    ctx.principal, ctx.endpoint, tool, arguments, ctx.era)):
                return rule
        return None

    def fresh(self, rule: Rule, call: McpMessage, ctx: CallContext) -> Approval:
        """The approval this call would ask for: bound to it exactly."""
        params = call.params or {}
        tool = str(params.get("name"))
        arguments = params.get("arguments")
        digest = arguments_digest(arguments)
        version = f"{rule.version}.{self._cedar_version() or '-'}"
        now = self._clock()
        return Approval(
            id=new_id(), rule=rule.name, caller=ctx.principal.key,
            subject=ctx.principal.subject, endpoint=ctx.endpoint, tool=tool, digest=digest,
            version=version,
            binding=binding_of(ctx.principal.key, ctx.endpoint, tool, digest, version),
            approvers=rule.approvers, wait_s=rule.wait_s, expires_s=rule.expires_s,
            created_at=now, expires_at=now + rule.expires_s, arguments=shown(arguments))

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        rule = self.rule_for(call, ctx)
        if rule is None:
            return
        kind, found = await self._store.open(self.fresh(rule, call, ctx), MAX_PENDING)
        if kind == "granted" and found is not None:
            ctx.approval = {"id": found.id, "rule": found.rule, "decision": "approved",
                            "approver": found.decided_by}
            return
        if found is None:
            raise TooManyPending()
        raise ApprovalRequired(found, self._link(found.id), new=kind == "new")

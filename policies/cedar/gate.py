"""The Cedar policies in the chain (`Gate`, order 150: after the access rules, before rate
limits): it decides tools/call, resources/read and prompts/get on the endpoints its policies
govern, and hides from tools/list and prompts/list what no call could be permitted.

Which endpoints it governs: those a policy's resource scope can reach (`resource` alone reaches
every endpoint; `resource in Tollhouse::Endpoint::"github"` or `== Tollhouse::Tool::"github/x"`
only that one). On a governed endpoint Cedar's rules hold: a `forbid` wins, no `permit` means
deny. On an endpoint no policy names, Cedar decides nothing and costs one set lookup. The
access rules (`[upstreams.access]`) run first, at order 100: both must allow.

A refusal: a tool no call of which could be permitted answers as an unknown tool (-32602,
as a hidden one does); a listed tool refused for its arguments answers a tool result with
`isError` and seed 001's `gateway.policy.denied`, the message the deciding forbid's
`@reason` (a default without one), never an argument's value; a prompt or resource refused for
its arguments answers -32602 naming the reason. An evaluation error refuses (fail closed) and
is audited. Every decision on a governed endpoint leaves its audit object in the context
(`ctx.policy`; a refusal carries it in its `data`): the policy version, the decision and the
deciding policy ids, and the shadow decision and its policies when shadow policies exist.

The targets (tools and prompts with their schemas) come from the shared `TargetBook`: a list
answer filtered here teaches it, and the gate revalidates its policies against what was learned
(once, on the next call after a change). A policy that names `context.input` but reaches no
known tool is `pending` until one is learned: what it says of the arguments is validated then;
until then its other parts are validated and its calls decided on the arguments as sent. A
policy that fails validation against newly learned targets refuses the calls it reaches, naming
the problem, until the policies are fixed (a reload, or the API).

The policies are the config file's (`files`, read at start-up and by a reload) and those added
while the gateway runs (`Added`: the management API's, proxy.policy_store), whose `version` the
gate compares on each call it could decide: when it moved, the gate takes the new set and
rebuilds its compiled policies once, as when the book learned something, and its `version`
(the digest in every audit record) moves with it. A set that no longer validates then refuses
the calls it governs, as above; the API validates a change before it stores it (`admits`). A
gate without a policy (no `[policy] files`, none added yet) governs no endpoint, learns
nothing, and costs a call one method call.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Protocol

from policies.cedar.book import TargetBook
from policies.cedar.decide import Call, Caller, Decision, Policies
from policies.cedar.listing import Lister, names_input
from policies.cedar.load import Mode, Policy, PolicyError, reachable, unique, validate
from policies.cedar.schema import Catalog
from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.errors import HiddenTool, PolicyBlocked, PolicyDenied, ToolResultDenial
from proxy.jsonrpc import McpMessage

log = logging.getLogger("tollhouse.policy")

# method -> (Cedar kind, the params field naming the target, its noun in an answer)
_CALLS = {"tools/call": ("Tool", "name", "tool"), "prompts/get": ("Prompt", "name", "prompt"),
          "resources/read": ("Resource", "uri", "resource")}
_LISTS = {"tools/list": ("tools", "name", "tools/call"),
          "prompts/list": ("prompts", "name", "prompts/get")}
_TRUE: dict[str, Any] = {"Value": True}
CLIENT_CLAIMS = ("client_id", "azp")  # where a token names its OAuth client


def version_of(policies: Sequence[Policy]) -> str:
    """The policies' version: a digest of their ids, modes and texts, the same on every
    replica that loaded the same policies."""
    digest = hashlib.sha256()
    for policy in sorted(policies, key=lambda p: p.id):
        digest.update(f"{policy.id}\0{policy.mode}\0{policy.text}\0".encode())
    return digest.hexdigest()[:12]


def _strip_input(est: dict[str, Any]) -> dict[str, Any]:
    """A policy with every condition that reads the arguments made `true`: what can be
    validated of a policy whose tools are not known yet."""
    return {**est, "conditions": [
        {"kind": c["kind"], "body": _TRUE if names_input(c["body"]) else c["body"]}
        for c in est.get("conditions", [])]}


def settle(policies: Sequence[Policy], catalog: Catalog) -> tuple[str, ...]:
    """Validate `policies` against `catalog`; raise PolicyError naming the first fault.
    Returns the ids of the pending ones: those that read the arguments but reach no known
    tool or prompt, validated without what they say of the arguments."""
    known = [t for t in catalog.targets.values() if t.kind in ("Tool", "Prompt")]
    pending = [p for p in policies
               if names_input(p.est.get("conditions", [])) and not reachable(p.est, known)]
    ready = [p for p in policies if p not in pending]
    validate([*ready, *(replace(p, est=_strip_input(p.est)) for p in pending)], catalog)
    return tuple(p.id for p in pending)


def governed(policies: Iterable[Policy]) -> frozenset[str] | None:
    """The endpoints the policies' resource scopes can reach; None: every endpoint."""
    named: set[str] = set()
    for policy in policies:
        resource = policy.est.get("resource") or {"op": "All"}
        entity = resource.get("entity") or (resource.get("in") or {}).get("entity")
        if resource.get("op") == "All" or not isinstance(entity, dict):
            return None
        uid = str(entity.get("id", ""))
        named.add(uid if str(entity.get("type", "")).endswith("::Endpoint")
                  else uid.partition("/")[0])
    return frozenset(named)


class Added(Protocol):
    """Policies added while the gateway runs (the management API's): `policies` is read
    again whenever `version` moved."""

    @property
    def version(self) -> int: ...

    @property
    def policies(self) -> Sequence[Policy]: ...


class _Done:
    """An awaitable already finished (it yields nothing and is None)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())  # type: ignore[return-value]  # an iterator is all `await` needs


DONE = _Done()


class Gate:
    """The chain's Cedar policy. `zone_of(peer ip)` is the caller's network zone;
    `attributes_of(principal)` the person's attributes (None: not known here); `added` the
    policies added at run time (`mode` "shadow": they are shadow too)."""

    name: ClassVar[str] = "cedar"
    order: ClassVar[int] = 150

    def __init__(self, policies: Sequence[Policy], book: TargetBook, *,
                 claims: Sequence[str] = (), attributes: Sequence[str] = (),
                 zone_of: Callable[[str | None], str] = lambda ip: "",
                 attributes_of: Callable[[Principal], Awaitable[Mapping[str, Any]]]
                 | None = None, added: Added | None = None, mode: Mode = "enforce") -> None:
        self.files = tuple(policies)  # the config file's
        self._added = added
        self._added_seen = 0
        self._mode = mode
        self._book = book
        self._claims = tuple(claims)
        self._attribute_names = tuple(attributes)
        self._zone_of = zone_of
        self._attributes_of = attributes_of
        self._problem: str | None = None  # a validation against learned targets that failed
        self.pending: tuple[str, ...] = ()
        self._gather()
        try:
            self._compiled, self._lister = self._compile()  # raises PolicyError at load
        except PolicyError as exc:
            if len(self.policies) == len(self.files):
                raise
            # the file's own faults stop a start-up or a reload; the added ones' refuse what
            # they govern, until they are fixed through the API
            self._compiled, self._lister = self._compile(self.files)
            self._failed(exc)

    @classmethod
    def wanted(cls, policies: Sequence[Policy]) -> bool:
        return bool(policies)

    def _gather(self) -> None:
        """The policies as they are now: the file's, then those added."""
        added: tuple[Policy, ...] = ()
        if self._added is not None:
            self._added_seen = self._added.version
            added = tuple(self._added.policies)
            if self._mode == "shadow":
                added = tuple(replace(p, mode="shadow") for p in added)
        self.policies = (*self.files, *added)
        self.version = version_of(self.policies)
        self._governed = governed(self.policies)

    def _catalog(self) -> Catalog:
        return Catalog(self._book.targets(), self._claims, self._attribute_names)

    def _compile(self, policies: Sequence[Policy] | None = None) -> tuple[Policies, Lister]:
        chosen = self.policies if policies is None else policies
        catalog = self._catalog()
        unique(chosen)
        self.pending = settle(chosen, catalog)
        self._seen = self._book.version
        compiled = Policies(chosen, catalog, self._claims)
        return compiled, Lister(compiled)

    def _current(self) -> tuple[Policies, Lister]:
        """The compiled policies, rebuilt once after the book learned something or the added
        policies changed."""
        added = self._added
        moved = added is not None and added.version != self._added_seen
        if moved or self._book.version != self._seen:
            if moved:
                self._gather()
            try:
                self._compiled, self._lister = self._compile()
                self._problem = None
            except PolicyError as exc:
                self._seen = self._book.version
                self._failed(exc)
        return self._compiled, self._lister

    def _failed(self, exc: PolicyError) -> None:
        self._problem = str(exc)
        log.error("policies no longer validate (against the tools as now listed, or as "
                  "changed through the API); the calls they govern are refused until they "
                  "are fixed: %s", exc)

    def governs(self, endpoint: str) -> bool:
        added = self._added
        if added is not None and added.version != self._added_seen:
            self._current()  # a change through the API: what is governed may have moved
        return self._governed is None or endpoint in self._governed

    @property
    def active(self) -> bool:
        """Whether any policy is loaded, the file's or the API's as of now: a gate with none
        stays out of the chain and costs a call nothing (proxy.compiled, Serving)."""
        self.refresh()
        return bool(self.policies)

    def refresh(self) -> None:
        """Take the latest change of the added policies now (a call takes it by itself): for
        a reader of `policies` and `version` outside a call (the API, the console)."""
        self._current()

    def admits(self, added: Sequence[Policy]) -> None:
        """Raise PolicyError (one line, naming the policy and the problem) unless the file's
        policies with `added` (the API's, as a change would leave them) validate against the
        targets known now, as `_compile` validates them."""
        policies = (*self.files, *added)
        unique(policies)
        settle(policies, self._catalog())

    def check(self, call: McpMessage, ctx: CallContext) -> Awaitable[None]:
        """A call this gate decides nothing of (another method, a virtual endpoint's own
        view, an endpoint no policy names: most calls) is answered with `DONE`, so the chain
        awaits no coroutine for it; the others go to `_decide`."""
        if call.task_tool is not None:  # a task's request: decided by its tool
            if ctx.virtual or not self.governs(ctx.endpoint):
                return DONE
            return self._decide_task(call.task_tool, ctx)
        found = _CALLS.get(call.method or "")
        if found is None or ctx.virtual or not self.governs(ctx.endpoint):
            return DONE
        return self._decide(call, ctx, found)

    async def _decide_task(self, tool: str, ctx: CallContext) -> None:
        """A tasks/get, tasks/result or tasks/cancel of a task running `tool`: allowed while
        some call of the tool could be permitted to this caller (its arguments were decided
        when the task was created, and are not kept); otherwise answered as the tool is when
        no call of it could be, an unknown tool."""
        _, lister = self._current()
        caller = await self._caller(ctx)
        if self._problem is None and lister.could_permit(
                caller, "tools/call", ctx.endpoint, tool, zone=self._zone_of(ctx.peer_ip),
                era=ctx.era):
            return
        raise HiddenTool("cedar: tool hidden: no policy could permit a call of it "
                         "(a request of one of its tasks)", tool)

    async def _decide(self, call: McpMessage, ctx: CallContext,
                      found: tuple[str, str, str]) -> None:
        params = call.params or {}
        name = params.get(found[1])
        if not isinstance(name, str):
            return  # malformed: the upstream answers it
        compiled, lister = self._current()
        caller = await self._caller(ctx)
        arguments = params.get("arguments")
        request = Call(call.method or "", ctx.endpoint, name,
                       arguments if isinstance(arguments, Mapping) else {},
                       zone=self._zone_of(ctx.peer_ip), era=ctx.era)
        decision = compiled.decide(caller, request)
        if self._problem is not None:
            decision = Decision(False, (), "policy evaluation failed", (self._problem,))
        outcome = self._outcome(decision)
        ctx.policy = outcome
        if decision.allowed:
            return
        kind, _, noun = found
        if not decision.errors and not lister.could_permit(
                caller, request.method, ctx.endpoint, name, zone=request.zone, era=ctx.era):
            hidden = HiddenTool(f"cedar: {noun} hidden: no policy could permit a call of it",
                                name)
            if noun != "tool":
                hidden.detail = (f"Unknown prompt: {name}" if noun == "prompt"
                                 else f"Resource not found: {name}")
            raise _with(hidden, outcome)
        why = _audit_reason(decision)
        if kind == "Tool":
            raise _with(ToolResultDenial(why, decision.reason, "gateway.policy.denied"), outcome)
        raise _with(PolicyBlocked(why, decision.reason), outcome)

    def rewriter(self, call: McpMessage, ctx: CallContext
                 ) -> Callable[[dict[str, Any]], bool] | None:
        """For a tools/list or prompts/list: learn the targets, then hide what no call of
        could be permitted (on a governed endpoint). None for anything else."""
        listing = _LISTS.get(call.method or "")
        if listing is None or ctx.virtual:  # a virtual endpoint's members decide their own
            return None
        endpoint, governs = ctx.endpoint, self.governs(ctx.endpoint)
        if not self.policies:
            return None  # no policy yet: nothing to hide, nothing to validate
        key, field, method = listing
        first = not (call.params or {}).get("cursor")

        principal = ctx.principal
        zone, era = self._zone_of(ctx.peer_ip), ctx.era

        def rewrite(result: dict[str, Any]) -> bool:
            self._book.learn(call.method or "", endpoint, result, first)
            items = result.get(key)
            if not governs or not isinstance(items, list):
                return False
            _, lister = self._current()
            who = self._caller_now(principal)
            kept = [i for i in items if isinstance(i, dict) and isinstance(i.get(field), str)
                    and lister.could_permit(who, method, endpoint, i[field], zone=zone, era=era)]
            changed = len(kept) != len(items)
            if changed:
                result[key] = kept
            if result.get("cacheScope") == "public":  # filtered per caller
                result["cacheScope"] = "private"
                return True
            return changed

        return rewrite

    def hides(self, listing: McpMessage, ctx: CallContext) -> bool:
        return listing.method in _LISTS and not ctx.virtual and self.governs(ctx.endpoint)

    def listable(self, method: str, ctx: CallContext) -> Callable[[str], bool] | None:
        """Whether a name a `method` list (tools/list, prompts/list) gives would be listed for
        `ctx`'s caller, decided as the rewriter decides it but learning nothing: what a server
        card shows (proxy.cards). None where this gate hides nothing."""
        listing = _LISTS.get(method)
        if listing is None or ctx.virtual or not self.policies or not self.governs(ctx.endpoint):
            return None
        _, lister = self._current()
        who, endpoint, call = self._caller_now(ctx.principal), ctx.endpoint, listing[2]
        zone, era = self._zone_of(ctx.peer_ip), ctx.era
        return lambda name: lister.could_permit(who, call, endpoint, name, zone=zone, era=era)

    async def _caller(self, ctx: CallContext) -> Caller:
        who = self._caller_now(ctx.principal)
        if self._attributes_of is None or not self._attribute_names:
            return who
        attributes = await self._attributes_of(ctx.principal)
        return replace(who, attributes=dict(attributes))

    def _caller_now(self, principal: Principal) -> Caller:
        claims = dict(principal.claims)
        client = next((claims[c] for c in CLIENT_CLAIMS if c in claims), "")
        kept = {k: v for k, v in claims.items() if k in self._claims}
        if principal.kind == "api_key" and principal.api_key_id is not None:
            return Caller.key(principal.api_key_id, groups=principal.groups, claims=kept,
                              client=client)
        return Caller.person(principal.issuer, principal.subject, groups=principal.groups,
                             claims=kept, client=client, actor=principal.actor)

    def _outcome(self, decision: Decision) -> dict[str, Any]:
        outcome: dict[str, Any] = {"version": self.version,
                                   "decision": "allow" if decision.allowed else "deny",
                                   "policies": list(decision.policies)}
        if decision.errors:
            outcome["errors"] = len(decision.errors)
        if decision.shadow is not None:
            outcome["shadow"] = "allow" if decision.shadow.allowed else "deny"
            outcome["shadow_policies"] = list(decision.shadow.policies)
            if decision.shadow.errors:
                outcome["shadow_errors"] = len(decision.shadow.errors)
        return outcome


def _audit_reason(decision: Decision) -> str:
    """The audit's denied_reason: the deciding policies or the errors' kind, never a value
    (Cedar's error text may quote an argument)."""
    if decision.errors:
        return "cedar: evaluation error (fail closed): " + "; ".join(
            _error_kind(e) for e in decision.errors)[:300]
    if decision.policies:
        return f"cedar: forbidden by {', '.join(decision.policies)}"[:300]
    return "cedar: no policy permits this call"


def _error_kind(error: str) -> str:
    """An evaluation error's first clause, cut before anything that could quote a value."""
    head = error.split(":", 1)[0].strip()
    return head[:120] or "error"


def _with(exc: PolicyDenied, outcome: dict[str, Any]) -> PolicyDenied:
    exc.policy = outcome  # the audit's, not the wire's
    return exc

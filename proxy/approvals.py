"""Approvals at run time: a held call waits for a person's decision, the decisions themselves
(the API and the console), the audit records of both, and the approvals webhook.

The chain's policy (policies.approvals, order 450) raises `ApprovalRequired` for a call a rule
holds; the spine hands it here (`Approvals.hold`) with the call's own continuation (`Held`).
The call waits up to the rule's `wait_s` for a decision: on an SSE stream when the client
accepts one (it opens at once, the edge's heartbeats keep it alive, and a client that sent a
progress token gets a `notifications/progress` saying the call awaits approval), else as a
long JSON request. Approved: the chain runs again (the policy then uses the grant up: single
use, and void if the arguments, the caller or the policy version changed; `ctx.recheck` tells
the rate limits the call counted already) and the call goes on as usual. Denied: a tool result `gateway.approval.denied` naming the approver and their
comment, never an argument's value. Not decided in time: the `gateway.approval.pending`
result with the approval's id and URL (`ApprovalRequired`); the same call retried after the
approval runs once.

Audit: the call's record has `policy.approval` (id, rule, decision, approver, wait_ms); each
decision is a record of its own (`approvals/approve`, `approvals/deny`: who, the comment in
`note`), and each expiry one (`approvals/expire`, once: the store marks it once). Decisions
reach a waiting call on any replica through the store (proxy.state.approvals).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from proxy.audit import AuditRecord, AuditSink
from proxy.auth.principal import Principal
from proxy.errors import ApprovalRequired, Cancelled, ToolResultDenial, sse_event
from proxy.metering_backends import Webhook
from proxy.state.approvals import Approval, ApprovalStore
from proxy.state.inflight import CallHandle, InFlightRegistry, call_key

if TYPE_CHECKING:
    from proxy.chain import CallContext, Chain
    from proxy.config.approvals import ApprovalsWebhookConfig
    from proxy.jsonrpc import McpMessage
    from proxy.mcp.call import Calls
    from proxy.mcp.exchange import EdgeResponse, Exchange
    from proxy.mcp.forwarding import Routed
    from proxy.state import Session

log = logging.getLogger("tollhouse.approvals")

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
               "X-Accel-Buffering": "no"}
SWEEP_S = 15.0  # how often expired approvals are looked for (and audited once)
# "self": the id of the gateway's own elicitation/create on a held call's stream (2025-11-25),
# and the prefix of the requestState of its input_required answer (2026-07-28), each followed
# by the approval's id; INPUT_KEY names the input request in that answer
ASK_ID = "tollhouse-approval:"
INPUT_KEY = "tollhouse/approval"
CLIENT_CAPS = "io.modelcontextprotocol/clientCapabilities"  # proxy.mcp.eras's
COMMENT_MAX = 500


class ApprovalDenied(ToolResultDenial):
    """A person refused the call: `gateway.approval.denied`, naming them and their comment."""

    def __init__(self, approval: Approval) -> None:
        who, comment = approval.decided_by, approval.comment
        super().__init__(f"approval denied by {who}: {comment}",
                         f"A person refused this call ({who})" + (f": {comment}" if comment
                                                                  else "."),
                         "gateway.approval.denied")
        self.details = {"approval_id": approval.id, "rule": approval.rule}


@dataclass(frozen=True, slots=True)
class Approver:
    """Who decides: a person's subject and groups (a console session, or a bearer credential
    the MCP edge accepts)."""

    subject: str
    groups: frozenset[str] = frozenset()
    name: str = ""
    issuer: str = ""

    @property
    def key(self) -> str:
        """As a principal's (`Principal.key`): "self" is the caller by it."""
        return f"{self.issuer}|{self.subject}"


def may_decide(approval: Approval, who: Approver) -> bool:
    """Whether `who` is named by the approval's `approvers`."""
    for approver in approval.approvers:
        if approver == "self" and who.key == approval.caller:
            return True
        kind, _, value = approver.partition(":")
        if (kind == "user" and value == who.subject) or (kind == "group"
                                                         and value in who.groups):
            return True
    return False


@dataclass(slots=True)
class Held:
    """A held call and how it goes on once approved (`proceed`: the chain again, then the
    call, as the spine would have run it)."""

    msg: McpMessage
    ctx: CallContext
    exchange: Exchange
    headers: Mapping[str, str]
    # given the wait in ms, and the message to forward when not `msg` (a 2026-07-28 retry
    # with the gateway's own input response taken out)
    proceed: Callable[[int, McpMessage | None], Awaitable[EdgeResponse]]
    session_id: str | None = None
    capabilities: Mapping[str, Any] | None = None  # the client's (its session's, or the
    # request's envelope in 2026-07-28): whether a "self" approval can be asked of it
    # where the wait is registered under the call's key, so the client's
    # notifications/cancelled ends it (as it ends a call in flight)
    inflight: InFlightRegistry | None = None
    key: str = ""

    @classmethod
    def of(cls, calls: Calls, routed: Routed, headers: Mapping[str, str], msg: McpMessage,
           session: Session | None, ctx: CallContext, exchange: Exchange, chain: Chain
           ) -> Held:
        """The spine's own continuation of `msg` past the chain (`Calls.checked`)."""

        async def proceed(wait_ms: int, sent: McpMessage | None = None) -> EdgeResponse:
            ctx.recheck = True  # the rate limits counted this call once already
            checked = await routed.forwarding.check(routed.route, chain, sent or msg, ctx)
            if checked.approval is not None:  # the grant this call used up
                checked.approval["wait_ms"] = wait_ms
            exchange.decided(checked)
            return await calls.run(routed, headers, checked.message or sent or msg, session,
                                   checked, exchange, chain)

        caps = session.capabilities if session is not None else None
        if ctx.era == "modern":
            meta = (msg.params or {}).get("_meta")
            caps = meta.get(CLIENT_CAPS) if isinstance(meta, dict) else None
        return cls(msg, ctx, exchange, headers, proceed,
                   session.id if session is not None else None,
                   caps if isinstance(caps, Mapping) else None, calls.inflight,
                   call_key(routed.route.name, ctx.principal.key,
                            session.id if session is not None else "", msg.id))


def public(approval: Approval, *, arguments: bool = True) -> dict[str, Any]:
    """An approval as the API and the console show it."""
    shown: dict[str, Any] = {
        "id": approval.id, "rule": approval.rule, "status": approval.status,
        "caller": approval.subject, "endpoint": approval.endpoint, "tool": approval.tool,
        "arguments_digest": approval.digest, "approvers": list(approval.approvers),
        "created_at": approval.created_at, "expires_at": approval.expires_at,
        "decided_by": approval.decided_by or None, "decided_at": approval.decided_at,
        "comment": approval.comment or None}
    if arguments:
        shown["arguments"] = approval.arguments
    return shown


class Approvals:
    """The run-time side of approvals, one per process. `make_response(status, headers,
    body=..., stream=...)` builds the spine's `EdgeResponse` (kept out of the imports: the
    spine imports this module)."""

    def __init__(self, store: ApprovalStore, audit: AuditSink, *, public_url: str,
                 make_response: Callable[..., EdgeResponse],
                 webhook: ApprovalsWebhookConfig | None = None,
                 http: httpx.AsyncClient | None = None,
                 spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None) -> None:
        self.store = store
        self._audit = audit
        self._base = public_url.rstrip("/")
        self._response = make_response
        self._spawn = spawn or _spawn
        self._hook = None
        if webhook is not None and webhook.url and http is not None:
            self._hook = (Webhook(webhook.url, webhook.secret, http, webhook.timeout_ms / 1000),
                          webhook.url, http, webhook.timeout_ms / 1000)
        self._sweeper: asyncio.Task[None] | None = None

    def link(self, approval_id: str) -> str:
        """The console page of one approval (what a person opens, signed in as themselves)."""
        return f"{self._base}/console/approvals/{approval_id}"

    # -- a held call -------------------------------------------------------------------------

    async def hold(self, held: ApprovalRequired, call: Held) -> EdgeResponse:
        approval = held.approval
        if held.new:
            self._spawn(self._announce(approval))
        asks = "self" in approval.approvers and forms(call.capabilities)
        if asks and call.ctx.era == "modern":  # input_required, then the retry's answer
            return await self._ask_modern(held, call)
        accept = call.headers.get("accept", "")
        if "text/event-stream" not in accept:
            return await self.settle(held, call)
        headers = dict(SSE_HEADERS)
        if call.session_id is not None:
            headers["Mcp-Session-Id"] = call.session_id
        return self._response(200, headers, stream=HeldStream(self, held, call, ask=asks))

    # -- "self": the caller confirms -----------------------------------------------------------

    async def _ask_modern(self, held: ApprovalRequired, call: Held) -> EdgeResponse:
        """2026-07-28: an `input_required` answer asking the caller to confirm; its retry
        (the same call, with `inputResponses` and `requestState`) decides the approval as
        the caller, then runs or is refused."""
        approval, params = held.approval, call.msg.params or {}
        responses = params.get("inputResponses")
        answer = responses.get(INPUT_KEY) if isinstance(responses, dict) else None
        if params.get("requestState") == ASK_ID + approval.id and isinstance(answer, dict):
            await self.confirmed(approval.id, answer, call.ctx.principal)
            return await self.settle(held, call, sent=without_answer(call.msg))
        result = {"resultType": "input_required",
                  "inputRequests": {INPUT_KEY: {"method": "elicitation/create",
                                                "params": confirm_form(approval)}},
                  "requestState": ASK_ID + approval.id}
        call.exchange.noted(f"approval {approval.id} ({approval.rule}): asked the caller "
                            "(input_required)")
        body = orjson.dumps({"jsonrpc": "2.0", "id": call.msg.id, "result": result})
        return await call.exchange.answer(self._response(
            200, {"Content-Type": "application/json"}, body=body), call.msg.id)

    async def answered(self, msg: McpMessage, principal: Principal) -> bool:
        """A 2025-11-25 client's answer to the gateway's own elicitation/create (its id
        `ASK_ID<approval id>`): decided as that caller (a "self" approval, theirs only).
        False: not such an answer (the spine sends it on)."""
        if not (isinstance(msg.id, str) and msg.id.startswith(ASK_ID)):
            return False
        try:
            result = orjson.loads(msg.body).get("result")
        except (orjson.JSONDecodeError, AttributeError):
            result = None
        if isinstance(result, dict):
            await self.confirmed(msg.id[len(ASK_ID):], result, principal)
        return True  # an error answer decides nothing: the call waits out its wait_s

    async def confirmed(self, approval_id: str, result: Mapping[str, Any],
                        principal: Principal) -> None:
        """The caller's answer to the confirmation form: accept approves, anything else
        (decline, cancel) denies; refused (and logged) unless the approval is theirs."""
        yes = result.get("action") == "accept"
        who = Approver(principal.subject, principal.groups, principal.display_name,
                       issuer=principal.issuer)
        kind, _ = await self.decide(approval_id, yes, who, "confirmed by the caller" if yes
                                    else "declined by the caller")
        if kind != "decided":
            log.info("approvals: a confirmation of %s was not taken (%s)", approval_id[:64],
                     kind)

    async def settle(self, held: ApprovalRequired, call: Held, sent: McpMessage | None = None
                     ) -> EdgeResponse:
        """Wait for the decision, then the call's answer: run (as `sent` when given),
        refused, or still pending."""
        approval = held.approval
        started = time.monotonic()
        handle = CallHandle()  # the client's cancel ends the wait (the approval stays)
        if call.inflight is not None:
            call.inflight.add(call.key, handle)
        try:
            decided = await self.store.wait(approval.id, approval.wait_s)
        except asyncio.CancelledError:
            if handle.absorb() and handle.reason is not None:  # cancelled: -32800
                return await call.exchange.refuse(Cancelled(handle.reason), call.msg.id)
            call.exchange.disconnected()  # the client went away while it waited
            raise
        finally:
            if call.inflight is not None:
                call.inflight.discard(call.key, handle)
        wait_ms = round((time.monotonic() - started) * 1000)
        if decided is not None and decided.status == "approved":
            return await call.proceed(wait_ms, sent)
        if decided is not None and decided.status == "denied":
            refusal: ToolResultDenial = ApprovalDenied(decided)
        else:
            refusal = held
        found = decided or approval
        refusal.policy = {**(call.ctx.policy or {}), "approval": {
            "id": found.id, "rule": found.rule,
            "decision": found.status if decided is not None else "withdrawn",
            "approver": found.decided_by or None, "wait_ms": wait_ms}}
        return await call.exchange.refuse(refusal, call.msg.id)

    # -- decisions ---------------------------------------------------------------------------

    async def decide(self, approval_id: str, approve: bool, who: Approver, comment: str
                     ) -> tuple[str, Approval | None]:
        """("decided", it), ("missing", None), ("forbidden", it), ("conflict", it) or
        ("expired", it). Each decision and the first sight of an expiry are audited."""
        comment = " ".join(comment.split())[:COMMENT_MAX]
        found = await self.store.get(approval_id)
        if found is None:
            return "missing", None
        if not may_decide(found, who):
            return "forbidden", found
        kind, decided, marked = await self.store.decide(approval_id, approve, who.subject,
                                                        comment)
        if kind == "decided" and decided is not None:
            self._record(decided, "approve" if approve else "deny", who.subject, comment)
        elif kind == "expired" and marked and decided is not None:
            self._record(decided, "expire", decided.subject, "")
        return kind, decided

    async def drop_for(self, principal: Principal) -> int:
        """A person deprovisioned (proxy.people, proxy.scim): their pending approvals are
        forgotten (each audited), and a call of theirs waiting on one is answered pending."""
        dropped = await self.store.drop(principal.key)
        for approval in dropped:
            self._record(approval, "drop", "tollhouse", "caller deprovisioned")
        return len(dropped)

    async def sweep(self) -> int:
        """Mark the approvals past their time expired (each once, whichever replica) and
        audit each."""
        expired = await self.store.expire_due()
        for approval in expired:
            self._record(approval, "expire", approval.subject, "")
        return len(expired)

    def _record(self, approval: Approval, action: str, who: str, comment: str) -> None:
        self._audit.emit(AuditRecord(
            endpoint=approval.endpoint, method=f"approvals/{action}", principal=who,
            tool=approval.tool, note=comment or None,
            policy={"approval": {"id": approval.id, "rule": approval.rule,
                                 "decision": approval.status, "caller": approval.subject}}))

    # -- the webhook and the sweeper ---------------------------------------------------------

    async def _announce(self, approval: Approval) -> None:
        if self._hook is None:
            return
        signer, url, http, timeout_s = self._hook
        body = orjson.dumps({"type": "approval", **public(approval, arguments=False),
                             "url": self.link(approval.id)})
        try:
            response = await http.post(url, content=body, timeout=timeout_s, headers={
                "content-type": "application/json", "x-tollhouse-signature": signer.sign(body)})
            if not 200 <= response.status_code < 300:
                log.warning("approvals webhook answered HTTP %s", response.status_code)
        except httpx.HTTPError as exc:
            log.warning("approvals webhook failed: %s", type(exc).__name__)

    def start(self) -> None:
        self.store.start()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 - a store down: the next sweep tries again
                log.warning("approvals: sweep failed: %s", type(exc).__name__)

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)


class HeldStream:
    """A held call's SSE answer: a progress notice (when asked for), then, once decided, the
    call's answer (a relayed stream's events, or one event with a whole answer)."""

    def __init__(self, approvals: Approvals, held: ApprovalRequired, call: Held, *,
                 ask: bool = False) -> None:
        self._approvals = approvals
        self._held = held
        self._call = call
        self._ask = ask  # "self", and a client that takes a form: elicitation/create first
        self._inner: Any = None
        self._events = self._run()

    @property
    def mid_event(self) -> bool:
        return bool(getattr(self._inner, "mid_event", False))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events

    async def _run(self) -> AsyncIterator[bytes]:
        token = ((self._call.msg.params or {}).get("_meta") or {}).get("progressToken")
        if isinstance(token, (str, int)) and not isinstance(token, bool):
            approval = self._held.approval
            yield sse_event(orjson.dumps({
                "jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": token, "progress": 0,
                           "message": f"awaiting approval {approval.id} ({approval.rule}): "
                                      f"{self._approvals.link(approval.id)}"}}))
        if self._ask:  # its answer comes as a POST (Approvals.answered), on any replica
            approval = self._held.approval
            yield sse_event(orjson.dumps({
                "jsonrpc": "2.0", "id": ASK_ID + approval.id, "method": "elicitation/create",
                "params": confirm_form(approval)}))
        answer = await self._approvals.settle(self._held, self._call)
        if answer.stream is None:
            yield sse_event(answer.body)
            return
        self._inner = answer.stream
        async for chunk in answer.stream:
            yield chunk

    async def aclose(self) -> None:
        await self._events.aclose()  # type: ignore[attr-defined]
        inner = self._inner
        if inner is not None and hasattr(inner, "aclose"):
            await inner.aclose()


def forms(capabilities: Mapping[str, Any] | None) -> bool:
    """Whether a client declared form-mode elicitation (`{}` is form mode too)."""
    declared = capabilities.get("elicitation") if capabilities is not None else None
    return isinstance(declared, dict) and ("form" in declared or not declared)


def confirm_form(approval: Approval) -> dict[str, Any]:
    """The form a "self" approval asks the caller: the tool and the arguments' digest
    (never their values: the client shows what it sent)."""
    return {"mode": "form",
            "message": f"Tollhouse: confirm the call of {approval.tool} on "
                       f"{approval.endpoint} (rule {approval.rule}; arguments sha256 "
                       f"{approval.digest}). Accept runs it, decline refuses it.",
            "requestedSchema": {"type": "object", "properties": {}}}


def without_answer(msg: McpMessage) -> McpMessage:
    """A 2026-07-28 retry as the upstream takes it: the gateway's requestState and its
    input response out (any other input response kept)."""
    params = {k: v for k, v in (msg.params or {}).items() if k != "requestState"}
    responses = params.pop("inputResponses", None)
    if isinstance(responses, dict) and (kept := {k: v for k, v in responses.items()
                                                 if k != INPUT_KEY}):
        params["inputResponses"] = kept
    body = orjson.dumps({"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                         "params": params})
    return dataclasses.replace(msg, params=params, body=body)


def _spawn(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()

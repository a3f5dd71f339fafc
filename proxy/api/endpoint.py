"""The one wrapper every /api/v1 handler is served through: it fetches the `Api`,
authenticates the caller, decides who may call (administrators, auditors on the reads the route
table lets them make, and never an auditor's change), audits every change and every read of
audit records, refuses NULs and maps a busy or unreachable database to its 503. A handler is a
module-level `async def handler(who: Caller, api: Api, **path) -> Response`; what it raises (a
`proxy.errors` class) the app's one error handler renders (proxy.web.routes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from quart import Response, request

from proxy.api.caller import READS_ONLY, Caller, authenticate
from proxy.api.context import Api
from proxy.audit.record import AuditRecord, AuditSink
from proxy.audit.summary import MANAGEMENT
from proxy.errors import GatewayError, Invalid, NotPermitted
from proxy.held import held
from proxy.web.routes import nul_in_body

Handler = Callable[..., Awaitable[Response]]
View = Handler  # what Quart serves: the same shape
READS = frozenset({"GET", "HEAD", "OPTIONS"})  # not changes: no Origin/Referer check
# every change through /api/v1 is audited once: this endpoint, `<METHOD> <path>` as the
# method, the caller's `issuer|subject` as principal (blank when unauthenticated), the HTTP
# status in `note` (a server's name never holds a slash, so no MCP endpoint is this one)
AUDIT_ENDPOINT = MANAGEMENT


@dataclass(frozen=True)
class Route:
    rule: str  # under /api/v1
    method: str
    handler: Handler
    admin: bool = True  # administrators only
    query: bool = False  # the route reads its query string (the others ignore theirs)
    # the handler names what it changed on the change's one record (given as `record`): a
    # pin decision is that record, not a second one
    names_change: bool = False
    auditor: bool = False  # an auditor may call it too (a read: an auditor changes nothing)
    # the route reads audit records: each call is an audit record of its own, as a change is
    # (who, and through `record`, given to the handler, which filter and how many records)
    reads_audit: bool = False
    # a person named by an approval's `approvers` may call it with the bearer JWT the MCP
    # edge accepts for them (proxy.api.approvals), not only with a browser session
    approver: bool = False

    @property
    def endpoint(self) -> str:
        return f"api_{self.handler.__name__}"


def view(route: Route) -> View:
    """The Quart view serving `route`."""

    async def endpoint(**path: Any) -> Response:
        # a busy or unreachable database is the app's one error handler's 503 (edge.routes)
        return await _serve(route, current(), path)

    endpoint.__name__ = route.endpoint
    return endpoint


def current() -> Api:
    """The serving app's `Api` (inside a request)."""
    api = held().api
    if api is None:
        raise RuntimeError("the management API is built when the app starts serving")
    return api


async def _serve(route: Route, api: Api, path: dict[str, Any]) -> Response:
    reads = request.method in READS
    if reads and not route.reads_audit:
        who: Caller = await authenticate(api, admin=route.admin, changes=False,
                                         auditor=route.auditor, approver=route.approver)
        await refuse_nul(path, route.query)
        return await route.handler(who, api, **path)

    async def audited_call(record: AuditRecord) -> Response:
        who = await authenticate(api, admin=False, changes=not reads,
                                 approver=route.approver)
        record.principal = f"{who.issuer}|{who.subject}"  # a refused person is named too
        if not reads and who.reads_only:
            raise NotPermitted(READS_ONLY)
        if route.admin and not who.admin and not (reads and route.auditor and who.auditor):
            raise NotPermitted("administrators only")
        await refuse_nul(path, route.query)
        if route.names_change or route.reads_audit:
            return await route.handler(who, api, record=record, **path)
        return await route.handler(who, api, **path)

    return await audited(api.audit, audited_call)


class Streamed(Response):
    """An answer streamed after its handler returns, whose body hands the request's audit
    record to the sink itself once it ends (an export: how many records it sent is known only
    then); `audited` leaves the record to it."""


async def audited(sink: AuditSink | None, change: Callable[[AuditRecord], Awaitable[Response]]
                  ) -> Response:
    """A change through /api/v1 (or a read of audit records), and its one audit record
    (`change` names the principal on it once known, and a handler may name what it changed or
    read), durable before the answer, as at the MCP edge; a `Streamed` answer's body writes
    it when it ends."""
    record = AuditRecord(endpoint=AUDIT_ENDPOINT,
                         method=f"{request.method} {request.path}"[:300])
    later = False
    try:
        response = await change(record)
    except GatewayError as exc:
        record.http_status = exc.wire_status
        if exc.wire_status in (401, 403, 429):
            record.status, record.denied_reason = "denied", f"api: HTTP {exc.wire_status}"
        else:
            record.status, record.error_message = "error", f"api: HTTP {exc.wire_status}"
        raise
    except BaseException:
        record.status, record.http_status, record.error_message = "error", 500, "api: HTTP 500"
        raise
    else:
        record.http_status = response.status_code
        later = isinstance(response, Streamed)
        return response
    finally:
        if record.note is None:  # a handler that named its change said what it did
            record.note = f"HTTP {record.http_status}"
        if sink is not None and not later:
            await sink.write(record)


async def refuse_nul(path: dict[str, Any], query: bool) -> None:
    """A NUL anywhere in what the route reads is a validation error (seed 004: 422): nothing
    this API stores or looks up may hold one (PostgreSQL's text cannot). A route that reads
    no query string ignores it, NULs and all."""
    problems = [{"loc": ["path", k], "msg": "holds a NUL character", "type": "value_error"}
                for k, v in path.items() if isinstance(v, str) and "\x00" in v]
    if query:
        problems += [{"loc": ["query", k], "msg": "holds a NUL character",
                      "type": "value_error"}
                     for k, v in request.args.items(multi=True) if "\x00" in k or "\x00" in v]
    if request.method in ("POST", "PUT", "PATCH") and nul_in_body(await request.get_data(),
                                                                  "application/json"):
        problems.append({"loc": ["body"], "msg": "holds a NUL character",
                         "type": "value_error"})
    if problems:
        raise Invalid(problems)

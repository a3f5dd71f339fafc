"""/api/v1/audit (filtered, newest first, paged by an opaque cursor: time, row id) and
/api/v1/usage (tools/call totals per principal, endpoint and tool).

A read of audit records (this page, one record, an export) is an audit record of its own, of
the management API's endpoint, named by `proxy.api.endpoint` with its reader: its method
`audit/read`, `audit/record` or `audit/export`, its note how many records were read and the
filter they were read with (`read_note`), so an auditor sees who read what."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from quart import Response, request

from proxy.api import query
from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.audit import AuditRecord
from proxy.audit.database import query as audit_query
from proxy.audit.database import usage as usage_query
from proxy.errors import Invalid
from proxy.storage import db

STATUSES = ("ok", "denied", "error", "cancelled")
DAY_S = 86400  # the usage period when `since` is not given: the last day
SETTLE_S = 2.0  # how long a query waits for this process's writer to commit what it holds
# what a read's record names of its query (the arguments the audit routes read)
READ_ARGS = ("status", "endpoint", "principal", "tool", "since", "until", "cursor", "limit",
             "format")
NOTE_MAX = 2000  # a read's note, its filter cut to this length


def read_args() -> dict[str, str]:
    """The request's query as the audit routes read it (each argument's first value)."""
    return {k: request.args[k] for k in READ_ARGS if k in request.args}


def read_note(count: int, shown: Mapping[str, str] | None = None, *, cut: bool = False) -> str:
    """A read of audit records as its own record's note: how many records it read, and the
    filter (`shown`, else `read_args()`), query-encoded so that no value's text can pass for
    another field; `cut`: the reader left before the end."""
    if shown is None:
        shown = read_args()
    text = f"{count} record{'' if count == 1 else 's'}{' (cut short)' if cut else ''}; " \
           f"filter: {urlencode(shown) or '(none)'}"
    return text[:NOTE_MAX]


def page(target: db.Target, *, status: str | None = None, endpoint: str | None = None,
         principal: str | None = None, tool: str | None = None, since: float | None = None,
         until: float | None = None, before: tuple[float, int] | None = None,
         limit: int = 50) -> list[dict[str, Any]]:
    return audit_query(target, status=status, endpoint=endpoint, principal=principal,
                       tool=tool, since=since, until=until, before=before, limit=limit,
                       with_id=True)


async def settled(api: Api) -> None:
    """Read your own writes: what this process accepted before the query is committed first
    (with the audit journal on, records otherwise gather for the commit window). Other
    replicas' records are read as their writers have committed them."""
    if api.audit is not None:
        # bounded: a writer retrying an unreachable database does not hold the query longer
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(api.audit.settled(), SETTLE_S)


async def audit(who: Caller, api: Api, record: AuditRecord) -> Response:
    args = request.args
    problems: query.Problems = []
    times = query.period(args, problems)
    limit = query.limit(args.get("limit"), problems)
    status = args.get("status")
    if status is not None and status not in STATUSES:
        problems.append({"loc": ["query", "status"],
                         "msg": "must be ok, denied, error or cancelled",
                         "type": "literal_error"})
    cursor = query.cursor(args.get("cursor"), problems)
    if problems:
        raise Invalid(problems)
    await settled(api)
    rows = await asyncio.to_thread(
        page, api.database, status=status, endpoint=args.get("endpoint"),
        since=times["since"], until=times["until"], principal=args.get("principal"),
        tool=args.get("tool"), before=cursor, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = query.encode_cursor(rows[-1]) if more and rows else None
    record.method, record.note = "audit/read", read_note(len(rows))
    return json_response({"items": rows, "next_cursor": next_cursor})


async def usage_totals(who: Caller, api: Api) -> Response:
    args = request.args
    problems: query.Problems = []
    times = query.period(args, problems)
    # the busiest `limit` rows (a page of the console's), or every one
    limit = query.limit(args["limit"], problems) if "limit" in args else None
    if problems:
        raise Invalid(problems)
    since = times["since"] if times["since"] is not None else time.time() - DAY_S
    rows = await api.aggregate(usage_query, since=since, until=times["until"],
                               endpoint=args.get("endpoint"), principal=args.get("principal"),
                               limit=limit)
    return json_response({"items": rows, "since": since, "until": times["until"]})

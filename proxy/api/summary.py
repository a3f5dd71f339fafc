"""/api/v1/usage/series and /api/v1/usage/summary (aggregates of the audit log for charts and
the console's overview: never raw rows), and /api/v1/audit/export (the filtered audit records
as CSV or JSON lines, streamed page by page along the same cursor as /api/v1/audit). An export
is an audit record of its own (`proxy.api.audit.read_note`), handed to the sink when its
stream ends, however it ends (the client gone: what was sent so far, "cut short")."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import orjson
from quart import Response, request

from proxy.api import query
from proxy.api.audit import STATUSES, page, read_args, read_note, settled
from proxy.api.bodies import json_response
from proxy.api.caller import Caller
from proxy.api.context import Api
from proxy.api.endpoint import Streamed
from proxy.audit import AuditRecord, AuditSink
from proxy.audit import summary as aggregates
from proxy.audit.commit import COLUMNS
from proxy.errors import Invalid, NotFound

HOUR_S = 3600

EXPORT_PAGE = 500
EXPORT_MAX = 100_000  # records in one export: narrow the filters for more
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}


def _bucket(value: str | None, problems: query.Problems) -> int:
    if value is None:
        return 60
    if re.fullmatch(r"[0-9]{1,6}", value) and 1 <= int(value) <= 86400:
        return int(value)
    problems.append({"loc": ["query", "bucket_s"], "msg": "must be a whole number of seconds "
                     "from 1 to 86400", "type": "value_error"})
    return 60


async def usage_series(who: Caller, api: Api) -> Response:
    args = request.args
    problems: query.Problems = []
    times = query.period(args, problems)
    bucket_s = _bucket(args.get("bucket_s"), problems)
    until = times["until"] if times["until"] is not None else time.time()
    since = times["since"] if times["since"] is not None else until - HOUR_S
    if (until - since) / bucket_s > aggregates.MAX_BUCKETS:
        problems.append({"loc": ["query", "bucket_s"], "msg": f"the period holds more than "
                         f"{aggregates.MAX_BUCKETS} buckets", "type": "value_error"})
    if problems:
        raise Invalid(problems)
    items = await api.aggregate(aggregates.series, since=since, until=until,
                            bucket_s=bucket_s, endpoint=args.get("endpoint"),
                            principal=args.get("principal"))
    return json_response({"items": items, "since": since, "until": until,
                          "bucket_s": bucket_s})


async def usage_summary(who: Caller, api: Api) -> Response:
    problems: query.Problems = []
    times = query.period(request.args, problems)
    if problems:
        raise Invalid(problems)
    since = times["since"] if times["since"] is not None else time.time() - HOUR_S
    body = await api.aggregate(aggregates.summary, since=since, until=times["until"])
    return json_response(body)


def _filters(problems: query.Problems) -> dict[str, Any]:
    args = request.args
    times = query.period(args, problems)
    status = args.get("status")
    if status is not None and status not in STATUSES:
        problems.append({"loc": ["query", "status"],
                         "msg": "must be ok, denied, error or cancelled",
                         "type": "literal_error"})
    return {"status": status, "endpoint": args.get("endpoint"),
            "principal": args.get("principal"), "tool": args.get("tool"), **times}


async def audit_export(who: Caller, api: Api, record: AuditRecord) -> Response:
    problems: query.Problems = []
    filters = _filters(problems)
    form = request.args.get("format", "csv")
    if form not in FORMATS:
        problems.append({"loc": ["query", "format"], "msg": "must be csv or jsonl",
                         "type": "literal_error"})
    if problems:
        raise Invalid(problems)
    await settled(api)
    record.method = "audit/export"
    body = CountedExport(_rows(api, filters, form), record, api.audit, read_args())
    response = Streamed(cast(Any, body), 200, {
        "Content-Type": FORMATS[form], "Cache-Control": "no-store",
        "Content-Disposition": f'attachment; filename="audit.{form}"'})
    response.timeout = None  # a large export streams for as long as it takes
    return response


class CountedExport:
    """An export's body: its chunks, and how many records they held; the export's audit record
    (its note: that count and the filter) goes to the sink once, when the body ends (read to
    the end, closed early as the client goes, or failed)."""

    def __init__(self, chunks: AsyncGenerator[tuple[bytes, int], None], record: AuditRecord,
                 sink: AuditSink | None, shown: dict[str, str]) -> None:
        self._chunks, self._record, self._sink = chunks, record, sink
        self._shown = shown  # the filter, read with the request
        self.sent = 0
        self._ended = False

    def __aiter__(self) -> CountedExport:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk, records = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._end(cut=False)
            raise
        except asyncio.CancelledError:
            self._end(cut=True)
            raise
        except BaseException:
            self._end(cut=True, failed=True)
            raise
        self.sent += records
        return chunk

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            self._end(cut=True)

    def _end(self, *, cut: bool, failed: bool = False) -> None:
        if self._ended:
            return
        self._ended = True
        self._record.note = read_note(self.sent, self._shown, cut=cut)
        if failed:  # a page could not be read: the reader got what came before
            self._record.status, self._record.error_message = "error", "api: export failed"
        elif cut:
            self._record.status, self._record.error_message = "cancelled", "api: export cut short"
        if self._sink is not None:
            self._sink.emit(self._record)


async def _rows(api: Api, filters: dict[str, Any], form: str
                ) -> AsyncGenerator[tuple[bytes, int], None]:
    """The export's chunks, each with the number of records it holds."""
    columns = ("id", *COLUMNS)
    if form == "csv":
        yield (",".join(columns) + "\r\n").encode(), 0
    before: tuple[float, int] | None = None
    sent = 0
    while sent < EXPORT_MAX:
        rows = await asyncio.to_thread(page, api.database, before=before,
                                       limit=min(EXPORT_PAGE, EXPORT_MAX - sent), **filters)
        if not rows:
            return
        if form == "jsonl":
            yield b"".join(orjson.dumps(r) + b"\n" for r in rows), len(rows)
        else:
            out = io.StringIO()
            writer = csv.writer(out)
            for r in rows:
                writer.writerow([_cell(r[c]) for c in columns])
            yield out.getvalue().encode(), len(rows)
        sent += len(rows)
        before = (rows[-1]["ts"], rows[-1]["id"])


def _cell(value: Any) -> Any:
    # a spreadsheet runs a cell that starts with = + - @ as a formula: not from an audit log
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


async def audit_record(who: Caller, api: Api, record: AuditRecord, record_id: str
                       ) -> Response:
    found = None
    if re.fullmatch(r"[0-9]{1,18}", record_id):
        await settled(api)
        found = await asyncio.to_thread(aggregates.record, api.database, int(record_id))
    record.method = "audit/record"
    record.note = read_note(0 if found is None else 1, {"id": record_id})
    if found is None:
        raise NotFound(f"audit record '{record_id}' not found")
    return json_response(found)

"""The request log: one line per MCP message the gateway answers or refuses (logger
`tollhouse.request`, level INFO), and the process's log format, text or JSON
(`observability.log_format`).

A line carries the JSON-RPC request id, the W3C trace id the request came with (empty when it
came with none), the endpoint, method, tool, audit status, HTTP status, error type and the
duration. Every value a caller or an upstream chose (id, method, tool, an upstream's error
code) is cut to MAX_VALUE and quoted unless plain. Never a header, a token, a session id (not even its hash), an argument or a
principal: what happened to whom is the audit log's, behind the management API.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.audit.record import AuditRecord
from proxy.chain import Rewrite
from proxy.jsonrpc import McpMessage

log = logging.getLogger("tollhouse.request")

MAX_VALUE = 128  # a caller-chosen value (request id, method, tool) is cut to this
_PLAIN = re.compile(r"^[A-Za-z0-9_./:@+-]*$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_NO_TRACE = "0" * 32


def trace_id(traceparent: object) -> str:
    """The trace id of a W3C `traceparent` value; empty when there is none or it is invalid."""
    if not isinstance(traceparent, str) or len(traceparent) != 55:
        return ""
    match = _TRACEPARENT.match(traceparent)
    if match is None or match.group(1) == _NO_TRACE:
        return ""
    return match.group(1)


class RequestLog:
    """The Observer that writes the line; nothing at all when INFO is off for its logger."""

    def __init__(self, log_format: str = "text") -> None:
        self.json = log_format == "json"

    def begin(self, record: AuditRecord) -> None:
        return None

    def parsed(self, record: AuditRecord, msg: McpMessage, headers: Mapping[str, str],
               peer: str | None) -> None:
        return None  # the spine has put the message's trace id on the record

    def results(self, msg: McpMessage, record: AuditRecord, rewrite: Rewrite | None
                ) -> Rewrite | None:
        return rewrite

    def end(self, record: AuditRecord) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        if self.json:
            log.info("mcp request", extra={"fields": {
                "request_id": _cut(record.request_id), "trace_id": record.trace_id,
                "endpoint": record.endpoint, "method": _cut(record.method),
                "tool": _cut(record.tool), "status": record.status,
                "http_status": record.http_status, "error_type": _cut(record.error_type),
                "duration_ms": round(record.duration_ms, 3)}})
            return
        # one f-string: the line is on every call's path (measured in bench/README.md)
        log.info(f"mcp request_id={_text(record.request_id)} trace_id={record.trace_id} "
                 f"endpoint={record.endpoint} method={_text(record.method)} "
                 f"tool={_text(record.tool)} status={record.status} "
                 f"http_status={record.http_status} error_type={_text(record.error_type)} "
                 f"duration_ms={record.duration_ms:.3f}")


    def refused(self, endpoint: str, http_method: str, status: int) -> None:
        """A refusal the MCP edge makes before any endpoint is known (an endpoint that does
        not exist, an HTTP method it does not serve): its line, with the path's name."""
        if not log.isEnabledFor(logging.INFO):
            return
        if self.json:
            log.info("mcp request", extra={"fields": {
                "request_id": "", "trace_id": "", "endpoint": _cut(endpoint),
                "method": _cut(http_method), "tool": "", "status": "error",
                "http_status": status, "error_type": str(status), "duration_ms": 0.0}})
            return
        log.info(f"mcp request_id= trace_id= endpoint={_text(endpoint)} "
                 f"method={_text(http_method)} tool= status=error http_status={status} "
                 f"error_type={status} duration_ms=0.000")


def _cut(value: str | None) -> str:
    if value is None:
        return ""
    return value if len(value) <= MAX_VALUE else value[:MAX_VALUE]


def _text(value: str | None) -> str:
    """A caller-chosen value of a text line: as it is when plain, else JSON-quoted (a newline
    or a quote cannot forge a line or a field), cut to MAX_VALUE either way."""
    if value is None:
        return ""
    if len(value) > MAX_VALUE:
        value = value[:MAX_VALUE]
    return value if _PLAIN.match(value) else orjson.dumps(value).decode()


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and a request line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        prefix = getattr(record, "worker", None)
        if prefix:
            out["worker"] = prefix
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def lean() -> None:
    """The request line is on every call's path: no caller lookup, no thread or process
    names, which no format here shows (the logging documentation's own optimisation)."""
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


def configure(level: str, prefix: str = "", log_format: str = "text") -> None:
    """Log lines to stderr, text or JSON; a worker of several puts `worker=N pid=P ` in front
    of each text line (a JSON line has it as "worker"). httpx's own INFO line per request (the
    metering webhook's, every usage event) is left out: the request log says what was called."""
    lean()
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    if log_format != "json":
        logging.basicConfig(level=level.upper(),
                            format=f"%(asctime)s %(levelname)s {prefix}%(name)s %(message)s")
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    if prefix:
        worker = prefix.strip()

        def tag(r: logging.LogRecord) -> bool:
            r.worker = worker
            return True

        handler.addFilter(tag)
    logging.basicConfig(level=level.upper(), handlers=[handler])

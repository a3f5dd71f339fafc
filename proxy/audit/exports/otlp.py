"""OTLP logs over HTTP (protobuf), through the OpenTelemetry SDK's own exporter
(opentelemetry-exporter-otlp-proto-http, the `tollhouse[otel]` extra the traces use): one
export request per batch, a log record per audit record, and the exporter's answer decides
whether the batch was taken. The exporter blocks (and retries a transient failure within its
timeout), so it runs on a thread of its own, never on the event loop.

A log record: `body` the payload as a map (nulls left out), `event_name` "tollhouse.audit",
the attribute `tollhouse.event_id`, the record's time, a severity from its status (INFO, WARN
for a refusal, ERROR for an error); the resource's `service.name` is "tollhouse".
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from proxy import __version__
from proxy.audit.exports.event import Event, SendFailed
from proxy.config.tables import ExportConfig

_SEVERITY = {"denied": (SeverityNumber.WARN, "WARN"), "error": (SeverityNumber.ERROR, "ERROR")}


class OtlpSender:
    """One OTLPLogExporter, called on its own thread."""

    def __init__(self, cfg: ExportConfig) -> None:
        self._exporter = OTLPLogExporter(endpoint=cfg.url, certificate_file=cfg.ca_file or None,
                                         headers=dict(cfg.headers), timeout=cfg.timeout_s)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-otlp")
        self._resource = Resource.create({"service.name": "tollhouse",
                                          "service.version": __version__})
        self._scope = InstrumentationScope("tollhouse.audit", __version__)

    def record(self, event: Event) -> ReadableLogRecord:
        status = str(event.record.get("status") or "")
        number, text = _SEVERITY.get(status, (SeverityNumber.INFO, "INFO"))
        ns = int(event.ts * 1_000_000_000)
        return ReadableLogRecord(
            LogRecord(timestamp=ns, observed_timestamp=ns, severity_number=number,
                      severity_text=text, body=_value(event.payload),
                      attributes={"tollhouse.event_id": event.event_id},
                      event_name="tollhouse.audit"),
            resource=self._resource, instrumentation_scope=self._scope)

    async def send(self, events: list[Event]) -> None:
        batch = [self.record(e) for e in events]
        result = await asyncio.get_running_loop().run_in_executor(
            self._thread, self._exporter.export, batch)
        if result is not LogRecordExportResult.SUCCESS:
            raise SendFailed("the OTLP receiver refused the batch or could not be reached")

    async def close(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call] # (an export under way stops retrying)
        self._thread.shutdown(wait=False)


def _value(value: Any) -> Any:
    """A payload as an OTLP AnyValue: maps and lists kept, nulls left out (OTLP has none)."""
    if isinstance(value, dict):
        return {str(k): _value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_value(v) for v in value if v is not None]
    return value

"""Streaming the audit log to SIEMs and log pipelines (`[[audit.exports]]`,
docs/audit-export.md): every record that lands in the audit table is queued for each export in
the same transaction (`queue`), and a worker per export (`worker`, through `table`) sends it
to the receiver (`senders`, `otlp`), as OCSF API Activity (`ocsf`) or as /api/v1/audit shows
it, at least once, in order, with a stable event id. `service.Exports` is what a gateway runs;
`status` is what the console and the API show.
"""

from proxy.audit.exports.status import ExportStatus, status

__all__ = ["ExportStatus", "status"]

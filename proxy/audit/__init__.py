"""Step 7 of the path: one audit record per JSON-RPC request, written off the request path."""

from proxy.audit.record import AuditRecord, AuditSink, MemoryAuditSink
from proxy.audit.sqlite import SqliteAuditSink, query

__all__ = ["AuditRecord", "AuditSink", "MemoryAuditSink", "SqliteAuditSink", "query"]

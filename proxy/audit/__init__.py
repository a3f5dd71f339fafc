"""The audit log: one audit record per JSON-RPC request, committed off the event loop
(group commit) before the request's answer leaves."""

from proxy.audit.database import DatabaseAuditSink, query
from proxy.audit.record import AuditRecord, AuditSink, MemoryAuditSink

__all__ = ["AuditRecord", "AuditSink", "DatabaseAuditSink", "MemoryAuditSink", "query"]

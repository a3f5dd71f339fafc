"""GET /api/v1/audit: filtered, newest first, paged by an opaque cursor (time, row id)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

COLUMNS = ("id", "ts", "request_id", "principal", "endpoint", "method", "tool", "status",
           "denied_reason", "error_message", "duration_ms", "bytes_in", "bytes_out", "era",
           "session_hash", "client_name", "call_id", "note", "egress")


def page(path: str, *, status: str | None = None, endpoint: str | None = None,
         principal: str | None = None, tool: str | None = None, since: float | None = None,
         until: float | None = None, before: tuple[float, int] | None = None,
         limit: int = 50) -> list[dict[str, Any]]:
    if path != ":memory:" and not Path(path).exists():
        return []
    clauses: list[str] = []
    args: list[Any] = []
    for column, value in (("status", status), ("endpoint", endpoint),
                          ("principal", principal), ("tool", tool)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    if since is not None:
        clauses.append("ts >= ?")
        args.append(since)
    if until is not None:
        clauses.append("ts < ?")
        args.append(until)
    if before is not None:
        clauses.append("(ts < ? OR (ts = ? AND id < ?))")
        args.extend([before[0], before[0], before[1]])
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        have = {row[1] for row in conn.execute("PRAGMA table_info(audit)")}
        columns = [c for c in COLUMNS if c in have]
        rows = conn.execute(f"SELECT {', '.join(columns)} FROM audit {where} "
                            "ORDER BY ts DESC, id DESC LIMIT ?", (*args, limit)).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [dict(zip(columns, row)) for row in rows]

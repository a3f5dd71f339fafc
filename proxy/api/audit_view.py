"""GET /api/v1/audit: filtered, newest first, paged by an opaque cursor (time, row id)."""

from __future__ import annotations

from typing import Any

from proxy import db
from proxy.audit.sqlite import query


def page(target: db.Target, *, status: str | None = None, endpoint: str | None = None,
         principal: str | None = None, tool: str | None = None, since: float | None = None,
         until: float | None = None, before: tuple[float, int] | None = None,
         limit: int = 50) -> list[dict[str, Any]]:
    return query(target, status=status, endpoint=endpoint, principal=principal, tool=tool,
                 since=since, until=until, before=before, limit=limit, with_id=True)

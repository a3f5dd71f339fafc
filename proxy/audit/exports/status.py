"""Each export's status as the console and the management API show it (`status`): read from
the database, so any gateway on it answers for all of them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypedDict

from proxy.audit.exports.table import read_states
from proxy.config.tables import ExportConfig
from proxy.storage import db


class ExportStatus(TypedDict):
    """One export: its backlog now, and its totals over every gateway on the database."""

    name: str
    kind: str
    format: str
    backlog: int  # records queued, not yet delivered (counted up to max_backlog)
    lag_s: float  # age of the oldest of them; 0.0 when none
    sent: int  # records the receiver took
    failed: int  # records in sends that failed (once per failed attempt)
    dropped: int  # records not queued because the backlog was full
    full: bool  # the backlog is at max_backlog: new records are dropped for this export
    last_error: str | None  # the last failure, without secrets or the URL's query
    last_error_at: float | None
    last_sent_at: float | None


def status(database: db.Database, exports: Sequence[ExportConfig]) -> list[ExportStatus]:
    """Every configured export's status, in the config's order. Blocking (database reads):
    call it off the event loop (asyncio.to_thread)."""
    configs = list(exports)
    if not configs:
        return []
    now = time.time()
    states = read_states(database, [c.name for c in configs], [c.max_backlog for c in configs])
    return [ExportStatus(
        name=cfg.name, kind=cfg.kind, format=cfg.format, backlog=backlog,
        lag_s=round(max(0.0, now - oldest_at), 3) if oldest_at is not None else 0.0,
        sent=state.sent, failed=state.failed, dropped=state.dropped,
        full=backlog >= cfg.max_backlog, last_error=state.last_error,
        last_error_at=state.last_error_at, last_sent_at=state.last_sent_at)
        for cfg, (state, backlog, oldest_at) in zip(configs, states, strict=True)]

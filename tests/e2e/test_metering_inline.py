"""An in-process metering hook (`metering.hook`) is handed each usage event as its call ends,
once the audit record is in the journal: the outbox row goes in delivered and the worker never
sends it again. A hook that fails gets the event from the outbox; one whose record() waits is
left to the outbox from then on. Every event reaches the hook, once each (at least once: a
crash replays the journal), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.audit.outbox import OutboxWorker
from proxy.storage import db
from tests import db_backends
from tests.e2e.conftest import stack_config
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import DEADLINE_S, until
from tests.stack import gateway_stack


class Hook:
    """Allows every call; keeps each usage event. `failures`: how many record() calls raise
    first; `waits`: record() suspends once (as a hook doing I/O would) before it keeps one."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.recorded: list[dict[str, Any]] = []
        self.failures = 0
        self.waits = False
        self.abandoned = 0  # deliveries closed where they waited
        self.broken = False  # record() raises before it is even a coroutine

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"allow": True}

    def record(self, event: dict[str, Any]) -> Any:
        if self.broken:
            self.broken = False
            raise RuntimeError("the hook's client is not configured")
        return self._record(event)

    async def _record(self, event: dict[str, Any]) -> None:
        if self.waits:
            try:
                await _yield()
            except GeneratorExit:
                self.abandoned += 1
                raise
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the billing queue is full")
        self.recorded.append(event)


class _Yield:
    def __await__(self) -> Any:
        yield  # one step back to the event loop, and on


def _yield() -> _Yield:
    return _Yield()


HOOK = Hook()


@dataclass
class Metered:
    url: str
    state: Any  # the gateway's State: its outbox worker starts with the app
    database: str

    @property
    def outbox(self) -> OutboxWorker:
        worker = self.state.outbox
        assert worker is not None
        return worker  # type: ignore[no-any-return]

    async def call(self, http: httpx.AsyncClient, n: int = 1) -> str:
        """A tools/call answered ok; its call id, read from the hook's events or the outbox."""
        body = orjson.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                             "params": {"name": "echo", "arguments": {"text": "x"}}})
        answer = await http.post(self.url, content=body, headers={
            "content-type": "application/json", "accept": "application/json, text/event-stream"})
        assert answer.status_code == 200, answer.text
        assert "result" in answer.json(), answer.text
        return answer.text

    def outbox_rows(self) -> list[tuple[str, float | None]]:
        database = db.resolve(self.database)
        try:
            conn = database.connect()
            try:
                rows = conn.execute("SELECT call_id, delivered_at FROM usage_outbox").fetchall()
            finally:
                conn.close()
        finally:
            database.close()
        return [(str(r[0]), r[1]) for r in rows]


@asynccontextmanager
async def metered(tmp_path: Path) -> AsyncIterator[Metered]:
    HOOK.reset()
    app, _ = stateless_json_app()
    database = db_backends.url()
    async with gateway_stack(lambda urls: stack_config(urls.upstream, database, {
            # the journal on whatever the database (the default turns it on for SQLite only)
            "database": {"url": database, "audit_journal": "on",
                         "audit_journal_path": str(tmp_path / "audit-journal")},
            "metering": {"hook": f"{__name__}:HOOK", "timeout_ms": 2000}}),
            upstream=app) as site:
        yield Metered(site.endpoint("up"), site.services, database)


async def test_each_event_reaches_the_hook_before_the_answer_and_is_never_sent_again(
        tmp_path: Path) -> None:
    async with metered(tmp_path) as m, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        for n in range(1, 4):
            await m.call(http, n)
            assert len(HOOK.recorded) == n  # taken as the call ended: no wait for the worker
        ids = {e["call_id"] for e in HOOK.recorded}
        assert len(ids) == 3 and m.outbox.delivered_inline == 3

        def rows_in() -> bool:
            return len(m.outbox_rows()) == 3

        await until(rows_in, what="the three outbox rows")
        rows = m.outbox_rows()
        assert {call_id for call_id, _ in rows} == ids
        assert all(delivered is not None for _, delivered in rows)  # went in delivered
        assert await m.outbox.flush(DEADLINE_S)  # nothing due: the worker sends nothing
    assert len(HOOK.recorded) == 3
    assert HOOK.recorded[0]["type"] == "usage" and HOOK.recorded[0]["status"] == "ok"


async def test_an_event_the_hook_refused_comes_again_from_the_outbox(tmp_path: Path) -> None:
    async with metered(tmp_path) as m, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        HOOK.failures = 1
        await m.call(http)
        assert HOOK.recorded == []  # refused as the call ended: the answer went all the same
        await until(lambda: len(HOOK.recorded) == 1, what="the outbox's delivery")
        await m.call(http, 2)  # the next one is taken at once again
        assert len(HOOK.recorded) == 2
        assert m.outbox.delivered_inline == 1
        await until(lambda: all(d is not None for _, d in m.outbox_rows())
                    and len(m.outbox_rows()) == 2, what="both events marked delivered")
    assert len({e["call_id"] for e in HOOK.recorded}) == 2


async def test_a_hook_that_waits_is_left_to_the_outbox_from_then_on(tmp_path: Path) -> None:
    async with metered(tmp_path) as m, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        HOOK.waits = True
        await m.call(http)
        assert HOOK.recorded == [] and HOOK.abandoned == 1
        assert m.outbox.inline is False
        await until(lambda: len(HOOK.recorded) == 1, what="the outbox's delivery")
        await m.call(http, 2)
        assert HOOK.abandoned == 1  # not tried at once again: the worker sends it
        await until(lambda: len(HOOK.recorded) == 2, what="the second event")
        assert m.outbox.delivered_inline == 0
        await until(lambda: all(d is not None for _, d in m.outbox_rows())
                    and len(m.outbox_rows()) == 2, what="both events marked delivered")
    assert len({e["call_id"] for e in HOOK.recorded}) == 2


async def test_a_hook_that_raises_before_its_coroutine_costs_the_call_nothing(
        tmp_path: Path) -> None:
    async with metered(tmp_path) as m, httpx.AsyncClient(timeout=DEADLINE_S) as http:
        HOOK.broken = True
        await m.call(http)  # answered, not a 500
        await until(lambda: len(HOOK.recorded) == 1, what="the outbox's delivery")
        await until(lambda: len(m.outbox_rows()) == 1 and m.outbox_rows()[0][1] is not None,
                    what="the event marked delivered")
        assert m.outbox.inline is True  # a failure is not a wait: the next is taken at once
        await m.call(http, 2)
        assert len(HOOK.recorded) == 2

"""The metering hook's two backends, and the outbox worker that delivers usage events.

Usage events are written to the `usage_outbox` table in the same transaction as their audit
record, so an accepted call is never lost; the worker delivers them at least once, with
exponential backoff, across restarts and receiver outages. The receiver settles each `call_id`
once (it is the idempotency key). The webhook's contract is fixed: a JSON POST signed with
`X-Tollhouse-Signature: sha256=<hex HMAC-SHA256 of the body>`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import orjson

from policies.metering import MeteringBackend
from proxy.config import MeteringConfig

log = logging.getLogger("tollhouse.metering")
T = TypeVar("T")


class PythonHook:
    """`metering.hook = "module:object"`: an object with async authorize() and record()."""

    def __init__(self, spec: str) -> None:
        module, _, name = spec.partition(":")
        target = getattr(importlib.import_module(module), name)
        for method in ("authorize", "record"):
            if not callable(getattr(target, method, None)):
                raise ValueError(f"metering hook {spec} has no {method}()")
        self._target = target

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        return dict(await self._target.authorize(request))

    async def record(self, event: dict[str, Any]) -> None:
        await self._target.record(event)


class Webhook:
    def __init__(self, url: str, secret: str, http: httpx.AsyncClient, timeout_s: float) -> None:
        self._url = url
        self._key = secret.encode()
        self._http = http
        self._timeout_s = timeout_s

    def sign(self, body: bytes) -> str:
        return "sha256=" + hmac.new(self._key, body, hashlib.sha256).hexdigest()

    async def _post(self, payload: dict[str, Any], timeout_s: float) -> httpx.Response:
        body = orjson.dumps(payload)
        return await self._http.post(self._url, content=body, timeout=timeout_s, headers={
            "content-type": "application/json", "x-tollhouse-signature": self.sign(body)})

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        response = await self._post({"type": "authorize", **request}, self._timeout_s)
        if response.status_code != 200:
            raise ValueError(f"authorize answered HTTP {response.status_code}")
        answer = response.json()
        if not isinstance(answer, dict):
            raise ValueError("authorize answered no object")
        return answer

    async def record(self, event: dict[str, Any]) -> None:
        response = await self._post(event, max(self._timeout_s, 5.0))
        if not 200 <= response.status_code < 300:
            raise ValueError(f"usage answered HTTP {response.status_code}")


def build_backend(cfg: MeteringConfig, http: httpx.AsyncClient) -> MeteringBackend:
    if cfg.hook:
        return PythonHook(cfg.hook)
    return Webhook(cfg.url, cfg.secret, http, cfg.timeout_ms / 1000)


class OutboxWorker:
    """Delivers due usage events; woken when new ones land, otherwise when the next retry is
    due. Every database step runs on one dedicated thread, in order: a step still running
    when the worker is cancelled finishes before the connection is closed."""

    def __init__(self, path: str, backend: MeteringBackend, retry_max_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._backend = backend
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tollhouse-outbox")
        self.delivered = 0

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._db, fn, *args)

    def wake_threadsafe(self) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        conn = await self._in_db(self._connect)
        try:
            while True:
                self._wake.clear()
                due, next_at = await self._in_db(self._due, conn, self._clock())
                for call_id, event, attempts in due:
                    await self._deliver(conn, call_id, event, attempts)
                if due:
                    continue
                wait = 30.0 if next_at is None else max(0.0, next_at - self._clock())
                try:
                    await asyncio.wait_for(self._wake.wait(), min(wait, 30.0))
                except TimeoutError:
                    pass
        finally:
            # queued behind any step still running on the thread, whatever cancelled us
            self._db.submit(conn.close)
            self._db.shutdown(wait=False)

    def _connect(self) -> sqlite3.Connection:
        from proxy.audit.sqlite import connect

        return connect(self._path)

    @staticmethod
    def _due(conn: sqlite3.Connection, now: float
             ) -> tuple[list[tuple[str, str, int]], float | None]:
        rows = conn.execute(
            "SELECT call_id, event, attempts FROM usage_outbox WHERE delivered_at IS NULL "
            "AND next_attempt_at <= ? ORDER BY created_at LIMIT 100", (now,)).fetchall()
        nxt = conn.execute("SELECT min(next_attempt_at) FROM usage_outbox "
                           "WHERE delivered_at IS NULL").fetchone()[0]
        return rows, nxt

    async def _deliver(self, conn: sqlite3.Connection, call_id: str, event: str,
                       attempts: int) -> None:
        try:
            await asyncio.wait_for(self._backend.record(orjson.loads(event)), 10.0)
        except Exception as exc:  # noqa: BLE001 - any failure is retried later
            delay = min(self._retry_max_s, 0.5 * 2 ** attempts)
            log.info("usage event %s not delivered (%s); retry in %.1fs", call_id,
                     type(exc).__name__, delay)
            await self._in_db(self._update, conn,
                              "UPDATE usage_outbox SET attempts = attempts + 1, "
                              "next_attempt_at = ? WHERE call_id = ?",
                              (self._clock() + delay, call_id))
            return
        await self._in_db(self._update, conn,
                          "UPDATE usage_outbox SET delivered_at = ? WHERE call_id = ?",
                          (self._clock(), call_id))
        self.delivered += 1

    @staticmethod
    def _update(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> None:
        with conn:
            conn.execute(sql, args)

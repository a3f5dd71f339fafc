"""The `usage_outbox` table as the outbox worker (`proxy.audit.outbox`) uses it: claim due
events out of every other worker's reach, hand them back or renew their lease, write their
outcomes (delivered, or due again later), and prune delivered ones. Each method is one
transaction on the worker's own connection and runs on the worker's database thread, never on
the event loop. The outcomes of a claim wait in `Marks` until they are written."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

import orjson

from proxy.storage import db
from proxy.storage.own import OwnConnection

# (delivered: [(time, call id)], due again: [(next attempt, call id)])
Outcomes = tuple[list[tuple[float, str]], list[tuple[float, str]]]
Claimed = list[tuple[str, str, int]]  # (call id, event, attempts so far)


class OutboxTable:
    """The statements, prepared once for the dialect, and the worker's own connection (made on
    first use, on the worker's thread, and again after one is lost; an in-memory SQLite
    database's shared one instead)."""

    def __init__(self, database: db.Database, claim: int, lease_s: float, prune_batch: int,
                 clock: Callable[[], float]) -> None:
        self._database = database
        self.lease_s = lease_s
        self.prune_batch = prune_batch
        self._clock = clock
        self._own = OwnConnection(database)
        skip_locked = " FOR UPDATE SKIP LOCKED" if database.postgresql else ""
        # Due events longest due first, in the due index's own order: a claim reads `claim`
        # rows of it, not the whole backlog (ordered by created_at, every claim sorted every
        # event still to deliver, and under load, with deliveries behind, each claim cost more)
        self._sql_claim = database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id IN (SELECT call_id FROM "
            "usage_outbox WHERE delivered_at IS NULL AND next_attempt_at <= ? ORDER BY "
            f"next_attempt_at LIMIT {claim}{skip_locked}) "
            "RETURNING call_id, event, attempts, created_at")
        self._sql_release = database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id = ? AND "
            "delivered_at IS NULL")
        # SQLite: the claim and the mark each one step, whatever their size (sqlite3 lets the
        # GIL go around every step, and the event loop then waits to get it back: a per-row
        # step of this thread cost every call's socket writes their share of the wait)
        self._sql_pick = database.sql(
            "SELECT json_group_array(json_array(call_id, event, attempts, created_at)) FROM "
            "(SELECT call_id, event, attempts, created_at FROM usage_outbox WHERE delivered_at "
            f"IS NULL AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT {claim})")
        self._sql_lease = database.sql(
            "UPDATE usage_outbox SET next_attempt_at = ? WHERE call_id IN "
            "(SELECT value FROM json_each(?))")
        # each a JSON array of [time, call_id] pairs
        self._sql_done_all = (
            "UPDATE usage_outbox SET delivered_at = json_extract(j.value, '$[0]') FROM "
            "json_each(?) AS j WHERE usage_outbox.call_id = json_extract(j.value, '$[1]')")
        self._sql_retry_all = (
            "UPDATE usage_outbox SET attempts = attempts + 1, next_attempt_at = "
            "json_extract(j.value, '$[0]') FROM json_each(?) AS j "
            "WHERE usage_outbox.call_id = json_extract(j.value, '$[1]')")
        self._sql_next = database.sql(
            "SELECT min(next_attempt_at) FROM usage_outbox WHERE delivered_at IS NULL")
        self._sql_retry = database.sql(
            "UPDATE usage_outbox SET attempts = attempts + 1, next_attempt_at = ? "
            "WHERE call_id = ?")
        self._sql_done = database.sql(
            "UPDATE usage_outbox SET delivered_at = ? WHERE call_id = ?")
        # the due index (delivered_at, next_attempt_at) is the range this walks
        self._sql_prune = database.sql(
            "DELETE FROM usage_outbox WHERE call_id IN (SELECT call_id FROM usage_outbox "
            f"WHERE delivered_at < ? LIMIT {prune_batch})")

    def drop(self) -> None:
        """Close the worker's connection (a lost one, or the worker stopping)."""
        self._own.close()

    def claim(self, now: float, outcomes: Outcomes) -> tuple[Claimed, float | None]:
        """Write the last claim's `outcomes`, then take the due events, oldest first, out of
        every other worker's reach (and, with nothing due, when the next one is); one
        transaction."""
        # the write lock from the start (below)
        with self._own.transaction(immediate=True) as conn:
            self._write(conn, outcomes)
            if self._database.postgresql:
                rows = conn.execute(self._sql_claim, (now + self.lease_s, now)).fetchall()
            else:  # under the write lock from the start: no other worker picks the same
                rows = orjson.loads(conn.execute(self._sql_pick, (now,)).fetchone()[0])
                if rows:
                    conn.execute(self._sql_lease, (now + self.lease_s,
                                                   orjson.dumps([r[0] for r in rows]).decode()))
            # when the next event is due matters only to a worker with nothing to send now
            nxt = None if rows else conn.execute(self._sql_next, ()).fetchone()[0]
        rows.sort(key=lambda r: float(r[3]))
        return [(str(r[0]), str(r[1]), int(r[2])) for r in rows], nxt

    def release(self, call_ids: list[str], until: float | None) -> None:
        """Hand claimed events back (due now), or hold them `until` then (a renewed claim)."""
        with suppress(*self._database.errors), self._own.transaction() as conn:
            at = self._clock() if until is None else until
            for call_id in call_ids:
                conn.execute(self._sql_release, (at, call_id))

    def mark(self, outcomes: Outcomes) -> None:
        """A claim's outcomes in a transaction of their own (a worker that stops)."""
        with self._own.transaction() as conn:
            self._write(conn, outcomes)

    def prune(self, before: float) -> int:
        """Delete up to `prune_batch` events delivered before `before`; how many went."""
        with self._own.transaction() as conn:
            cur = conn.execute(self._sql_prune, (before,))
            return max(0, int(cur.rowcount or 0))

    def _write(self, conn: db.Connection, outcomes: Outcomes) -> None:
        """Delivered, or due again later; each statement prepared once for all its rows."""
        done, retry = outcomes
        if not done and not retry:
            return
        cur = conn.cursor()
        try:
            if not self._database.postgresql:
                if done:
                    cur.execute(self._sql_done_all, (orjson.dumps(done).decode(),))
                if retry:
                    cur.execute(self._sql_retry_all, (orjson.dumps(retry).decode(),))
                return
            if done:
                cur.executemany(self._sql_done, done)
            if retry:
                cur.executemany(self._sql_retry, retry)
        finally:
            cur.close()


class Marks:
    """The outcomes of a claim's deliveries, until they are written."""

    __slots__ = ("done", "retry", "sent")

    def __init__(self) -> None:
        self.done: list[tuple[float, str]] = []
        self.retry: list[tuple[float, str]] = []
        self.sent = 0  # delivered, in the last batch taken

    @property
    def pending(self) -> bool:
        return bool(self.done or self.retry)

    def add(self, outcome: tuple[str, float | None], now: float) -> None:
        call_id, next_at = outcome
        if next_at is None:
            self.done.append((now, call_id))
        else:
            self.retry.append((next_at, call_id))

    def put_back(self, outcomes: Outcomes) -> None:
        """Outcomes taken for a write that did not happen: written with the next one."""
        self.done.extend(outcomes[0])
        self.retry.extend(outcomes[1])

    def take(self) -> Outcomes:
        taken = (self.done, self.retry)
        self.sent = len(self.done)
        self.done, self.retry = [], []
        return taken

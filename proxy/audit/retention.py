"""Retention (`[audit] retention_days`, docs/audit-evidence.md): a background task that
removes audit records older than the retention period, in small batches, each its own short
transaction, so that no lock it takes is held long enough to delay a call's record.

With the chain on, a chain is only ever cut at its start: the records removed are the
longest run from the chain's start (its last anchor) whose every record is older than the
cut and that a checkpoint has signed (a record newer than the cut, or not signed yet, stops
the run: it and those after it wait for a later pass). A writer that stopped before it
signed its last records (killed) leaves them unsigned: once they are all older than the cut
and link from its last signed head (or its genesis), the pass signs them as it removes them.
Before it removes anything, the task
writes a signed checkpoint whose anchors name, per chain, the last record it removes (its
place and hash): `tollhouse audit verify` then verifies each chain from its anchor, and says
so. Records in no chain (written with the chain off) are removed by time. Checkpoints older
than the cut go too, the newest always kept: each checkpoint carries every anchor on.

Several gateways on one database may each run it: the anchors a checkpoint carries only
move forward (a pass that computed less keeps the larger), and removing what is gone
already removes nothing, so passes on two replicas at once do the same work twice, never
harm. The rollups (proxy.audit.rollup) are not touched: usage totals and summaries keep
counting what was removed (a period reaching before the cut is read from them to the
minute); `tollhouse db rollups` would rebuild them from what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from proxy.audit import checkpoint
from proxy.audit.chain import genesis, link
from proxy.audit.checkpoint import Entries, Signer
from proxy.audit.commit import COLUMNS
from proxy.storage import db

log = logging.getLogger("tollhouse.audit")

DAY_S = 86400.0


class Retention:
    """One pass (`prune`, blocking) removes what is older than `days`; `run` makes a pass
    every `every_s`, the first `first_s` after start. `signer`: the chain's key, with the
    chain on."""

    BATCH = 500  # records a transaction removes
    PAUSE_S = 0.005  # between two batches: the audit writer takes the lock in between
    READ = 2000  # records read at a time, finding where a chain's run ends

    def __init__(self, database: db.Database, days: int, signer: Signer | None,
                 every_s: float = 3600.0, first_s: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._database = database
        self._days = days
        self._signer = signer
        self._every_s = every_s
        self._first_s = first_s
        self._clock = clock
        self.removed = 0  # records removed, every pass
        self.passes = 0

    async def run(self) -> None:
        """A pass every `every_s` until cancelled; a pass that fails is logged and the next
        one tries again."""
        await asyncio.sleep(self._first_s)
        while True:
            try:
                await asyncio.to_thread(self.prune)
            except Exception as exc:  # noqa: BLE001 - a database error: the next pass retries
                log.warning("audit retention: the pass failed (%s): the next one tries "
                            "again in %g s", exc if isinstance(exc, self._database.errors)
                            else type(exc).__name__, self._every_s)
            await asyncio.sleep(self._every_s)

    def prune(self) -> int:
        """Remove what is older than the retention period; the records removed."""
        now = self._clock()
        cut = now - self._days * DAY_S
        removed = 0
        if self._signer is not None:
            anchors = self._anchors(cut)
            if anchors:
                self._sign_cut(anchors, cut, now)
                for chain_id, (seq, _) in sorted(anchors.items()):
                    removed += self._batches(
                        "chain_id = ? AND chain_seq <= ?", (chain_id, seq))
            removed += self._batches("chain_id IS NULL AND ts < ?", (cut,))
            self._batches("at < ? AND seq < (SELECT max(seq) FROM audit_checkpoints)", (cut,),
                          table="audit_checkpoints", key="seq")
        else:
            removed += self._batches("ts < ?", (cut,))
        self.removed += removed
        self.passes += 1
        if removed:
            log.info("audit retention: %d records older than %d days removed (before %s UTC)",
                     removed, self._days, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(cut)))
        return removed

    def _anchors(self, cut: float) -> dict[str, tuple[int, str]]:
        """Per chain, the last record of the run from its anchor that is older than `cut`
        and signed, where that moves the anchor on. Read from the newest checkpoint this
        key verifies (an unsigned or forged one anchors nothing)."""
        assert self._signer is not None
        database = self._database
        with database.lease() as conn:
            try:
                rows = checkpoint.newest(conn, database, 50)
                base = next((r for r in rows if r.verified_by(self._signer.public)), None)
                entries = base.parsed()["chains"] if base is not None else {}
                ids = {r[0] for r in conn.execute(
                    "SELECT DISTINCT chain_id FROM audit WHERE chain_id IS NOT NULL").fetchall()}
                out = {}
                for chain_id in sorted(ids | set(entries)):
                    entry = entries.get(chain_id) or [0, genesis(chain_id).hex(), 0, ""]
                    head, anchor = int(entry[0]), int(entry[2])
                    last = self._run_end(conn, chain_id, anchor, head, cut)
                    if (last[0] if last else anchor) == head:  # the run reached the head
                        last = self._sealed(conn, chain_id, head, entry[1], cut) or last
                    if last is not None:
                        out[chain_id] = last
                return out
            finally:
                conn.rollback()

    def _run_end(self, conn: db.Connection, chain_id: str, after: int, head: int,
                 cut: float) -> tuple[int, str] | None:
        text = self._database.sql(
            "SELECT chain_seq, ts, chain_hash FROM audit WHERE chain_id = ? AND chain_seq > ? "
            f"AND chain_seq <= ? ORDER BY chain_seq LIMIT {self.READ}")
        end: tuple[int, str] | None = None
        expected = after + 1
        while True:
            rows = conn.execute(text, (chain_id, after, head)).fetchall()
            for seq, ts, digest in rows:
                if int(seq) != expected or float(ts) >= cut:  # a gap, or a record to keep
                    return end
                end = (int(seq), digest)
                expected += 1
            if len(rows) < self.READ:
                return end
            after = int(rows[-1][0])

    def _sealed(self, conn: db.Connection, chain_id: str, head: int, head_hash: str,
                cut: float) -> tuple[int, str] | None:
        """The end of a chain's records after its signed head when they are all older than
        the cut and link from that head: a writer that stopped (killed, say) before it
        signed them. The retention checkpoint signs them as it anchors the chain past them,
        so they go too, having been checked here. None if there are none, or any fails."""
        text = self._database.sql(
            f"SELECT chain_seq, {', '.join(COLUMNS)}, chain_hash FROM audit WHERE chain_id = ? "
            f"AND chain_seq > ? ORDER BY chain_seq LIMIT {self.READ}")
        digest, after, end = bytes.fromhex(head_hash), head, None
        while True:
            rows = conn.execute(text, (chain_id, after)).fetchall()
            for row in rows:
                seq = int(row[0])
                if seq != after + 1 or float(row[1]) >= cut:
                    return None
                digest = link(digest, chain_id, seq, row[1:-1])
                if digest.hex() != row[-1]:
                    log.error("audit retention: chain %s record #%d does not link: its "
                              "unsigned tail is left for `tollhouse audit verify`",
                              chain_id, seq)
                    return None
                after, end = seq, (seq, row[-1])
            if len(rows) < self.READ:
                return end

    def _sign_cut(self, anchors: dict[str, tuple[int, str]], cut: float, now: float) -> None:
        """The checkpoint that anchors each chain at its last record removed, before any
        is: verify then starts there."""
        assert self._signer is not None

        def update(entries: Entries) -> None:
            for chain_id, (seq, digest) in anchors.items():
                entry = entries.get(chain_id)
                if entry is None or seq > int(entry[0]):  # a stopped writer's tail, sealed
                    entries[chain_id] = [seq, digest, seq, digest]
                elif seq > int(entry[2]):
                    entry[2], entry[3] = seq, digest

        database = self._database
        with database.lease() as conn:
            checkpoint.write(conn, database, self._signer, "retention", update, now, cut=cut)

    def _batches(self, where: str, args: tuple[object, ...], table: str = "audit",
                 key: str = "id") -> int:
        """Delete the rows of `table` that match, BATCH a transaction; how many."""
        database = self._database
        text = database.sql(f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
                            f"WHERE {where} LIMIT {self.BATCH})")
        total = 0
        while True:
            with database.transaction() as conn:
                count = conn.execute(text, args).rowcount
            total += max(count, 0)
            if count < self.BATCH:
                return total
            time.sleep(self.PAUSE_S)

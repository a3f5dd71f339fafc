"""The audit writer's cost per record, with and without the rollups (proxy.audit.rollup): N
records written through DatabaseAuditSink, in batches as large as `--batch` (the writer takes
what is queued when it is free: a busy gateway's batches are tens of records, a quiet one's
one), on a new SQLite file or `--db` (an empty PostgreSQL database). The process's CPU time
(the writer thread's, and the loop queueing the records) and the wall time, per record. A
report, not a test (bench/README.md, "Web console at size").

    .venv/bin/python bench/rollup_writer.py [--records 50000] [--batch 1 10 500] [--db URL]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.audit import AuditRecord, DatabaseAuditSink, rollup
from proxy.storage.db import Database

TOOLS = ("search", "read", "write", "list", "delete")
STATUSES = ("ok",) * 90 + ("denied",) * 5 + ("error",) * 4 + ("cancelled",)


def records(n: int, seed: int) -> list[AuditRecord]:
    rng = random.Random(seed)
    now = time.time()
    out = []
    for i in range(n):
        status = rng.choice(STATUSES)
        out.append(AuditRecord(
            endpoint=f"s{i % 500}", method="tools/call", request_id=str(i),
            principal=f"user{i % 300}", tool=rng.choice(TOOLS), status=status,  # type: ignore[arg-type]
            denied_reason="access: tool hidden" if status == "denied" else None,
            error_message="upstream failed" if status == "error" else None,
            duration_ms=rng.expovariate(1 / 40), bytes_in=200, bytes_out=800,
            call_id=f"{seed}-{i}" if i % 2 else None, ts=now - (n - i) * 0.01))
    return out


async def run(url: str, batch: int, n: int, seed: int) -> tuple[float, float, int]:
    """CPU and wall seconds to write `n` records in batches of `batch`; the commits made."""
    sink = DatabaseAuditSink(url, batch_size=max(batch, 1))
    lot = records(n, seed)
    await sink.settled()  # (the writer up, its schema checked)
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, n, batch):
        waiters = [sink.write(r) for r in lot[start:start + batch]]
        await asyncio.gather(*waiters)  # the next lot once this one is committed
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    commits = sink.commits
    await sink.close()
    return cpu, wall, commits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="an empty database (default: a new "
                        "SQLite file for each run)")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10, 500])
    args = parser.parse_args()
    print("| database | batch | rollups | µs CPU / record | µs wall / record | commits |\n"
          "|---|---:|---|---:|---:|---:|")
    real_add = rollup.Writer.add
    seed = 0
    for batch in args.batch:
        for with_rollups in (False, True):
            seed += 1
            url = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='tollhouse-writer-')}/w.db"
            with Database(url) as database:
                database.ensure_schema()
            rollup.Writer.add = (real_add if with_rollups  # type: ignore[method-assign]
                                 else lambda *_: None)
            n = args.records if batch > 1 else args.records // 5  # one commit a record: fewer
            cpu, wall, commits = asyncio.run(run(url, batch, n, seed))
            kind = "PostgreSQL" if url.startswith("postgres") else "SQLite"
            print(f"| {kind} | {batch} | {'yes' if with_rollups else 'no'} | "
                  f"{cpu / n * 1e6:.1f} | {wall / n * 1e6:.1f} | {commits:,} |", flush=True)
    rollup.Writer.add = real_add  # type: ignore[method-assign]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The audit writer's CPU per record: `--records` records through the real DatabaseAuditSink
(SQLite file, journal on, the 20 ms commit window), fed ten at a time every 15 ms (about the
bench's 600 calls a second), then the writer thread's CPU time (/proc) divided by the count.
A report, not a test (bench/README.md, "What was tried").

    .venv/bin/python bench/audit_writer.py [--records 10000] [--metered] [--ids ordered|random]

`--metered` gives each record a call id and a usage event (the outbox row); `--ids random`
makes those ids 24 random hex digits, as before the time-ordered ids, for the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.metering import new_call_id
from proxy.audit.database import DatabaseAuditSink
from proxy.audit.record import AuditRecord
from proxy.storage.db import Database


def thread_cpu_s(native_id: int | None) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(records: int, metered: bool, ids: str) -> float:
    folder = tempfile.mkdtemp(prefix="tollhouse-writer-")
    database = Database(f"sqlite:///{folder}/audit.db")
    database.ensure_schema()
    sink = DatabaseAuditSink(database, journal=f"{folder}/journal", commit_window_s=0.02)
    native_id = sink._thread.native_id
    began = thread_cpu_s(native_id)
    for i in range(records):
        call_id = None
        if metered:
            call_id = new_call_id() if ids == "ordered" else secrets.token_hex(12)
        sink.emit(AuditRecord(endpoint="echo", method="tools/call", request_id=str(i),
                              principal="alice", tool="echo", duration_ms=1.5, bytes_in=120,
                              bytes_out=200, session_hash="abcd1234abcd1234", call_id=call_id))
        if i % 10 == 9:
            await asyncio.sleep(0.015)
    await sink.settled()
    spent = thread_cpu_s(native_id) - began
    await sink.close()
    database.close()
    return spent / records * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--metered", action="store_true")
    parser.add_argument("--ids", choices=("ordered", "random"), default="ordered")
    args = parser.parse_args()
    began = time.perf_counter()
    us = asyncio.run(measure(args.records, args.metered, args.ids))
    what = f"metered, {args.ids} ids" if args.metered else "unmetered"
    print(f"{args.records:,} records ({what}): the writer spent {us:.1f} us of CPU a record "
          f"({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the audit hash chain costs the writer thread per record (issue 39, target <= 10 us),
side by side with the chain off.

Two figures. `link`: the chain's own work on a batch's rows (the canonical form, SHA-256, the
hex of the digest), alone. `commit`: the audit writer's transaction (proxy.audit.commit.
Committer.attempt: the rows, their rollup counts, the commit) with the chain off and on, in
batches of `--batch` records, CPU time of the writing thread (this one: the writer's work,
done here), on a new SQLite file or `--db` (an empty PostgreSQL database, one per side).
Rounds alternate off and on; medians. A report, not a test: figures depend on the machine.

    .venv/bin/python bench/audit_chain.py [--records 20000] [--batch 1 10 100] [--rounds 5]
                                          [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rollup_writer import records
from proxy.audit.chain import Chain
from proxy.audit.commit import Committer, row_of
from proxy.storage.db import Database


def link_us(n: int, rounds: int) -> float:
    """The chain's own cost per record (canonical form, SHA-256, hex), median of `rounds`."""
    rows = [row_of(r) for r in records(n, 1)]
    chain = Chain("bench:1:00000000")
    out = []
    for _ in range(rounds):
        start = time.thread_time()
        for at in range(0, n, 100):
            _, head = chain.link(rows[at:at + 100])
            chain.advance(head)
        out.append((time.thread_time() - start) / n * 1e6)
    return statistics.median(out)


def commit_us(url: str, chained: bool, batch: int, n: int, seed: int) -> float:
    """CPU per record of committing `n` records in batches of `batch` on this thread."""
    database = Database(url)
    committer = Committer(database, 0.05, None, Chain() if chained else None)
    lot = records(n, seed)
    try:
        start = time.thread_time()
        for at in range(0, n, batch):
            failure = committer.attempt(lot[at:at + batch], 1)
            assert failure is None, failure
        return (time.thread_time() - start) / n * 1e6
    finally:
        committer.close()
        database.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--db", help="an empty PostgreSQL database (default: SQLite files)")
    args = parser.parse_args()
    print(f"link alone: {link_us(args.records, args.rounds):.2f} us a record")
    print(f"{'batch':>6} {'off us/rec':>11} {'on us/rec':>10} {'chain us/rec':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        for batch in args.batch:
            n = min(args.records, 2000 * batch)
            got: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.rounds):
                for chained in (False, True) if i % 2 == 0 else (True, False):
                    url = args.db or f"sqlite:///{tmp}/b{batch}-{i}-{int(chained)}.db"
                    got[chained].append(commit_us(url, chained, batch, n, seed=(batch * 100 + i) * 2 + chained))
            off, on = statistics.median(got[False]), statistics.median(got[True])
            print(f"{batch:>6} {off:>11.1f} {on:>10.1f} {on - off:>13.1f}")


if __name__ == "__main__":
    main()

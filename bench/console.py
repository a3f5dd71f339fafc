"""The web console at size: 1,000,000 audit records, 500 servers and 10,000 API keys in the
database, then each console page rendered `--runs` times in process (the app's own test
client: the console and the /api/v1 requests it makes, no network), reporting its HTML size and
p50/p95 render time. A report, not a test (bench/README.md, "Web console at size").

    .venv/bin/python bench/console.py [--db postgresql://...] [--audit 1000000] [--runs 40]

With `--reuse` the database named by `--db` is one an earlier run seeded: it is measured as
it stands (after any migration this checkout adds), so one seeding serves a before and an
after. `--pages` measures only the pages whose path contains one of its words; `--cold`
empties the API's aggregate cache (15 s) before every render, so that every render is a
first one (its "first ms" column is then the first of them, the p50 and p95 those of all).
`--shift H` measures as if the clock were H hours on (`time.time` patched in this process):
the seeded week stays where it is, so the console's week then starts at another hour of its
first day, with a whole day of records under it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.audit import rollup
from proxy.config import from_dict
from proxy.people.accounts import Accounts
from proxy.runtime.app import create_app
from proxy.storage.db import Database
from proxy.strict import ServerIn

PAGES = ("/console/", "/console/servers", "/console/servers/s250", "/console/keys",
         "/console/users", "/console/users/admin", "/console/audit",
         "/console/audit?status=denied&endpoint=s7", "/console/audit?range=yesterday&tz=UTC",
         "/console/audit?principal=user7&range=7d&tz=UTC",
         "/console/usage?period=day", "/console/usage?period=week", "/console/me/keys",
         "/console/me/connect")
TOOLS = ("search", "read", "write", "list", "delete")
STATUSES = ("ok",) * 90 + ("denied",) * 5 + ("error",) * 4 + ("cancelled",)


def seed(url: str, audit: int, servers: int, keys: int) -> None:
    database = Database(url)
    database.ensure_schema()
    now = time.time()
    rng = random.Random(7)
    with database.transaction() as conn:
        cur = conn.cursor()  # (a psycopg connection has no executemany of its own)
        rows = []
        for i in range(servers):
            spec = ServerIn(name=f"s{i}", url=f"https://mcp{i}.example.com/mcp")
            rows.append((spec.name, spec.model_dump_json(), now, now))
        cur.executemany(database.sql("INSERT INTO servers (name, spec, created_at, "
                                      "updated_at) VALUES (?, ?, ?, ?)"), rows)
        cur.executemany(database.sql(
            "INSERT INTO api_keys (id, name, secret_sha256, endpoints, role, created_at, "
            "expires_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
            [(f"k{i:09d}", f"key {i}", secrets.token_hex(32), f'["s{i % servers}"]', "",
              now - i, None, None) for i in range(keys)])
    # a week of records, a tenth of them in the last day, in time order (ids rising with ts),
    # as the gateway's writer appends them: a period is then a run of neighbouring rows
    times = sorted(now - (rng.random() * 86400 if i % 10 == 0 else rng.random() * 7 * 86400)
                   for i in range(audit))
    batch = 50_000
    for start in range(0, audit, batch):
        rows = []
        for i in range(start, min(audit, start + batch)):
            status = rng.choice(STATUSES)
            ts = times[i]
            rows.append((ts, str(i), f"user{i % 300}", f"s{i % servers}", "tools/call",
                         rng.choice(TOOLS), status,
                         "access: tool hidden" if status == "denied" else None,
                         "upstream failed" if status == "error" else None,
                         rng.expovariate(1 / 40), 200, 800, "legacy"))
        with database.transaction() as conn:
            conn.cursor().executemany(database.sql(
                "INSERT INTO audit (ts, request_id, principal, endpoint, method, tool, status, "
                "denied_reason, error_message, duration_ms, bytes_in, bytes_out, era) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"), rows)
        print(f"  audit: {min(audit, start + batch):,} records", file=sys.stderr, flush=True)
    began = time.perf_counter()
    with database.transaction() as conn:  # what the writer would have added up: migration 20's
        rollup.backfill(conn, database.dialect)
    print(f"  rollups filled in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    if database.dialect == "postgresql":
        with database.transaction() as conn:
            conn.execute("ANALYZE")
    Accounts(url).create_local("admin", "bench-password-1", admin=True)
    database.close()


async def measure(url: str, runs: int, pages: tuple[str, ...] = PAGES, cold: bool = False
                  ) -> list[tuple[str, int, float, float, float]]:
    public = "http://console.bench"
    cfg = from_dict({"server": {"public_url": public}, "auth": {"mode": "none"},
                     "database": {"url": url}, "observability": {"metrics": False},
                     "upstreams": [{"name": "cfgd", "url": "https://cfgd.example.com/mcp"}]},
                    env={})
    app = create_app(cfg)
    out = []
    async with app.test_app():
        client = app.test_client()
        signed = await client.post("/signin", form={"name": "admin",
                                                    "password": "bench-password-1"},
                                   headers={"Origin": public})
        assert signed.status_code == 303, signed.status_code
        for path in pages:
            times, size = [], 0
            for _ in range(runs):
                if cold:
                    app.extensions["tollhouse"].api.aggregates.clear()
                began = time.perf_counter()
                response = await client.get(path)
                body = await response.get_data()
                times.append((time.perf_counter() - began) * 1000)
                assert response.status_code == 200, (path, response.status_code, body[:300])
                size = len(body)
            first = times[0]  # the aggregates' cache (15 s) is cold for it
            times.sort()
            out.append((path, size, first, statistics.median(times),
                        times[max(0, int(len(times) * 0.95) - 1)]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="a database URL (default: a new SQLite "
                        "file); it must be empty: it is seeded")
    parser.add_argument("--audit", type=int, default=1_000_000)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--reuse", action="store_true", help="measure the database --db "
                        "names as an earlier run seeded it (no seeding)")
    parser.add_argument("--pages", default="", help="comma-separated words: only the pages "
                        "whose path holds one (default: every page)")
    parser.add_argument("--cold", action="store_true", help="empty the aggregate cache "
                        "before every render: every render a first one")
    parser.add_argument("--shift", type=float, default=0.0, help="hours to move the clock "
                        "on by while measuring (with --reuse)")
    args = parser.parse_args()
    if args.reuse and not args.db:
        parser.error("--reuse needs --db")
    url = args.db or f"sqlite:///{tempfile.mkdtemp(prefix='tollhouse-console-')}/c.db"
    began = time.perf_counter()
    if not args.reuse:
        seed(url, args.audit, args.servers, args.keys)
        print(f"seeded in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    began = time.perf_counter()
    with Database(url) as database:  # any migration this checkout adds, timed
        database.ensure_schema()
    print(f"schema up to date in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    if args.shift:
        real = time.time
        time.time = lambda: real() + args.shift * 3600  # (every module's time.time())
    words = [w for w in args.pages.split(",") if w]
    pages = tuple(p for p in PAGES if not words or any(w in p for w in words))
    rows: list[Any] = asyncio.run(measure(url, args.runs, pages, args.cold))
    print(f"\n{args.audit:,} audit records, {args.servers} servers, {args.keys:,} keys; "
          f"{args.runs} renders per page{', the aggregate cache cold for each' * args.cold}\n")
    print("| page | HTML | first ms | p50 ms | p95 ms |\n|---|---:|---:|---:|---:|")
    for path, size, first, p50, p95 in rows:
        print(f"| `{path}` | {size / 1024:.1f} KB | {first:.1f} | {p50:.1f} | {p95:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

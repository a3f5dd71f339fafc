"""CPU per call by thread under load: the event loop (the gateway's main thread) against every
other thread (the audit writer, its checkpointer, the outbox worker), for request paths of
`paths.py` each with extra `[database]` keys, side by side in interleaved runs. A report, not a
test (bench/README.md, "Every policy on: the commit window and the writer's threads").

    .venv/bin/python bench/threads.py --concurrency 64 --rounds 5 \\
        'off20=auth-off:audit_commit_window_ms = 20' \\
        'all20=all-policies:audit_commit_window_ms = 20' \\
        'off100=auth-off' 'all100=all-policies'

Each VARIANT is `name=path[:database lines]` (lines separated by `;`). Per-thread CPU is read
from /proc before and after each wrk run and divided by the calls it made; the figures are
medians over the rounds. Python's threads carry no OS name here, so the split is the main
thread against the rest. The main thread's context switches a call (voluntary: it waited, for
the GIL or for I/O; involuntary: the kernel took the CPU from it) come from the same /proc
reads: a helper thread that takes the GIL back after each C call shows as more of them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import paths
from loadgen import run_wrk
from procs import Processes, Server
from spy import thread_cpu

PYTHON = sys.executable


def parse_variant(text: str) -> tuple[str, paths.Path_, str]:
    name, sep, rest = text.partition("=")
    path, _, extra = rest.partition(":")
    if not sep or not name or path not in paths.PATHS:
        raise SystemExit(f"variant {text!r}: name=path[:database lines], path one of "
                         f"{', '.join(sorted(paths.PATHS))}")
    return name, paths.PATHS[path], extra.replace(";", "\n")


def switches(pid: int) -> tuple[int, int]:
    """The main thread's voluntary and involuntary context switches so far."""
    counts = {}
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.endswith("ctxt_switches"):
            counts[key] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def start(procs: Processes, name: str, path: paths.Path_, extra: str, exe: str, tmp: Path,
          stub_port: int) -> Server:
    """The path's server, its config's [database] table with `extra` added."""
    own = tmp / name
    own.mkdir()
    server = paths.start(procs, path, exe, own, stub_port, prefix=name, database=extra)
    if isinstance(server, str):
        raise SystemExit(server)
    return server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="VARIANT")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=6, help="seconds of load a run")
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"))
    args = p.parse_args()
    if not 1 <= args.duration <= 60 or not 1 <= args.rounds <= 20 or not 1 <= args.concurrency <= 512:
        p.error("--duration 1..60, --rounds 1..20, --concurrency 1..512")
    variants = [parse_variant(v) for v in args.variants]
    with tempfile.TemporaryDirectory(prefix="tollhouse-threads-") as tmp:
        procs = Processes(Path(tmp))
        try:
            stub = procs.start_stub()
            servers = {name: start(procs, name, path, extra, args.tollhouse, Path(tmp), stub.port)
                       for name, path, extra in variants}
            for server in servers.values():  # warm up
                run_wrk(server.url, args.concurrency, 2, headers=server.headers, body=server.body)
            runs: dict[str, list[tuple[float, ...]]] = {name: [] for name in servers}
            for r in range(args.rounds):
                for name, server in servers.items():
                    pid = server.proc.pid
                    before, vol0, invol0 = thread_cpu(pid), *switches(pid)
                    done = run_wrk(server.url, args.concurrency, args.duration,
                                   headers=server.headers, body=server.body)
                    after, vol1, invol1 = thread_cpu(pid), *switches(pid)
                    calls = max(done.requests, 1)
                    main_us = (after.get(pid, 0.0) - before.get(pid, 0.0)) / calls * 1e6
                    rest_us = sum(after[t] - before.get(t, 0.0) for t in after if t != pid) / calls * 1e6
                    vol, invol = (vol1 - vol0) / calls, (invol1 - invol0) / calls
                    runs[name].append((done.requests / args.duration, main_us, rest_us, vol, invol))
                    print(f"round {r + 1}/{args.rounds} {name}: {done.requests / args.duration:.0f} "
                          f"req/s, main {main_us:.0f} us/call, other threads {rest_us:.0f}, main's "
                          f"switches a call {vol:.2f} + {invol:.2f}", flush=True)
        finally:
            procs.stop_all()
    print("\n| variant | c | req/s | main thread us/call | other threads us/call "
          "| main's switches a call (voluntary + involuntary) |\n|---|---:|---:|---:|---:|---:|")
    for name, rows in runs.items():
        rate, main_us, rest_us, vol, invol = (statistics.median(col)
                                              for col in zip(*rows, strict=True))
        print(f"| {name} | {args.concurrency} | {rate:,.0f} | {main_us:.0f} | {rest_us:.0f} "
              f"| {vol:.2f} + {invol:.2f} |")


if __name__ == "__main__":
    main()

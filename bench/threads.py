"""CPU per call by thread under load: the event loop (the gateway's main thread) against every
other thread (the audit writer, its checkpointer, the outbox worker), for request paths of
`paths.py` each with extra `[database]` keys, side by side in interleaved runs. A report, not a
test (bench/README.md, "Every policy on: the commit window and the writer's threads").

    .venv/bin/python bench/threads.py --concurrency 64 --rounds 5 \\
        'off20=auth-off:audit_commit_window_ms = 20' \\
        'all20=all-policies:audit_commit_window_ms = 20' \\
        'off100=auth-off' 'all100=all-policies'

Each VARIANT is `name=path[:lines]` (lines separated by `;`: lines of the [database] table, or
of [server] when they start with `server.`, as in `'old=all-policies:server.gc_threshold = 700;
server.gc_sweep_s = 0'`). Per-thread CPU is read
from /proc before and after each wrk run and divided by the calls it made; the figures are
medians over the rounds. Python's threads carry no OS name here, so the split is the main
thread against the rest. `--gc` runs each gateway under bench/gcstats.py and adds what the
cycle collector did a call (its CPU, the objects it walked, its collections by generation a
run); that launcher's own reads cost CPU on the main thread too. The main thread's context
switches a call (voluntary: it waited, for the GIL or for I/O; involuntary: the kernel took the
CPU from it) and its system time (what the kernel did for it: sockets, epoll) come from the
same /proc reads: a helper thread that takes the GIL back after each C call shows as more
switches.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import cpu
import paths
from loadgen import run_wrk
from procs import Processes, Server
from spy import thread_cpu

PYTHON = sys.executable


def parse_variant(text: str) -> tuple[str, paths.Path_, str, str]:
    """name, path, [database] lines, [server] lines."""
    name, sep, rest = text.partition("=")
    path, _, extra = rest.partition(":")
    if not sep or not name or path not in paths.PATHS:
        raise SystemExit(f"variant {text!r}: name=path[:lines], path one of "
                         f"{', '.join(sorted(paths.PATHS))}")
    lines = [line.strip() for line in extra.split(";") if line.strip()]
    server = [line.removeprefix("server.") for line in lines if line.startswith("server.")]
    database = [line for line in lines if not line.startswith("server.")]
    return name, paths.PATHS[path], "\n".join(database), "\n".join(server)


def gc_totals(pid: int, stats_dir: Path) -> dict[str, list[float]]:
    """bench/gcstats.py's running totals in the gateway `pid`, asked for with SIGUSR1."""
    target = stats_dir / f"{pid}.json"
    target.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not target.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"gateway {pid} wrote no collector totals (is it under gcstats.py?)")
        time.sleep(0.01)  # (polling a file another process writes, to a deadline)
    totals: dict[str, list[float]] = json.loads(target.read_text())
    return totals


def switches(pid: int) -> tuple[int, int]:
    """The main thread's voluntary and involuntary context switches so far."""
    counts = {}
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.endswith("ctxt_switches"):
            counts[key] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def start(procs: Processes, name: str, path: paths.Path_, database: str, server_lines: str,
          exe: str, tmp: Path, stub_port: int, watch_gc: bool) -> Server:
    """The path's server, its config's [database] and [server] tables with those lines
    added; under bench/gcstats.py with `watch_gc`."""
    own = tmp / name
    own.mkdir()
    launcher = (PYTHON, str(BENCH_DIR / "gcstats.py")) if watch_gc else ()
    server = paths.start(procs, path, exe, own, stub_port, prefix=name, database=database,
                         server_lines=server_lines, launcher=launcher)
    if isinstance(server, str):
        raise SystemExit(server)
    return server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="VARIANT")
    p.add_argument("--concurrency", type=lambda v: [int(c) for c in v.split(",")], default=[16],
                   help="one or more (16,64): each round runs every variant at each")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=6, help="seconds of load a run")
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"))
    p.add_argument("--gc", action="store_true",
                   help="run the gateways under bench/gcstats.py: what the collector did a call")
    args = p.parse_args()
    if (not 1 <= args.duration <= 60 or not 1 <= args.rounds <= 20
            or not all(1 <= c <= 512 for c in args.concurrency)):
        p.error("--duration 1..60, --rounds 1..20, --concurrency 1..512")
    variants = [parse_variant(v) for v in args.variants]
    with tempfile.TemporaryDirectory(prefix="tollhouse-threads-") as tmp:
        os.environ["GCSTATS_DIR"] = tmp  # the gateways' environment: where gcstats.py writes
        procs = Processes(Path(tmp))
        try:
            stub = procs.start_stub()
            servers = {name: start(procs, name, path, database, server_lines, args.tollhouse,
                                   Path(tmp), stub.port, args.gc)
                       for name, path, database, server_lines in variants}
            for server in servers.values():  # warm up
                run_wrk(server.url, max(args.concurrency), 2, headers=server.headers,
                        body=server.body)
            runs: dict[tuple[str, int], list[tuple[float, ...]]] = {
                (name, c): [] for c in args.concurrency for name in servers}
            for r in range(args.rounds):
                for (name, c), server in ((key, servers[key[0]]) for key in runs):
                    pid = server.proc.pid
                    gc0 = gc_totals(pid, Path(tmp)) if args.gc else None
                    before, vol0, invol0, sys0 = thread_cpu(pid), *switches(pid), cpu.thread_kernel_s(pid)
                    done = run_wrk(server.url, c, args.duration,
                                   headers=server.headers, body=server.body)
                    after, vol1, invol1, sys1 = thread_cpu(pid), *switches(pid), cpu.thread_kernel_s(pid)
                    calls = max(done.requests, 1)
                    gc_cols: tuple[float, ...] = ()
                    if gc0 is not None:
                        gc1 = gc_totals(pid, Path(tmp))
                        gc_cols = (sum(gc1["cpu_s"]) - sum(gc0["cpu_s"])) / calls * 1e6, \
                            (sum(gc1["walked"]) - sum(gc0["walked"])) / calls, \
                            *(gc1["collections"][g] - gc0["collections"][g] for g in range(3))
                    main_us = (after.get(pid, 0.0) - before.get(pid, 0.0)) / calls * 1e6
                    rest_us = sum(after[t] - before.get(t, 0.0) for t in after if t != pid) / calls * 1e6
                    vol, invol = (vol1 - vol0) / calls, (invol1 - invol0) / calls
                    sys_us = (sys1 - sys0) / calls * 1e6
                    runs[name, c].append((done.requests / args.duration, main_us, sys_us, rest_us,
                                          vol, invol, *gc_cols))
                    print(f"round {r + 1}/{args.rounds} {name} c={c}: {done.requests / args.duration:.0f} "
                          f"req/s, main {main_us:.0f} us/call (kernel {sys_us:.0f}), other "
                          f"threads {rest_us:.0f}, main's "
                          f"switches a call {vol:.2f} + {invol:.2f}", flush=True)
        finally:
            procs.stop_all()
    gc_head = (" | collector us/call | objects walked a call | collections a run (gen 0 / 1 / 2)"
               if args.gc else "")
    print(f"\n| variant | c | req/s | main thread us/call | of which kernel | other threads us/call "
          f"| main's switches a call (voluntary + involuntary){gc_head} |\n"
          f"|---|---:|---:|---:|---:|---:|---:{'|---:|---:|---:' if args.gc else ''}|")
    for (name, c), rows in runs.items():
        medians = [statistics.median(col) for col in zip(*rows, strict=True)]
        rate, main_us, sys_us, rest_us, vol, invol = medians[:6]
        gc_text = (f" | {medians[6]:.1f} | {medians[7]:.0f} | "
                   f"{medians[8]:.0f} / {medians[9]:.0f} / {medians[10]:.0f}") if args.gc else ""
        print(f"| {name} | {c} | {rate:,.0f} | {main_us:.0f} | {sys_us:.0f} | {rest_us:.0f} "
              f"| {vol:.2f} + {invol:.2f}{gc_text} |")

if __name__ == "__main__":
    main()

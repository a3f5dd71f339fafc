"""Instructions a call under load, counted by callgrind: a figure that does not move with the
machine's noise, for one request path of `paths.py` under wrk at one concurrency.

    .venv/bin/python bench/instructions.py auth-off --concurrency 64 \\
        --server 'gc_threshold = 700; gc_sweep_s = 0'

starts the stub (CPU 0) and the gateway under `valgrind --tool=callgrind` (CPU 1), warms it
up for 10 s, waits until it is idle, zeroes the counters, drives it with wrk for `--duration`
seconds, waits until the calls wrk left in flight are answered, dumps, and prints the
instructions the gateway's process executed (every thread, C and Python alike) divided by the
`tools/call` answers it counted meanwhile (its /metrics). wrk's own count leaves out the calls
in flight when it stops (up to one a connection), whose work the dump holds: at valgrind's
pace (some 1,100-1,300 calls in 30 s) it was 1.5 % short at c=16 and 5-6 % at c=64, which made
a call at c=64 look 4 % dearer than at c=16 when it was not. Under valgrind the gateway runs some 30-50 times slower, so
anything timed runs that much more often a call: scale such settings (`gc_sweep_s` 1 -> 30)
to compare like with like. Cache misses are not counted. Needs valgrind (`apt-get install -y
valgrind`); a start takes about a minute. A report tool, not a test.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import cpu
import paths
from loadgen import run_wrk
from procs import Processes

CALLS_SERVED = re.compile(
    r'^mcp_server_operation_duration_seconds_count\{[^}]*mcp_method_name="tools/call"[^}]*\}'
    r'\s+([0-9.e+]+)$', re.MULTILINE)


def calls_served(port: int) -> int:
    """The `tools/call` answers the gateway has counted (its /metrics, on loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as resp:
        text = resp.read().decode()
    return int(sum(float(v) for v in CALLS_SERVED.findall(text)))


def wait_idle(pid: int, deadline_s: float = 300.0) -> None:
    """Until the process uses under a tenth of a CPU over half a second: the calls wrk left in
    flight when it stopped (up to one per connection) have been answered."""
    if not cpu.wait_quiet([pid], deadline_s, window_s=0.5, busy_s=0.05):
        raise SystemExit(f"the gateway was still busy {deadline_s:g} s after the load stopped")


def measured_dump(outdir: Path, deadline_s: float = 60.0) -> tuple[Path, dict[str, int]]:
    """The dump named `measured` and its totals by event (`Ir`, and with the cache simulation
    `D1mr`, `DLmr`...), once callgrind has written it."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for dump in outdir.glob("callgrind.out.*"):
            text = dump.read_text(errors="replace")
            if re.search(r"^desc: Trigger: .*measured", text, re.MULTILINE):
                events = re.search(r"^events:\s+(.+)$", text, re.MULTILINE)
                found = re.search(r"^(?:summary|totals):\s+([\d ]+)$", text, re.MULTILINE)
                if events and found:
                    return dump, dict(zip(events.group(1).split(),
                                          map(int, found.group(1).split()), strict=False))
        time.sleep(0.2)  # (callgrind writes the dump file on its own schedule)
    raise SystemExit("callgrind wrote no dump named 'measured'")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", choices=sorted(paths.PATHS))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=int, default=30, help="seconds of measured load")
    p.add_argument("--server", default="", help="more lines of [server], separated by ';'")
    p.add_argument("--keep", type=Path, metavar="FILE",
                   help="copy the measured dump here (for callgrind_annotate)")
    p.add_argument("--cache-sim", action="store_true",
                   help="also simulate the caches: first-level and last-level misses a call "
                        "(about twice as slow again)")
    args = p.parse_args()
    for tool in ("valgrind", "callgrind_control", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install -y valgrind util-linux)")
    path = paths.PATHS[args.path]
    server_lines = "\n".join(line.strip() for line in args.server.split(";") if line.strip())
    with tempfile.TemporaryDirectory(prefix="tollhouse-instructions-") as tmp:
        own = Path(tmp)
        procs = Processes(own)
        try:
            stub = procs.start_stub(cpus={0})
            launcher = ("taskset", "-c", "1", "valgrind", "--tool=callgrind", "--dump-instr=no",
                        f"--cache-sim={'yes' if args.cache_sim else 'no'}",
                        f"--callgrind-out-file={own}/callgrind.out.%p", sys.executable, "-m",
                        "proxy")
            server = paths.start(procs, path, sys.executable, own, stub.port,
                                 prefix="callgrind", server_lines=server_lines,
                                 launcher=launcher, ready_s=600)
            if isinstance(server, str):
                raise SystemExit(server)
            run_wrk(server.url, args.concurrency, 10, cpus={0}, headers=server.headers,
                    body=server.body)
            wait_idle(server.proc.pid)
            before = calls_served(server.port)
            pid = str(server.proc.pid)
            subprocess.run(["callgrind_control", "--zero", pid], check=True,
                           capture_output=True)
            done = run_wrk(server.url, args.concurrency, args.duration, cpus={0},
                           headers=server.headers, body=server.body)
            wait_idle(server.proc.pid)
            subprocess.run(["callgrind_control", "--dump=measured", pid], check=True,
                           capture_output=True)
            calls = calls_served(server.port) - before
            dump, totals = measured_dump(own)
            if args.keep:
                shutil.copyfile(dump, args.keep)
        finally:
            procs.stop_all()
    per_call = max(calls, 1)
    misses = ""
    if "D1mr" in totals:
        d1 = totals["D1mr"] + totals.get("D1mw", 0)
        ll = totals.get("DLmr", 0) + totals.get("DLmw", 0)
        misses = (f", {d1 / per_call:,.0f} first-level and {ll / per_call:,.0f} last-level "
                  f"data misses a call")
    print(f"{args.path} c={args.concurrency} [server] {server_lines.replace(chr(10), '; ') or '-'}: "
          f"{calls} calls answered ({done.requests} by wrk's count), "
          f"{totals['Ir'] / per_call:,.0f} instructions a call{misses}")

if __name__ == "__main__":
    main()

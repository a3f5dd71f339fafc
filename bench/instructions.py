"""Instructions a call under load, counted by callgrind: a figure that does not move with the
machine's noise, for one request path of `paths.py` under wrk at one concurrency.

    .venv/bin/python bench/instructions.py auth-off --concurrency 64 \\
        --server 'gc_threshold = 700; gc_sweep_s = 0'

starts the stub (CPU 0) and the gateway under `valgrind --tool=callgrind` (CPU 1), warms it
up for 10 s, zeroes the counters, drives it with wrk for `--duration` seconds, dumps, and
prints the instructions the gateway's process executed (every thread, C and Python alike)
divided by the calls answered. Under valgrind the gateway runs some 30-50 times slower, so
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
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import paths
from loadgen import run_wrk
from procs import Processes


def measured_total(outdir: Path, deadline_s: float = 60.0) -> int:
    """The instructions of the dump named `measured`, once callgrind has written it."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for dump in outdir.glob("callgrind.out.*"):
            text = dump.read_text(errors="replace")
            if re.search(r"^desc: Trigger: .*measured", text, re.MULTILINE):
                found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
                if found:
                    return int(found.group(1))
        time.sleep(0.2)  # (callgrind writes the dump file on its own schedule)
    raise SystemExit("callgrind wrote no dump named 'measured'")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", choices=sorted(paths.PATHS))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=int, default=30, help="seconds of measured load")
    p.add_argument("--server", default="", help="more lines of [server], separated by ';'")
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
                        f"--callgrind-out-file={own}/callgrind.out.%p", sys.executable, "-m",
                        "proxy")
            server = paths.start(procs, path, sys.executable, own, stub.port,
                                 prefix="callgrind", server_lines=server_lines,
                                 launcher=launcher, ready_s=600)
            if isinstance(server, str):
                raise SystemExit(server)
            run_wrk(server.url, args.concurrency, 10, cpus={0}, headers=server.headers,
                    body=server.body)
            pid = str(server.proc.pid)
            subprocess.run(["callgrind_control", "--zero", pid], check=True,
                           capture_output=True)
            done = run_wrk(server.url, args.concurrency, args.duration, cpus={0},
                           headers=server.headers, body=server.body)
            subprocess.run(["callgrind_control", "--dump=measured", pid], check=True,
                           capture_output=True)
            total = measured_total(own)
        finally:
            procs.stop_all()
    calls = max(done.requests, 1)
    print(f"{args.path} c={args.concurrency} [server] {server_lines.replace(chr(10), '; ') or '-'}: "
          f"{done.requests} calls, {total / calls:,.0f} instructions a call")


if __name__ == "__main__":
    main()

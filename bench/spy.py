"""Profile one Tollhouse request path under load: py-spy samples the gateway (all its threads)
while wrk drives `tools/call` at one concurrency. A report, not a test.

    .venv/bin/python bench/spy.py --path all-policies --concurrency 16 --duration 20

prints py-spy's top functions (own and total) and the share of samples by thread (the event
loop against the audit writer and the other threads), and writes the raw profile (speedscope
JSON, `--output`) for a closer look at https://www.speedscope.app or `py-spy`'s own viewer.
`--gil` samples only the thread holding the GIL: the share by thread then says whom the event
loop waits for (a thread in a C call that let the GIL go, or waiting for it, is not counted).
Needs `py-spy` (installed with the `bench` extra) and wrk; py-spy attaches with ptrace, which
needs root or `kernel.yama.ptrace_scope = 0`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import paths
from loadgen import WrkResult, run_wrk
from procs import Processes

PYTHON = sys.executable


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--path", default="all-policies", choices=sorted(paths.PATHS))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=int, default=20, help="seconds of load (and of sampling)")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=40, help="functions to list")
    p.add_argument("--gil", action="store_true",
                   help="sample only the thread holding the GIL (py-spy --gil): which thread "
                        "the others wait for, not which is busy or waiting")
    p.add_argument("--output", type=Path, default=Path("build/profile.speedscope.json"))
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"))
    args = p.parse_args()
    if not 1 <= args.duration <= 300 or not 1 <= args.concurrency <= 512:
        p.error("--duration must be 1..300 and --concurrency 1..512")
    return args


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return found


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of each thread of pid, by thread id, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_names(profile: dict[str, Any]) -> dict[int, str]:
    """py-spy's profile names ('Thread 123 "name"') by thread id."""
    out = {}
    for prof in profile["profiles"]:
        parts = prof.get("name", "").split(" ", 2)
        if len(parts) >= 2 and parts[1].isdigit():
            out[int(parts[1])] = parts[2] if len(parts) > 2 else parts[1]
    return out


def summarize(profile: dict[str, Any], top: int, requests: int) -> str:
    """Own and total sampled time per function, and per thread, from speedscope JSON (py-spy
    weighs each sample by its interval, in seconds): as a share of every active sample and as
    microseconds per request answered, so two paths' profiles compare line by line."""
    frames = profile["shared"]["frames"]
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    count = 0.0
    for prof in profile["profiles"]:
        name = prof.get("name", "?")
        for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
            count += weight
            threads[name] += weight
            if not stack:
                continue
            labels = [f"{frames[i]['name']} ({Path(frames[i].get('file', '?')).name}:{frames[i].get('line', 0)})"
                      for i in stack]
            own[labels[-1]] += weight
            for label in set(labels):
                total[label] += weight

    def line(n: float, label: str) -> str:
        return f"{n / count:6.1%} {n / requests * 1e6:8.1f} us/req  {label}"

    head = (f"{count:.2f} s of active samples (idle threads are not sampled), {requests} requests, "
            f"{count / requests * 1e6:.1f} us of active time a request")
    out = [head, "", "## by thread"]
    out += [line(n, name) for name, n in threads.most_common()]
    out += ["", "## own time"]
    out += [line(n, label) for label, n in own.most_common(top)]
    out += ["", "## total time"]
    out += [line(n, label) for label, n in total.most_common(top)]
    return "\n".join(out)


def main() -> None:
    args = parse_args()
    spy = py_spy()
    path = paths.PATHS[args.path]
    with tempfile.TemporaryDirectory(prefix="tollhouse-profile-") as tmp:
        procs = Processes(Path(tmp))
        try:
            stub = procs.start_stub()
            server = paths.start(procs, path, args.tollhouse, Path(tmp), stub.port)
            if isinstance(server, str):
                raise SystemExit(server)
            run_wrk(server.url, args.concurrency, 3, headers=server.headers, body=server.body)  # warm up
            args.output.parent.mkdir(parents=True, exist_ok=True)
            spy_cmd = [spy, "record", "--pid", str(server.proc.pid), "--rate", str(args.rate),
                       "--duration", str(args.duration), "--format", "speedscope", "--threads",
                       "--nonblocking", "--output", str(args.output), *(["--gil"] if args.gil else [])]
            before = thread_cpu(server.proc.pid)
            recorder = subprocess.Popen(spy_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            result: list[WrkResult] = []
            load = threading.Thread(target=lambda: result.append(
                run_wrk(server.url, args.concurrency, args.duration, headers=server.headers,
                        body=server.body)))
            load.start()
            load.join()
            after = thread_cpu(server.proc.pid)
            _, err = recorder.communicate(timeout=args.duration + 60)
            if recorder.returncode != 0:
                raise SystemExit(f"py-spy failed ({recorder.returncode}): {err.decode(errors='replace')}")
            done = result[0]
            print(f"# {server.name} at c={args.concurrency} for {args.duration} s: {done.requests} "
                  f"requests, p50 {done.p50_ms} ms, p99 {done.p99_ms} ms, {done.errors} errors")
            calls = max(done.requests, 1)
            profile = json.loads(args.output.read_text())
            names = thread_names(profile)
            print("## CPU by thread (/proc utime + stime over the run)")
            for tid in sorted(after, key=lambda t: before.get(t, 0.0) - after[t]):
                spent = after[tid] - before.get(tid, 0.0)
                if spent > 0:
                    print(f"{spent / calls * 1e6:8.1f} us/req  {names.get(tid, tid)}")
            print(summarize(profile, args.top, calls))
        finally:
            procs.stop_all()


if __name__ == "__main__":
    main()

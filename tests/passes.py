"""`make test`: the whole suite once per database and live-state backend, `--jobs` passes at a
time.

Each pass is `python -m pytest` with TOLLHOUSE_TEST_DATABASE and TOLLHOUSE_TEST_STATE set; every
test takes a fresh database, key prefix and free port of its own, so passes may run side by
side (on two cores, two at a time finish the four passes in about two thirds of the time one
at a time takes: much of a pass waits on subprocesses and sockets). A pass's output goes to
`build/test-logs/<database>-<state>.log` and is printed whole, in the matrix's order, once the
pass has ended (with one job, as it runs); the last lines are a summary, one per pass, and the exit status is the first
failing pass's (0 when all passed).

    python tests/passes.py --databases sqlite postgresql --states memory redis --jobs 2 -- -x
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "build" / "test-logs"


def run_pass(database: str, state: str, pytest_args: list[str], stream: bool
             ) -> tuple[str, int, float, Path]:
    name = f"{database}-{state}"
    log = LOGS / f"{name}.log"
    env = {**os.environ, "TOLLHOUSE_TEST_DATABASE": database, "TOLLHOUSE_TEST_STATE": state}
    # the slowest tests of each pass in its log, and every test's time in its JUnit XML
    # (build/test-logs/<database>-<state>.xml): where the time of a pass near CI's 30-minute
    # bound goes (a later --durations in pytest_args wins)
    cmd = [sys.executable, "-m", "pytest", "--durations=25",
           f"--junitxml={LOGS / f'{name}.xml'}", *pytest_args]
    began = time.monotonic()
    print(f"== the test suite on {database}, {state} state", flush=True)
    if stream:
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
                out.write(line)
            code = proc.wait()
    else:
        with log.open("wb") as out:
            code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  check=False).returncode
    return name, code, time.monotonic() - began, log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--states", nargs="+", default=["memory", "redis"])
    parser.add_argument("--jobs", type=int, default=2, help="passes at a time (default 2)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every pytest")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    LOGS.mkdir(parents=True, exist_ok=True)
    passes = [(d, s) for d in args.databases for s in args.states]
    jobs = min(args.jobs, len(passes))
    results = []
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_pass, d, s, args.pytest_args, jobs == 1) for d, s in passes]
        for future in futures:  # in the matrix's order, each printed once it is done
            name, code, took, log = future.result()
            if jobs > 1:
                print(f"== output of the {name} pass ({log})", flush=True)
                sys.stdout.buffer.write(log.read_bytes())
                sys.stdout.flush()
            results.append((name, code, took))
    print("== summary", flush=True)
    for name, code, took in results:
        tail = _last_line(LOGS / f"{name}.log")
        print(f"   {name:<20} {'ok    ' if code == 0 else f'FAILED (exit {code})'} "
              f"{took:6.0f} s  {tail}")
        if code != 0:  # which tests, here at the end (a CI log may be kept only by its tail)
            for line in _failures(LOGS / f"{name}.log"):
                print(f"      {line}")
    return next((code for _, code, _ in results if code != 0), 0)


def _failures(log: Path, most: int = 20) -> list[str]:
    """pytest's short summary lines of the tests that failed or errored (`FAILED tests/...`,
    `ERROR tests/...`: setup or teardown), each cut to 200 characters, at most `most`."""
    found = [line[:200] for line in log.read_text(errors="replace").splitlines()
             if line.startswith(("FAILED tests/", "ERROR tests/"))]
    return found[:most] + ([f"... and {len(found) - most} more"] if len(found) > most else [])


def _last_line(log: Path) -> str:
    """pytest's summary line (what a warning printed at exit would otherwise hide)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"\d+ (passed|failed|errors?)\b", line):
            return line.strip("= ")
    return lines[-1].strip("= ") if lines else ""


if __name__ == "__main__":
    sys.exit(main())

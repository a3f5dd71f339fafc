"""Run wrk with bench/tools_call.lua and parse its result line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LUA_SCRIPT = Path(__file__).with_name("tools_call.lua")
MARKER = "BENCH_JSON "


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    errors: int  # socket errors (connect/read/write/timeout) + non-2xx/3xx answers
    cpu_ms: float | None = None  # the target's own processes, CPU ms per call (harness fills it)
    lb_cpu_ms: float | None = None  # the load balancer in front of it, likewise
    redis_cpu_ms: float | None = None  # the Redis server (whoever else uses it meanwhile too)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("wrk not found: run `apt-get install -y wrk`")
    return path


def threads_for(connections: int) -> int:
    return 1 if connections == 1 else 2


# the headers tools_call.lua reads from its environment
HEADER_ENV = {"authorization": "BENCH_AUTHORIZATION", "mcp-session-id": "BENCH_SESSION_ID",
              "mcp-protocol-version": "BENCH_PROTOCOL", "mcp-method": "BENCH_MCP_METHOD",
              "mcp-name": "BENCH_MCP_NAME"}


def run_wrk(url: str, connections: int, duration_s: int, cpus: set[int] | None = None,
            headers: dict[str, str] | None = None, body: bytes | None = None) -> WrkResult:
    """One wrk run against url (127.0.0.1 only); bounded by a subprocess timeout. `headers`
    (those of HEADER_ENV only) go on every request, and `body` is each request's (default:
    the script's tools/call of echo)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"load goes to 127.0.0.1 only, not {url}")
    cmd = [wrk_path(), f"-t{threads_for(connections)}", f"-c{connections}", f"-d{duration_s}s",
           "--timeout", "10s", "--latency", "-s", str(LUA_SCRIPT), url]
    if cpus:
        cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]
    env = {k: v for k, v in os.environ.items() if k not in HEADER_ENV.values() and k != "BENCH_BODY"}
    if body is not None:
        env["BENCH_BODY"] = body.decode()
    for name, value in (headers or {}).items():
        env[HEADER_ENV[name.lower()]] = value  # KeyError: a header the script cannot send
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 30, check=False,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return parse(done.stdout)


def parse(output: str) -> WrkResult:
    for line in output.splitlines():
        if line.startswith(MARKER):
            d = json.loads(line[len(MARKER):])
            errors = sum(d[k] for k in ("connect", "read", "write", "status", "timeout"))
            return WrkResult(d["requests"], d["duration_us"] / 1e6, d["p50_us"] / 1e3, d["p99_us"] / 1e3, errors)
    raise RuntimeError(f"no {MARKER.strip()} line in wrk output:\n{output}")

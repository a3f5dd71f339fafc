"""One-command benchmark: stub vs bare pass-through vs Tollhouse, driven by wrk.

Starts the upstream stub, one bare pass-through per ``--transports`` entry and
Tollhouse (skipped with a note when it is not installed or does not start), all
on free 127.0.0.1 ports; runs wrk at each concurrency for several interleaved
rounds after a warm-up; prints a Markdown table of medians. Every process it
started is killed at the end, also on error or Ctrl-C.

Usage: ``.venv/bin/python bench/run.py [--targets stub,passthrough,tollhouse] [--duration 5] [--rounds 3]``

With ``--state memory,redis``, ``--workers 1,2`` or ``--replicas 1,2`` (see variants.py) the
one Tollhouse target becomes one target per state × workers × replicas, all in the same
interleaved rounds, and the report adds CPU per call and a side-by-side comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import cpu
import paths
import report
import variants
from loadgen import WrkResult, run_wrk
from procs import Processes, Server, free_port, probe, wait_ready
from transports import TRANSPORTS

BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable
DEFAULT_TRANSPORT = "aiohttp-mapped"
TOLLHOUSE_TOML = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
[auth]
mode = "none"
[database]
url = "sqlite:///{tmpdir}/bench.db"
[[upstreams]]
name = "bench"
url = "http://127.0.0.1:{stub_port}/mcp"
"""
METERED_TOML = """\
[metering]
hook = "meter_hook:HOOK"
"""


@dataclass(frozen=True)
class Pinning:
    """CPU sets: the measured server on one core, the stub and wrk on the other."""

    server: set[int] | None = None
    helpers: set[int] | None = None


def csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--targets", type=csv, default=["stub", "passthrough", "tollhouse"],
                   help="comma list of stub, passthrough, tollhouse")
    p.add_argument("--transports", type=csv, default=[DEFAULT_TRANSPORT],
                   help="pass-through transports (see bench/transports.py); the first app × transport "
                        "is the reference")
    p.add_argument("--concurrency", type=lambda v: [int(c) for c in csv(v)], default=[1, 16, 64])
    p.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    p.add_argument("--order", choices=["concurrency", "target"], default="concurrency",
                   help="within a round: every target at one concurrency, then the next (sets "
                        "targets side by side), or each target at every concurrency in a row "
                        "(sets one target's concurrencies side by side)")
    p.add_argument("--warmup", type=int, default=2, help="seconds of warm-up per target (0: none)")
    p.add_argument("--apps", type=csv, default=["quart", "asgi"],
                   help="pass-through apps: quart (a Quart route), asgi (raw ASGI, no Quart); each × each transport")
    p.add_argument("--stream", action="store_true", help="pass-through relays bodies as streams")
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"], help="pass-through event loop")
    p.add_argument("--pin", action="store_true", help="servers under test on CPU 1, stub and wrk on CPU 0")
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"), help="tollhouse executable")
    p.add_argument("--compare", help="a second tollhouse executable (another build), run side by side "
                                     "as `tollhouse-compare`")
    p.add_argument("--state", type=csv, default=[],
                   help="Tollhouse state backends, each its own target: memory, redis")
    p.add_argument("--workers", type=lambda v: [int(c) for c in csv(v)], default=[1],
                   help="Tollhouse `server.workers` values, each its own target (>1: shared state only)")
    p.add_argument("--replicas", type=lambda v: [int(c) for c in csv(v)], default=[],
                   help="also N separate Tollhouse processes behind HAProxy (roundrobin), per shared state")
    p.add_argument("--stateful", action="store_true",
                   help="Tollhouse config with every per-call store on the hot path: JWT caller "
                        "(lockout check), 2025-11-25 session, a rate limit that never refuses")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="Redis for --state redis")
    p.add_argument("--paths", type=csv, default=[],
                   help="Tollhouse targets by request path (bench/paths.py), each its own target "
                        f"set against auth-off: {', '.join(paths.PATHS)}")
    p.add_argument("--metered", action="store_true",
                   help="Tollhouse (and --compare) with the in-process metering hook of "
                        "meter_hook.py: every call authorized, audited and given a usage event")
    p.add_argument("--output", type=Path, help="also write the Markdown report here")
    args = p.parse_args()
    args.variants = bool(args.state or args.replicas or args.workers != [1] or args.stateful)
    args.state = args.state or ["memory"]
    if set(args.state) - {"memory", "redis"}:
        p.error("--state takes memory and/or redis")
    if not all(1 <= w <= 64 for w in args.workers) or not all(1 <= r <= 8 for r in args.replicas):
        p.error("--workers must be 1..64, --replicas 1..8")
    if not args.redis_url.startswith(("redis://127.0.0.1", "redis://localhost")):
        p.error("--redis-url: a loopback redis:// URL only")
    if set(args.paths) - set(paths.PATHS):
        p.error(f"--paths takes {', '.join(paths.PATHS)}")
    if args.paths and args.variants:
        p.error("--paths and --state/--workers/--replicas/--stateful are separate runs")
    unknown = set(args.targets) - {"stub", "passthrough", "tollhouse"}
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if set(args.apps) - {"quart", "asgi"} or not args.apps:
        p.error("--apps takes quart and/or asgi")
    bad = set(args.transports) - set(TRANSPORTS)
    if bad:
        p.error(f"unknown transports: {', '.join(sorted(bad))}; choose from {', '.join(TRANSPORTS)}")
    if args.pin and (os.cpu_count() or 1) < 2:
        p.error("--pin needs at least 2 CPUs")
    if not 1 <= args.rounds <= 50 or not 1 <= args.duration <= 300 or not 0 <= args.warmup <= 60:
        p.error("--rounds must be 1..50 and --duration 1..300, --warmup 0..60")
    return args


def passthrough_name(app: str, transport: str) -> str:
    return f"passthrough[{transport}]" if app == "quart" else f"passthrough-{app}[{transport}]"


def start_passthrough(procs: Processes, stub: Server, app: str, transport: str, args: argparse.Namespace,
                      pin: Pinning) -> Server:
    port = free_port()
    cmd = [PYTHON, str(BENCH_DIR / "passthrough.py"), "--port", str(port), "--upstream", stub.url,
           "--transport", transport, "--loop", args.loop, "--app", app]
    if args.stream:
        cmd.append("--stream")
    server = procs.start(passthrough_name(app, transport), cmd, port, "/mcp/bench", pin.server)
    wait_ready(server)
    return server


def start_tollhouse(procs: Processes, stub: Server, exe: str, tmpdir: Path, pin: Pinning,
                    name: str = "tollhouse", metered: bool = False) -> Server | str:
    """The started Tollhouse, or a note saying why it was skipped."""
    path = shutil.which(exe)
    if path is None:
        return f"{name} skipped: `{exe}` is not installed."
    port = free_port()
    own = tmpdir / name  # each Tollhouse its own config and database
    own.mkdir(exist_ok=True)
    config = own / "tollhouse.toml"
    config.write_text(TOLLHOUSE_TOML.format(port=port, tmpdir=own, stub_port=stub.port)
                      + (METERED_TOML if metered else ""))
    server = procs.start(name, [path, "serve", "--config", str(config)], port, "/mcp/bench", pin.server)
    try:
        wait_ready(server, deadline_s=30.0)
    except RuntimeError as exc:
        procs.stop(server)
        return f"Tollhouse skipped: it did not start. {exc}"
    return server


def check_target(procs: Processes, server: Server) -> str | None:
    """Probe one tools/call; a note (and the server stopped) unless it gets a 2xx JSON-RPC result."""
    try:
        status, body = probe(server.url, headers=server.headers, body=server.body)
    except OSError as exc:
        status, body = 0, str(exc)
    if 200 <= status < 300 and '"result"' in body:
        return None
    procs.stop(server)
    return f"{server.name} skipped: probe POST {server.url} answered {status}: {body[:200]!r}"


def measured_run(server: Server, conns: int, duration_s: int, pin: Pinning, redis_pid: int | None
                 ) -> WrkResult:
    """One wrk run, with the CPU its target's processes (and load balancer, and Redis) spent on
    it, per call: /proc utime + stime read before and after."""
    def sample() -> tuple[float, float, float | None]:
        return (cpu.group_cpu_s(server.cpu_groups), cpu.group_cpu_s(server.lb_groups),
                cpu.pid_cpu_s(redis_pid) if redis_pid else None)

    before = sample()
    res = run_wrk(server.url, conns, duration_s, pin.helpers, server.headers, server.body)
    after = sample()
    if not res.requests:
        return res
    per_call_ms = 1000.0 / res.requests
    redis_ms = (after[2] - before[2]) * per_call_ms if after[2] is not None and before[2] is not None else None
    return dataclasses.replace(res, cpu_ms=(after[0] - before[0]) * per_call_ms,
                               lb_cpu_ms=(after[1] - before[1]) * per_call_ms if server.lb_groups else None,
                               redis_cpu_ms=redis_ms)


def measure(targets: list[Server], args: argparse.Namespace, pin: Pinning, redis_pid: int | None
            ) -> report.Results:
    results: report.Results = {}
    for server in targets if args.warmup else []:
        print(f"warm-up {server.name} ({args.warmup:g} s)", file=sys.stderr)
        run_wrk(server.url, max(args.concurrency), args.warmup, pin.helpers, server.headers,
                server.body)
    for rnd in range(1, args.rounds + 1):
        for server, conns in run_order(targets, args.concurrency, rnd, args.order):
            res = measured_run(server, conns, args.duration, pin, redis_pid)
            results.setdefault((server.name, conns), []).append(res)
            print(f"round {rnd}/{args.rounds} {server.name} c={conns}: {res.rps:.0f} req/s "
                  f"p50 {res.p50_ms:.2f} ms p99 {res.p99_ms:.2f} ms errors {res.errors} "
                  f"cpu {res.cpu_ms or 0:.3f} ms/call", file=sys.stderr)
            settle(server)
    return results


def run_order(targets: list[Server], concurrency: list[int], rnd: int, order: str
              ) -> list[tuple[Server, int]]:
    """The runs of round `rnd` (from 1), in order. The targets' order turns by one each round,
    so that no target always follows the same one.

    `concurrency`: every target at one concurrency, then the next; two targets set side by side
    run seconds apart, not a whole target's sweep apart. `target`: each target at every
    concurrency in a row, so that one target's figures at two concurrencies (how its throughput
    holds as the calls in flight rise) are seconds apart; the concurrencies go up in odd rounds
    and down in even ones, so that neither always runs first."""
    turn = (rnd - 1) % len(targets) if targets else 0
    turned = targets[turn:] + targets[:turn]
    if order == "target":
        levels = concurrency if rnd % 2 else concurrency[::-1]
        return [(server, conns) for server in turned for conns in levels]
    return [(server, conns) for conns in concurrency for server in turned]


def settle(server: Server, deadline_s: float = 3.0) -> None:
    """Until the target's processes are all but idle again (under 15 % of a core over 0.1 s:
    /proc counts in ticks of 10 ms) or `deadline_s`: work a run left behind (an audit batch,
    the usage outbox's backlog) is its own, not the next target's to share the CPU with."""
    cpu.wait_quiet(server.cpu_groups, deadline_s, window_s=0.1, busy_s=0.015)


def start_variants(procs: Processes, stub: Server, args: argparse.Namespace, tmpdir: Path,
                   prefix: str) -> tuple[list[Server], list[tuple[str, str, str]], list[str]]:
    """Every Tollhouse variant of --state × --workers × --replicas; the pairs to set side by
    side; notes for those not run."""
    planned, notes = variants.plan(args.state, args.workers, args.replicas)
    settings = variants.Settings(args.tollhouse, tmpdir, stub.port, args.redis_url, prefix,
                                 args.stateful, secrets.token_hex(32))
    started: list[Server] = []
    for v in planned:
        got = variants.start(procs, v, settings)
        if isinstance(got, str):
            notes.append(got)
        else:
            started.append(got)
    if "redis" in args.state and not args.stateful:
        notes.append("without --stateful no Redis store is on the per-call path (anonymous, "
                     "sessionless, no rate limit): Redis and memory should measure the same")
    return started, comparisons(planned), notes


def comparisons(planned: list[variants.Variant]) -> list[tuple[str, str, str]]:
    """(label, baseline, other): Redis against memory for the same process layout, and each
    multi-process layout against one process (and N replicas against one behind the LB)."""
    names = {v.name for v in planned}
    pairs: list[tuple[str, str, str]] = []
    for v in planned:
        if v.state == "redis":
            mem = dataclasses.replace(v, state="memory").name
            if mem in names:
                pairs.append(("Redis vs memory state", mem, v.name))
    for v in planned:
        single = variants.Variant(v.state).name
        if v.workers > 1 and single in names:
            pairs.append((f"{v.workers} workers vs 1", single, v.name))
        if v.replicas and single in names:
            pairs.append((f"{v.replicas} replica(s) behind HAProxy vs 1 process direct", single, v.name))
        one_lb = variants.Variant(v.state, 1, 1).name
        if v.replicas > 1 and one_lb in names:
            pairs.append((f"{v.replicas} replicas vs 1, both behind HAProxy", one_lb, v.name))
    return pairs


def main() -> None:
    args = parse_args()
    if args.metered:  # the gateways import the hook from here
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pin = Pinning({1}, {0}) if args.pin else Pinning()
    notes: list[str] = []
    prefix = variants.new_prefix()  # every Redis key of this run; deleted at the end
    with tempfile.TemporaryDirectory(prefix="tollhouse-bench-") as tmp:
        tmpdir = Path(tmp)
        procs = Processes(tmpdir)
        try:
            stub = procs.start_stub(pin.helpers)
            targets: list[Server] = [stub] if "stub" in args.targets else []
            apps = [(a, t) for a in args.apps for t in args.transports] if "passthrough" in args.targets else []
            for app, transport in apps:
                try:
                    targets.append(start_passthrough(procs, stub, app, transport, args, pin))
                except RuntimeError as exc:
                    notes.append(f"{passthrough_name(app, transport)} skipped: it did not start. {exc}")
            pairs: list[tuple[str, str, str]] = []
            if "tollhouse" in args.targets and args.paths:
                builds = [("tollhouse", args.tollhouse)]
                if args.compare:  # each path on the other build too, in the same rounds
                    builds.append(("tollhouse-compare", args.compare))
                for name in args.paths:
                    for prefix, exe in builds:
                        got = paths.start(procs, paths.PATHS[name], exe, tmpdir, stub.port,
                                          prefix)
                        if isinstance(got, str):
                            notes.append(got)
                        else:
                            targets.append(got)
                pairs = paths.comparisons([t.name for t in targets])
            elif "tollhouse" in args.targets and args.variants:
                started_variants, pairs, more = start_variants(procs, stub, args, tmpdir, prefix)
                targets += started_variants
                notes += more
            elif "tollhouse" in args.targets:
                started = start_tollhouse(procs, stub, args.tollhouse, tmpdir, pin,
                                          metered=args.metered)
                if isinstance(started, str):
                    notes.append(started)
                else:
                    targets.append(started)
            if args.compare and not args.paths:  # another build, in the same rounds
                started = start_tollhouse(procs, stub, args.compare, tmpdir, pin, "tollhouse-compare",
                                          metered=args.metered)
                if isinstance(started, str):
                    notes.append(started)
                else:
                    targets.append(started)
            for server in list(targets):
                note = check_target(procs, server)
                if note:
                    notes.append(note)
                    targets.remove(server)
            redis_pid = None
            if "redis" in args.state and args.variants:
                redis_pid = cpu.listener_pid(urlsplit(args.redis_url).port or 6379)
                if redis_pid is None:
                    notes.append("the Redis server's process is out of sight: no Redis CPU figures")
            began = time.monotonic()
            results = measure(targets, args, pin, redis_pid)
            ref_name = passthrough_name(args.apps[0], args.transports[0])
            reference = ref_name if ref_name in {s.name for s in targets} else None
            text = report.render(results, [s.name for s in targets], args, reference, notes,
                                 time.monotonic() - began, pairs)
        finally:
            procs.stop_all()
            if args.variants and "redis" in args.state:
                deleted = variants.delete_keys(args.redis_url, prefix)
                print(f"deleted {deleted} Redis keys under {prefix}", file=sys.stderr)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()

"""One-command benchmark: stub vs bare pass-through vs Tollhouse, driven by wrk.

Starts the upstream stub, one bare pass-through per ``--transports`` entry and
Tollhouse (skipped with a note when it is not installed or does not start), all
on free 127.0.0.1 ports; runs wrk at each concurrency for several interleaved
rounds after a warm-up; prints a Markdown table of medians. Every process it
started is killed at the end, also on error or Ctrl-C.

Usage: ``.venv/bin/python bench/run.py [--targets stub,passthrough,tollhouse] [--duration 5] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import report
from loadgen import run_wrk
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
    p.add_argument("--warmup", type=int, default=2, help="seconds of warm-up per target (0: none)")
    p.add_argument("--apps", type=csv, default=["quart", "asgi"],
                   help="pass-through apps: quart (a Quart route), asgi (raw ASGI, no Quart); each × each transport")
    p.add_argument("--stream", action="store_true", help="pass-through relays bodies as streams")
    p.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"], help="pass-through event loop")
    p.add_argument("--pin", action="store_true", help="servers under test on CPU 1, stub and wrk on CPU 0")
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"), help="tollhouse executable")
    p.add_argument("--compare", help="a second tollhouse executable (another build), run side by side "
                                     "as `tollhouse-compare`")
    p.add_argument("--output", type=Path, help="also write the Markdown report here")
    args = p.parse_args()
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


def start_stub(procs: Processes, pin: Pinning) -> Server:
    port = free_port()
    server = procs.start("stub", [PYTHON, str(BENCH_DIR / "stub.py"), "--port", str(port)], port, "/mcp",
                         pin.helpers)
    wait_ready(server)
    return server


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
                    name: str = "tollhouse") -> Server | str:
    """The started Tollhouse, or a note saying why it was skipped."""
    path = shutil.which(exe)
    if path is None:
        return f"{name} skipped: `{exe}` is not installed."
    port = free_port()
    own = tmpdir / name  # each Tollhouse its own config and database
    own.mkdir(exist_ok=True)
    config = own / "tollhouse.toml"
    config.write_text(TOLLHOUSE_TOML.format(port=port, tmpdir=own, stub_port=stub.port))
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
        status, body = probe(server.url)
    except OSError as exc:
        status, body = 0, str(exc)
    if 200 <= status < 300 and '"result"' in body:
        return None
    procs.stop(server)
    return f"{server.name} skipped: probe POST {server.url} answered {status}: {body[:200]!r}"


def measure(targets: list[Server], args: argparse.Namespace, pin: Pinning) -> report.Results:
    results: report.Results = {}
    for server in targets if args.warmup else []:
        print(f"warm-up {server.name} ({args.warmup:g} s)", file=sys.stderr)
        run_wrk(server.url, max(args.concurrency), args.warmup, pin.helpers)
    for rnd in range(1, args.rounds + 1):
        for server in targets:
            for conns in args.concurrency:
                res = run_wrk(server.url, conns, args.duration, pin.helpers)
                results.setdefault((server.name, conns), []).append(res)
                print(f"round {rnd}/{args.rounds} {server.name} c={conns}: {res.rps:.0f} req/s "
                      f"p50 {res.p50_ms:.2f} ms p99 {res.p99_ms:.2f} ms errors {res.errors}", file=sys.stderr)
    return results


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pin = Pinning({1}, {0}) if args.pin else Pinning()
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tollhouse-bench-") as tmp:
        tmpdir = Path(tmp)
        procs = Processes(tmpdir)
        try:
            stub = start_stub(procs, pin)
            targets: list[Server] = [stub] if "stub" in args.targets else []
            variants = [(a, t) for a in args.apps for t in args.transports] if "passthrough" in args.targets else []
            for app, transport in variants:
                try:
                    targets.append(start_passthrough(procs, stub, app, transport, args, pin))
                except RuntimeError as exc:
                    notes.append(f"{passthrough_name(app, transport)} skipped: it did not start. {exc}")
            if "tollhouse" in args.targets:
                started = start_tollhouse(procs, stub, args.tollhouse, tmpdir, pin)
                if isinstance(started, str):
                    notes.append(started)
                else:
                    targets.append(started)
            if args.compare:  # another build, measured in the same interleaved rounds
                started = start_tollhouse(procs, stub, args.compare, tmpdir, pin, "tollhouse-compare")
                if isinstance(started, str):
                    notes.append(started)
                else:
                    targets.append(started)
            for server in list(targets):
                note = check_target(procs, server)
                if note:
                    notes.append(note)
                    targets.remove(server)
            began = time.monotonic()
            results = measure(targets, args, pin)
            ref_name = passthrough_name(args.apps[0], args.transports[0])
            reference = ref_name if ref_name in {s.name for s in targets} else None
            text = report.render(results, [s.name for s in targets], args, reference, notes,
                                 time.monotonic() - began)
        finally:
            procs.stop_all()
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()

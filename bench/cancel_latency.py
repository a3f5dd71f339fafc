"""Cancellation latency across replicas: two Tollhouse processes on one Redis.

Starts bench/hold_upstream.py (a legacy upstream that holds `tools/call hold` open and
timestamps what it is told) and two gateway replicas A and B on direct loopback ports, sharing
one Redis under a fresh key prefix (deleted at the end). One 2025-11-25 session, opened on A.
Each trial, one after another:

1. the client starts `tools/call hold` on A and waits until the upstream holds it;
2. it sends `notifications/cancelled` for that request id to B (`--via other`) or to A itself
   (`--via same`, the one-process baseline), reading `time.monotonic()` just before the send;
3. it reads when B answered its 202 (`ack`), when the upstream received the notice (`notice`:
   the client's send of the cancel POST to the upstream's receipt, an upper bound on "the notice
   reaching a replica -> the upstream told"), when the client got A's -32800 for the call
   (`ended`: the cancel crossed Redis pub/sub to A), and when A dropped its upstream request
   (`closed`).

The issue's target is p99 under 50 ms for `notice`. CLOCK_MONOTONIC is one clock for every
process on the machine, so the upstream's readings and the client's compare directly.

Usage: `.venv/bin/python bench/cancel_latency.py [--trials 200] [--via other,same]`
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import variants
from procs import Processes, Server, free_port, wait_ready

BENCH_DIR = Path(__file__).resolve().parent
PYTHON = sys.executable
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream",
           "mcp-protocol-version": "2025-11-25"}
CONFIG = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
[auth]
mode = "none"
[database]
url = "sqlite:///{tmpdir}/cancel.db"
[state]
url = "{redis_url}"
key_prefix = "{prefix}"
[[upstreams]]
name = "hold"
url = "http://127.0.0.1:{upstream_port}/mcp"
era = "legacy"
total_timeout_s = 60
"""
MOMENTS = ("ack", "notice", "ended", "closed")


@dataclass
class Trial:
    via: str
    ack: float
    notice: float | None
    ended: float
    closed: float | None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--trials", type=int, default=200, help="measured trials per --via (sequential)")
    p.add_argument("--warmup", type=int, default=10, help="trials per --via before measuring")
    p.add_argument("--via", default="other,same",
                   help="where the cancel goes: other (replica B), same (replica A); interleaved")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"))
    p.add_argument("--output", type=Path, help="also write the Markdown report here")
    args = p.parse_args()
    args.via = [v.strip() for v in args.via.split(",") if v.strip()]
    if not args.via or set(args.via) - {"other", "same"}:
        p.error("--via takes other and/or same")
    if not 1 <= args.trials <= 10_000 or not 0 <= args.warmup <= 1000:
        p.error("--trials must be 1..10000, --warmup 0..1000")
    if not args.redis_url.startswith(("redis://127.0.0.1", "redis://localhost")):
        p.error("--redis-url: a loopback redis:// URL only")
    return args


def start(procs: Processes, args: argparse.Namespace, tmpdir: Path, prefix: str
          ) -> tuple[Server, Server, Server]:
    port = free_port()
    upstream = procs.start("hold-upstream", [PYTHON, str(BENCH_DIR / "hold_upstream.py"), "--port", str(port)],
                           port, "/mcp")
    wait_ready(upstream)
    replicas = []
    for name in ("A", "B"):
        rport = free_port()
        config = tmpdir / f"{name}.toml"
        config.write_text(CONFIG.format(port=rport, tmpdir=tmpdir, redis_url=args.redis_url, prefix=prefix,
                                        upstream_port=port))
        server = procs.start(f"replica-{name}", [args.tollhouse, "serve", "--config", str(config)], rport,
                             "/mcp/hold")
        wait_ready(server, deadline_s=30.0)
        replicas.append(server)
    return upstream, replicas[0], replicas[1]


async def rpc(client: httpx.AsyncClient, url: str, body: dict[str, Any], session: str | None = None
              ) -> httpx.Response:
    headers = {**HEADERS, **({"mcp-session-id": session} if session else {})}
    return await client.post(url, json=body, headers=headers)


async def open_session(client: httpx.AsyncClient, url: str) -> str:
    resp = await rpc(client, url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
    session = resp.headers.get("mcp-session-id")
    if resp.status_code != 200 or not isinstance(session, str):
        raise RuntimeError(f"initialize answered {resp.status_code}: {resp.text[:200]!r}")
    done = await rpc(client, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    if done.status_code != 202:
        raise RuntimeError(f"notifications/initialized answered {done.status_code}")
    return session


async def moment(client: httpx.AsyncClient, upstream: Server, token: str, what: str,
                 timeout_s: float) -> float | None:
    resp = await client.get(f"http://127.0.0.1:{upstream.port}/trial/{token}",
                            params={"wait": what, "timeout_s": str(timeout_s)})
    value = resp.json()[f"{what}_t"]
    return float(value) if value is not None else None


async def timed(request: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    """The answer and when it arrived (read in its own task, not after the cancel's answer)."""
    resp = await request
    return resp, time.monotonic()


async def trial(client: httpx.AsyncClient, upstream: Server, a: Server, target: Server, session: str,
                n: int, via: str) -> Trial:
    token = f"{via}-{n}"
    call = asyncio.ensure_future(timed(rpc(client, a.url, {
        "jsonrpc": "2.0", "id": n, "method": "tools/call",
        "params": {"name": "hold", "arguments": {"token": token}}}, session)))
    try:
        if await moment(client, upstream, token, "held", 10.0) is None:
            raise RuntimeError(f"trial {token}: the upstream never got the call")
        t0 = time.monotonic()
        ack = await rpc(client, target.url, {"jsonrpc": "2.0", "method": "notifications/cancelled",
                                             "params": {"requestId": n, "reason": "bench"}}, session)
        t_ack = time.monotonic()
        if ack.status_code != 202:
            raise RuntimeError(f"trial {token}: the cancel answered {ack.status_code}: {ack.text[:200]!r}")
        answer, t_end = await asyncio.wait_for(call, 10.0)
    finally:
        call.cancel()
    code = answer.json().get("error", {}).get("code") if answer.status_code == 200 else None
    if code != -32800:
        raise RuntimeError(f"trial {token}: the call answered {answer.status_code}: {answer.text[:200]!r}")
    notice = await moment(client, upstream, token, "notice", 2.0)
    closed = await moment(client, upstream, token, "closed", 2.0)
    return Trial(via, t_ack - t0, None if notice is None else notice - t0, t_end - t0,
                 None if closed is None else closed - t0)


async def run_trials(args: argparse.Namespace, upstream: Server, a: Server, b: Server) -> list[Trial]:
    limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
    async with httpx.AsyncClient(timeout=15.0, limits=limits) as client:
        session = await open_session(client, a.url)
        measured: list[Trial] = []
        for n in range(args.warmup + args.trials):
            for via in args.via:
                got = await trial(client, upstream, a, b if via == "other" else a, session,
                                  n * len(args.via) + args.via.index(via) + 1, via)
                if n >= args.warmup:
                    measured.append(got)
        return measured


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def render(trials: list[Trial], args: argparse.Namespace, elapsed_s: float) -> str:
    lines = ["## Cancellation latency, two replicas on one Redis", "",
             (f"{args.trials} sequential trials per route after {args.warmup} of warm-up, interleaved; "
              f"took {elapsed_s:.0f} s. Milliseconds from the client's send of `notifications/cancelled`."),
             "", "| cancel sent to | moment | n | p50 | p95 | p99 | max | missing |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    labels = {"other": "replica B (the call runs on A)", "same": "replica A (runs the call)"}
    for via in args.via:
        mine = [t for t in trials if t.via == via]
        for what in MOMENTS:
            values = [v * 1000 for v in (getattr(t, what) for t in mine) if v is not None]
            if not values:
                lines.append(f"| {labels[via]} | {what} | 0 | – | – | – | – | {len(mine)} |")
                continue
            lines.append(f"| {labels[via]} | {what} | {len(values)} | {pct(values, 50):.2f} | "
                         f"{pct(values, 95):.2f} | {pct(values, 99):.2f} | {max(values):.2f} | "
                         f"{len(mine) - len(values)} |")
    lines += ["", ("ack: the replica's 202; notice: the upstream received notifications/cancelled; "
                   "ended: the client got -32800 for the call from A; closed: A dropped its upstream "
                   "request.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prefix = variants.new_prefix()
    with tempfile.TemporaryDirectory(prefix="tollhouse-cancel-") as tmp:
        procs = Processes(Path(tmp))
        try:
            upstream, a, b = start(procs, args, Path(tmp), prefix)
            began = time.monotonic()
            trials = asyncio.run(run_trials(args, upstream, a, b))
            text = render(trials, args, time.monotonic() - began)
        finally:
            procs.stop_all()
            print(f"deleted {variants.delete_keys(args.redis_url, prefix)} Redis keys under {prefix}",
                  file=sys.stderr)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()

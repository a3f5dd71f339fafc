"""Soak and faults: mixed MCP traffic through one gateway while its upstream is killed and
restarted, its database is locked, and its metering receiver goes down and comes back; then
what grew, what failed by kind, and whether every answered call is accounted for.

    .venv/bin/python bench/soak.py [--duration 1200] [--concurrency 8] [--fault-every 60]

Not part of CI (it runs for minutes). The traffic, `--concurrency` clients each looping over
a weighted mix: 2025-11-25 calls on the client's session (answered as SSE by the official-SDK
upstream), 2026-07-28 sessionless calls (bridged onto that legacy upstream), a sampling
round trip (the upstream asks, the client answers on a POST), a cancellation of a call that
never ends (`-32800` expected), and a denied tool. A rate limit refuses some calls (429). Every
`--fault-every` seconds the next fault of the cycle: the upstream SIGKILLed and started again
after 2 s; the metering receiver down for 5 s (its authorize fails, so calls are refused meanwhile
and usage events wait in the outbox); the SQLite database locked (BEGIN EXCLUSIVE) for 3 s.

Every 5 s it samples the gateway's RSS, open file descriptors and threads and, from /metrics,
calls in flight, sessions, the audit queue and the usage outbox. At the end it waits for the
outbox to drain, stops the gateway with SIGTERM, and reconciles: each call answered with a
JSON-RPC result or error has exactly one audit record, and each metered call the audit shows
served has its usage event at the receiver (by call id).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from paths import MODERN
from procs import free_port
from variants import JWT_AUTH

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
ISSUER, AUDIENCE = "https://issuer.soak.invalid/", "tollhouse-soak"
MIX = {"legacy": 40, "modern": 25, "sampling": 10, "cancel": 5, "denied": 10, "progress": 10}
CONFIG = """\
[server]
listen = "127.0.0.1:{port}"
public_url = "http://127.0.0.1:{port}"
shutdown_grace_s = 5
""" + JWT_AUTH + """\
[database]
url = "sqlite:///{db}"
[[upstreams]]
name = "soak"
url = "http://127.0.0.1:{up_port}/mcp"
total_timeout_s = 20
[upstreams.access]
tools_deny = ["boom"]
[[rate_limits]]
name = "soak"
key = "principal"
methods = ["tools/call"]
rate = "150/s"
burst = 40
[metering]
url = "http://127.0.0.1:{meter_port}/meter"
secret = "{meter_secret}"
methods = ["tools/call"]
timeout_ms = 500
retry_max_s = 2
"""


class Receiver:
    """The metering webhook: authorize says yes, usage events are counted by call id."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.call_ids: set[str] = set()
        self.deliveries = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("type") == "authorize":
            return web.json_response({"allow": True})
        self.deliveries += 1
        self.call_ids.add(str(body.get("call_id")))
        return web.json_response({})

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/meter", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class Upstream:
    def __init__(self, port: int, logdir: Path) -> None:
        self.port = port
        self.log = logdir / "upstream.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([PYTHON, str(BENCH / "soak_upstream.py"), "--port",
                                          str(self.port)], stdout=out, stderr=out)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)


def bearer(secret: str) -> str:
    import jwt

    now = int(time.time())
    return "Bearer " + jwt.encode({"iss": ISSUER, "sub": "soak", "aud": AUDIENCE, "iat": now,
                                   "exp": now + 86400}, secret, algorithm="HS256")


def answers(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON or SSE answer."""
    if "text/event-stream" not in response.headers.get("content-type", ""):
        with contextlib.suppress(ValueError):
            body = response.json()
            return body if isinstance(body, list) else [body]
        return []
    out = []
    for line in response.text.splitlines():
        if line.startswith("data:"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line[5:]))
    return out


class Client:
    """One looping client: its own session, its own ids, its outcomes."""

    def __init__(self, n: int, url: str, auth: str, outcomes: Counter[str],
                 answered: set[str]) -> None:
        self.n, self.url, self.auth = n, url, auth
        self.outcomes, self.answered = outcomes, answered
        self.http = httpx.AsyncClient(timeout=30)
        self.session: str | None = None
        self.ids = itertools.count()

    def headers(self, modern: bool = False, tool: str = "") -> dict[str, str]:
        h = {"authorization": self.auth, "content-type": "application/json",
             "accept": "application/json, text/event-stream"}
        if modern:
            h.update({"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": tool})
        else:
            h["mcp-protocol-version"] = "2025-11-25"
            if self.session:
                h["mcp-session-id"] = self.session
        return h

    async def initialize(self) -> None:
        r = await self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "id": f"init-{self.n}-{next(self.ids)}", "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
                       "clientInfo": {"name": "soak", "version": "1"}}})
        self.session = r.headers.get("mcp-session-id")
        if self.session:
            await self.http.post(self.url, headers=self.headers(),
                                 json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, tool: str, arguments: dict[str, Any], modern: bool = False
             ) -> tuple[str, dict[str, Any]]:
        rid = f"c{self.n}-{next(self.ids)}"
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if modern:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                               "io.modelcontextprotocol/clientCapabilities": {},
                               "io.modelcontextprotocol/clientInfo": {"name": "soak", "version": "1"}}
        return rid, {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    def settle(self, kind: str, rid: str, response: httpx.Response) -> None:
        mine = [m for m in answers(response) if m.get("id") == rid]
        if response.status_code == 404 and not mine:
            self.session = None  # the session is gone: the next round opens a new one
        if not mine:
            self.outcomes[f"{kind}: HTTP {response.status_code}, no answer"] += 1
            return
        self.answered.add(rid)
        error = mine[-1].get("error")
        self.outcomes[f"{kind}: " + (f"error {error.get('code')}" if error else "result")] += 1

    async def round(self, kind: str) -> None:
        if kind not in ("modern",) and self.session is None:
            await self.initialize()
            if self.session is None:
                self.outcomes["initialize failed"] += 1
                return
        if kind in ("legacy", "modern", "denied", "progress"):
            tool, args = {"legacy": ("echo", {"text": "soak"}), "modern": ("echo", {"text": "m"}),
                          "denied": ("boom", {}), "progress": ("slow_progress", {"steps": 3})}[kind]
            rid, body = self.call(tool, args, modern=kind == "modern")
            r = await self.http.post(self.url, headers=self.headers(kind == "modern", tool),
                                     json=body)
            self.settle(kind, rid, r)
        elif kind == "sampling":
            await self.sampling()
        elif kind == "cancel":
            await self.cancel()

    async def sampling(self) -> None:
        rid, body = self.call("ask_sampling", {"prompt": "soak"})
        async with self.http.stream("POST", self.url, headers=self.headers(), json=body) as r:
            got: list[dict[str, Any]] = []
            if "text/event-stream" not in r.headers.get("content-type", ""):
                await r.aread()  # answered at once (a refusal, a denial as a tool result)
                got = [m for m in answers(r) if m.get("id") == rid]
            async for line in (r.aiter_lines() if not got and not r.is_stream_consumed
                               else _nothing()):
                if not line.startswith("data:"):
                    continue
                with contextlib.suppress(ValueError):
                    message = json.loads(line[5:])
                    if message.get("method") == "sampling/createMessage":
                        await self.http.post(self.url, headers=self.headers(), json={
                            "jsonrpc": "2.0", "id": message["id"], "result": {
                                "role": "assistant", "model": "soak",
                                "content": {"type": "text", "text": "sampled"}}})
                    elif message.get("id") == rid:
                        got.append(message)
                        break
        if not got:
            self.outcomes[f"sampling: HTTP {r.status_code}, no answer"] += 1
            if r.status_code == 404:
                self.session = None
            return
        self.answered.add(rid)
        error = got[-1].get("error")
        self.outcomes["sampling: " + (f"error {error.get('code')}" if error else "result")] += 1

    async def cancel(self) -> None:
        rid, body = self.call("wait_forever", {})
        task = asyncio.ensure_future(self.http.post(self.url, headers=self.headers(), json=body))
        await asyncio.sleep(0.3)  # the call is under way upstream (a load script, not a test)
        await self.http.post(self.url, headers=self.headers(), json={
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": rid, "reason": "soak"}})
        self.settle("cancel", rid, await task)


async def _nothing() -> Any:
    return
    yield


async def sample(pid: int, metrics_url: str, http: httpx.AsyncClient) -> dict[str, float]:
    proc = Path(f"/proc/{pid}")
    status = {k: v for k, _, v in (line.partition(":") for line in
                                   (proc / "status").read_text().splitlines())}
    row = {"rss_mb": int(status["VmRSS"].split()[0]) / 1024, "fds": len(os.listdir(proc / "fd")),
           "threads": int(status["Threads"])}
    with contextlib.suppress(httpx.HTTPError):
        text = (await http.get(metrics_url)).text
        for name in ("tollhouse_calls_in_flight", "tollhouse_sessions_active",
                     "tollhouse_audit_queue_depth", "tollhouse_usage_outbox_depth"):
            row[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                            if line.startswith(name) and not line.startswith("#"))
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=int, default=1200, help="seconds of traffic")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fault-every", type=int, default=60)
    parser.add_argument("--tollhouse", default=str(Path(PYTHON).parent / "tollhouse"))
    parser.add_argument("--only", choices=list(MIX), help="one kind of traffic (to find a fault)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tollhouse-soak-"))
    db = tmp / "soak.db"
    port, up_port, meter_port = free_port(), free_port(), free_port()
    secret, meter_secret = secrets.token_hex(32), secrets.token_hex(16)
    (tmp / "soak.toml").write_text(CONFIG.format(
        port=port, issuer=ISSUER, secret=secret, audience=AUDIENCE, db=db, up_port=up_port,
        meter_port=meter_port, meter_secret=meter_secret))
    receiver, upstream = Receiver(meter_port), Upstream(up_port, tmp)
    await receiver.up()
    upstream.start()
    log = (tmp / "gateway.log").open("wb")
    gateway = subprocess.Popen(  # noqa: ASYNC220 - it starts the process and returns
        [args.tollhouse, "serve", "--config", str(tmp / "soak.toml")],
        stdout=log, stderr=subprocess.STDOUT)
    url, metrics_url = f"http://127.0.0.1:{port}/mcp/soak", f"http://127.0.0.1:{port}/metrics"
    http = httpx.AsyncClient(timeout=5)
    deadline = time.monotonic() + 30
    while True:  # poll until the gateway and its upstream answer (a script's start-up wait)
        with contextlib.suppress(httpx.HTTPError):
            if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                break
        if time.monotonic() > deadline or gateway.poll() is not None:
            raise SystemExit(f"the gateway did not become ready; see {tmp / 'gateway.log'}")
        await asyncio.sleep(0.2)
    outcomes: Counter[str] = Counter()
    answered: set[str] = set()
    clients = [Client(i, url, bearer(secret), outcomes, answered) for i in range(args.concurrency)]
    samples: list[tuple[float, dict[str, float]]] = []
    faults: list[str] = []
    began = time.monotonic()
    end = began + args.duration
    rng = random.Random(1)

    async def traffic(client: Client) -> None:
        kinds, weights = ([args.only], [1]) if args.only else (list(MIX), list(MIX.values()))
        while time.monotonic() < end:
            kind = rng.choices(kinds, weights)[0]
            try:
                await client.round(kind)
            except httpx.HTTPError as exc:
                outcomes[f"{kind}: transport {type(exc).__name__}"] += 1

    async def fault_cycle() -> None:
        cycle = itertools.cycle(("upstream", "receiver", "database"))
        while time.monotonic() + args.fault_every < end:
            await asyncio.sleep(args.fault_every)
            fault = next(cycle)
            faults.append(f"{time.monotonic() - began:.0f}s {fault}")
            if fault == "upstream":
                upstream.kill()
                await asyncio.sleep(2)
                upstream.start()
            elif fault == "receiver":
                await receiver.down()
                await asyncio.sleep(5)
                await receiver.up()
            else:
                lock = sqlite3.connect(db, timeout=10)
                lock.execute("BEGIN EXCLUSIVE")
                await asyncio.sleep(3)
                lock.rollback()
                lock.close()

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append((time.monotonic() - began, await sample(gateway.pid, metrics_url, http)))
            await asyncio.sleep(5)

    await asyncio.gather(fault_cycle(), sampler(), *(traffic(c) for c in clients))
    # the outbox drains once the receiver answers: poll its depth, at most 60 s
    drain_end = time.monotonic() + 60
    while time.monotonic() < drain_end:
        last = await sample(gateway.pid, metrics_url, http)
        if not last.get("tollhouse_usage_outbox_depth") and not last.get("tollhouse_audit_queue_depth"):
            break
        await asyncio.sleep(0.5)
    final = await sample(gateway.pid, metrics_url, http)
    gateway.send_signal(signal.SIGTERM)
    exit_code = gateway.wait(60)
    await asyncio.gather(*(c.http.aclose() for c in clients))
    await http.aclose()
    await receiver.down()
    upstream.kill()
    print(report(args, samples, final, outcomes, answered, receiver, db, faults, exit_code, tmp))


def report(args: argparse.Namespace, samples: list[tuple[float, dict[str, float]]],
           final: dict[str, float], outcomes: Counter[str], answered: set[str],
           receiver: Receiver, db: Path, faults: list[str], exit_code: int, tmp: Path) -> str:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT request_id, status, call_id FROM audit WHERE method = 'tools/call'"
                        ).fetchall()
    conn.close()
    per_id = Counter(str(r[0]).strip('"') for r in rows)
    missing_audit = sorted(rid for rid in answered if per_id[rid] == 0)
    twice = sorted(rid for rid in answered if per_id[rid] > 1)
    metered = {r[2] for r in rows if r[1] == "ok" and r[2]}
    undelivered = metered - receiver.call_ids
    lines = [(f"# Soak: {args.duration} s, {args.concurrency} clients, a fault every "
             f"{args.fault_every} s (logs in {tmp})"), "",
             "| t s | RSS MB | fds | threads | in flight | sessions | audit queue | outbox |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    step = max(1, len(samples) // 12)
    for t, s in [*samples[::step], (float("nan"), final)]:
        lines.append(f"| {t:.0f} | {s['rss_mb']:.1f} | {s['fds']:.0f} | {s['threads']:.0f} | "
                     f"{s.get('tollhouse_calls_in_flight', float('nan')):.0f} | "
                     f"{s.get('tollhouse_sessions_active', float('nan')):.0f} | "
                     f"{s.get('tollhouse_audit_queue_depth', float('nan')):.0f} | "
                     f"{s.get('tollhouse_usage_outbox_depth', float('nan')):.0f} |")
    if len(samples) >= 4:
        half = [s["rss_mb"] for _, s in samples[len(samples) // 2:]]
        lines += ["", (f"RSS over the second half: median {statistics.median(half):.1f} MB, "
                      f"first {half[0]:.1f}, last {half[-1]:.1f} (growth that does not settle "
                      "is a leak)")]
    lines += ["", f"Faults: {', '.join(faults) or 'none'}", "", "| outcome | calls |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(outcomes.items())]
    lines += ["", (f"Answered calls: {len(answered)}; without an audit record: {len(missing_audit)}"
                  f"{' ' + str(missing_audit[:5]) if missing_audit else ''}; with two or more: "
                  f"{len(twice)}."),
              (f"Metered calls served (audit ok with a call id): {len(metered)}; usage events "
              f"delivered: {receiver.deliveries} ({len(receiver.call_ids)} distinct); served "
              f"but never delivered: {len(undelivered)}."),
              f"Gateway exit code on SIGTERM: {exit_code}."]
    return "\n".join(lines)


if __name__ == "__main__":
    asyncio.run(main())

"""The gateway's own cost per call, in process: no sockets, no Hypercorn, no load generator.

Builds the app for a one-upstream config (auth `none`, SQLite audit in a temporary
directory), answers upstream calls from an in-memory httpx transport, and drives the ASGI app
directly with `tools/call` POSTs, one after another. Prints the best (lowest) microseconds per
call over several rounds: the least noisy figure on a shared machine, and one that two builds
can be compared by (run each with its own checkout first on sys.path, alternately).

    .venv/bin/python bench/inprocess.py [--calls 3000] [--rounds 5]
    cd /path/to/other/checkout && /work/main/.venv/bin/python /work/main/bench/inprocess.py

`--state redis://127.0.0.1:6379/0` keeps the state in Redis (a fresh key prefix, deleted at the
end); `--stateful` is run.py's per-call-store config (a JWT caller, a 2025-11-25 session, a rate
limit that never refuses); `--all-policies` is paths.py's every-policy-on config (sessionless);
`--profile N` prints cProfile's top N functions of one round. `--gc default|frozen` counts the
cycle collector's collections and their time per call (`frozen`: as `tollhouse serve` with
`server.gc_freeze`). `--parts` times all-policies'
own steps (the bearer check, the chain, each policy) called directly, one by one.
`--observability` measures, side by side in one run (rounds alternate), the same config with
`[observability] metrics = false`, with metrics on, and with metrics on and the request log line
written (INFO, formatted, to /dev/null). `--tracing` measures the same way tracing off (no
`otlp_endpoint`) against on (the `tollhouse[otel]` extra; every span exported over OTLP/HTTP to
a receiver in a child process, so the export thread's CPU is counted and the receiver's not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

sys.path.insert(0, os.getcwd())  # the checkout to measure: the one this is run from

import httpx

from proxy.config import from_dict
from proxy.runtime.app import create_app

CALL = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "hi"}}}).encode()
RESULT = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {
    "content": [{"type": "text", "text": "hi"}]}}).encode()
HEADERS = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
           (b"accept", b"application/json, text/event-stream"),
           (b"mcp-protocol-version", b"2025-11-25"), (b"content-length", str(len(CALL)).encode())]
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "inprocess", "version": "1"}}}).encode()
ISSUER, AUDIENCE = "https://issuer.bench.invalid/", "tollhouse-bench"


class Resolver:
    async def resolve(self, host: str, port: int) -> list[str]:
        return ["10.0.0.10"]  # a LAN address: in the default zones and in all-policies' zone


def upstream(request: httpx.Request) -> httpx.Response:
    if b'"initialize"' in request.content:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=json.dumps(
            {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25", "capabilities": {},
                                                   "serverInfo": {"name": "up", "version": "1"}}}).encode())
    return httpx.Response(200, content=RESULT, headers={"content-type": "application/json"})


async def one_call(app: Any, extra: list[tuple[bytes, bytes]] | None = None, body: bytes = CALL,
                   answer: dict[str, str] | None = None, out: list[bytes] | None = None,
                   path: str = "/mcp/bench") -> int:
    headers = [h for h in HEADERS if h[0] != b"content-length"] if body is not CALL else HEADERS
    if body is not CALL:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [*headers, *(extra or [])],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8080), "root_path": ""}
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            if answer is not None:
                answer.update({k.decode().lower(): v.decode() for k, v in message["headers"]})
        elif message["type"] == "http.response.body" and out is not None:
            out.append(message.get("body", b""))

    await app(scope, receive, send)
    return status


@contextlib.asynccontextmanager
async def served(raw: dict[str, Any], stateful: bool, secret: str,
                 extra: list[tuple[bytes, bytes]] | None = None
                 ) -> AsyncIterator[tuple[Any, list[tuple[bytes, bytes]]]]:
    """The app of `raw` in front of the in-memory upstream, started, its first call answered;
    with the headers each call sends (a bearer and a session when `stateful`, else `extra`)."""
    app = create_app(from_dict(raw, env={}), upstream_transport=httpx.MockTransport(upstream),
                     resolver=Resolver())
    async with app.test_app():
        extra = await session_headers(app, secret) if stateful else (extra or [])
        await answered(app, extra)
        yield app, extra


async def answered(app: Any, extra: list[tuple[bytes, bytes]]) -> None:
    """One call, which must be answered a result (a refusal would measure the wrong thing)."""
    first: list[bytes] = []
    if await one_call(app, extra, out=first) != 200 or b'"result"' not in b"".join(first):
        raise SystemExit(f"the first call was not answered a result: {b''.join(first)[:300]!r}")


def config(tmp: str, state: str, prefix: str, stateful: bool, secret: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "auth": {"mode": "none"}, "database": {"url": f"sqlite:///{tmp}/b.db"},
        "state": {"url": state, "key_prefix": prefix},
        "upstreams": [{"name": "bench", "url": "http://upstream.test/mcp", "era": "legacy"}]}
    if stateful:
        cfg["auth"] = {"mode": "jwt", "issuers": [{"issuer": ISSUER, "hs256_secret": secret,
                                                   "algorithms": ["HS256"], "audience": AUDIENCE}]}
        cfg["rate_limits"] = [{"name": "never", "key": "principal", "methods": ["tools/call"],
                               "rate": "1000000/s", "burst": 1_000_000_000}]
    return cfg


def every_policy(tmp: str, state: str, prefix: str, secret: str) -> dict[str, Any]:
    """paths.py's all-policies config, pointed at the in-memory upstream."""
    import tomllib
    from pathlib import Path

    import paths

    cfg = tomllib.loads(paths.config_text(paths.PATHS["all-policies"], 8080, 9, Path(tmp), secret))
    cfg["upstreams"][0].update(url="http://upstream.test/mcp", zones=["lan"])
    cfg["state"] = {"url": state, "key_prefix": prefix}
    return cfg


def leave_out(raw: dict[str, Any], part: str) -> None:
    """The all-policies config without one of its parts."""
    upstream = raw["upstreams"][0]
    if part == "access":
        upstream.pop("access", None)
    elif part == "rate_limits":
        raw.pop("rate_limits", None)
    elif part == "egress":
        upstream.pop("collections", None)
        raw.pop("egress", None)
        upstream["zones"] = ["loopback", "lan", "remote"]
    elif part == "metering":
        raw.pop("metering", None)
    else:
        raise SystemExit(f"--without: access, rate_limits, egress or metering, not {part!r}")


def bearer(secret: str) -> str:
    import jwt

    now = int(time.time())
    token = jwt.encode({"iss": ISSUER, "sub": "bench-user", "aud": AUDIENCE, "iat": now,
                        "exp": now + 86400}, secret, algorithm="HS256")
    return f"Bearer {token}"


async def session_headers(app: Any, secret: str) -> list[tuple[bytes, bytes]]:
    """A bearer and the Mcp-Session-Id of one initialize."""
    auth = [(b"authorization", bearer(secret).encode())]
    answer: dict[str, str] = {}
    status = await one_call(app, auth, INITIALIZE, answer)
    if status != 200 or "mcp-session-id" not in answer:
        raise SystemExit(f"initialize answered {status}")
    return [*auth, (b"mcp-session-id", answer["mcp-session-id"].encode())]


def delete_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--state", default="memory", help="memory, or a loopback redis:// URL")
    parser.add_argument("--stateful", action="store_true", help="JWT caller, session, rate limit")
    parser.add_argument("--all-policies", action="store_true",
                        help="paths.py's all-policies config: every policy of the chain on")
    parser.add_argument("--without", default="", metavar="PART",
                        help="with --all-policies: leave one part out (access, rate_limits, "
                             "egress, metering), to see what it costs")
    parser.add_argument("--profile-out", metavar="FILE",
                        help="with --profile: also write the round's stats there (pstats format: "
                             "bench/profdiff.py sets two of them side by side)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="cProfile one more round; print the top N by cumulative time")
    parser.add_argument("--observability", action="store_true",
                        help="metrics off / on / on with the request log, side by side")
    parser.add_argument("--tracing", action="store_true",
                        help="tracing off / on (spans exported over OTLP/HTTP), side by side")
    parser.add_argument("--gc", choices=("default", "frozen"), default=None,
                        help="count the cycle collector's collections by generation and the "
                             "time they take per call; `frozen`: objects of start-up frozen "
                             "first (gc.freeze), as `tollhouse serve` does")
    parser.add_argument("--parts", action="store_true",
                        help="all-policies' own steps one by one: the bearer check, the whole "
                             "chain and each policy alone, called directly (no request around)")
    args = parser.parse_args()
    if args.observability:
        return await observability(args)
    if args.parts:
        return await parts(args)
    if args.tracing:
        return await tracing(args)
    if args.state != "memory" and not args.state.startswith(("redis://127.0.0.1", "redis://localhost")):
        parser.error("--state: memory or a loopback redis:// URL")
    prefix, secret = f"bench{secrets.token_hex(6)}:", secrets.token_hex(32)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = (every_policy(tmp, args.state, prefix, secret) if args.all_policies
                   else config(tmp, args.state, prefix, args.stateful, secret))
            if args.without:
                leave_out(raw, args.without)
            cfg = from_dict(raw, env={})
            app = create_app(cfg, upstream_transport=httpx.MockTransport(upstream),
                             resolver=Resolver())
            async with app.test_app():
                extra = (await session_headers(app, secret) if args.stateful
                         else [(b"authorization", bearer(secret).encode())] if args.all_policies
                         else [])
                await answered(app, extra)
                best = best_cpu = best_waits = float("inf")
                collections = Collections(args.gc)
                for _ in range(args.rounds):
                    began, began_cpu, began_waits = (time.perf_counter(), time.process_time(),
                                                     loop_waits())
                    for _ in range(args.calls):
                        await one_call(app, extra)
                    best = min(best, (time.perf_counter() - began) / args.calls)
                    best_cpu = min(best_cpu, (time.process_time() - began_cpu) / args.calls)
                    best_waits = min(best_waits, (loop_waits() - began_waits) / args.calls)
                collections.report(args.rounds * args.calls)  # (printed first)
                if args.profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(args.calls):
                        await one_call(app, extra)
                    prof.disable()
    finally:
        if args.state != "memory":
            delete_keys(args.state, prefix)
    mode = (f"state {args.state.split('@')[-1]}{', stateful' if args.stateful else ''}"
            f"{', all policies' if args.all_policies else ''}"
            f"{f' but {args.without}' if args.without else ''}")
    print(f"{os.getcwd()} ({mode}): {best * 1e6:.1f} us per call, {best_cpu * 1e6:.1f} us CPU, "
          f"{best_waits:.2f} loop waits (best of {args.rounds} x {args.calls})")
    if args.profile:
        if args.profile_out:
            prof.dump_stats(args.profile_out)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)


class Collections:
    """`--gc`: the cycle collector's collections over the timed rounds, by generation, and
    the time they took (gc.callbacks); `frozen` freezes what start-up left first."""

    def __init__(self, mode: str | None) -> None:
        import gc

        self.mode = mode
        self.counts = [0, 0, 0]
        self.spent = [0.0, 0.0, 0.0]
        self._began = 0.0
        if mode is None:
            return
        gc.collect()
        if mode == "frozen":
            gc.freeze()
        self.frozen = gc.get_freeze_count()
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.counts[info["generation"]] += 1
        self.spent[info["generation"]] += time.perf_counter() - self._began

    def report(self, calls: int) -> None:
        if self.mode is None:
            return
        import gc

        gc.callbacks.remove(self._seen)
        print(f"  gc ({self.mode}, {self.frozen} objects frozen, {len(gc.get_objects())} "
              f"tracked after): " + ", ".join(
                  f"gen {g}: {n} collections, {t / calls * 1e6:.2f} us a call"
                  for g, (n, t) in enumerate(zip(self.counts, self.spent, strict=True))))


def loop_waits() -> int:
    """The event loop's thread's voluntary context switches so far: each is a moment the loop
    had nothing to run and slept in epoll for I/O (Redis, the audit commit). Unlike time, the
    count per call does not depend on how busy the machine is, so it compares two builds
    fairly on a noisy one."""
    with open("/proc/thread-self/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


async def settled(apps: list[Any]) -> None:
    """Until every app's audit queue is written (a bench may poll; a test may not)."""
    for app in apps:
        audit = app.extensions["tollhouse"].gateway.audit
        while getattr(audit, "depth", 0):
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the writer's last batch commits


def _null_request_log() -> Any:
    """The request log's logger, formatting every line as `tollhouse serve` does, to nowhere."""
    import logging

    from proxy.observability.logs import lean

    lean()  # as `tollhouse serve` sets logging up
    request_log = logging.getLogger("tollhouse.request")
    request_log.propagate = False
    sink = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - for the whole run
    sink.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    request_log.addHandler(sink)
    return request_log


async def observability(args: argparse.Namespace) -> None:
    """Metrics off, on, and on with the request log line, alternating rounds in one process.

    One app (metrics on), its gateway's observer swapped between rounds: what
    `[observability] metrics = false` builds (the request log alone), metrics and the request
    log, each with the log's level off or on. Separate apps would differ by more than the
    metrics (their databases, their threads): measured, that difference drowned the one sought.
    """
    import logging

    from proxy.observability import Observers

    request_log = _null_request_log()
    prefix, secret = f"bench{secrets.token_hex(6)}:", secrets.token_hex(32)
    best: dict[str, tuple[float, float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = config(tmp, args.state, prefix, args.stateful, secret)
            async with served(raw, args.stateful, secret) as (app, extra):
                state = app.extensions["tollhouse"]
                gateway, metrics = state.gateway, state.metrics
                with_metrics = gateway.observer
                alone = Observers([o for o in with_metrics._all if o is not metrics])
                variants = [("metrics off", alone, False), ("metrics on", with_metrics, False),
                            ("metrics on + request log", with_metrics, True)]
                best = {name: (float("inf"), float("inf")) for name, _, _ in variants}
                for r in range(args.rounds * len(variants)):
                    name, observer, logged = variants[(r + r // len(variants)) % len(variants)]
                    gateway.observer = observer
                    request_log.setLevel(logging.INFO if logged else logging.WARNING)
                    await settled([app])  # no audit writer still busy with an earlier round
                    began, began_cpu = time.perf_counter(), time.process_time()
                    for _ in range(args.calls):
                        await one_call(app, extra)
                    wall = (time.perf_counter() - began) / args.calls
                    cpu = (time.process_time() - began_cpu) / args.calls
                    best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    finally:
        if args.state != "memory":
            delete_keys(args.state, prefix)
    mode = f"state {args.state.split('@')[-1]}{', stateful' if args.stateful else ''}"
    print(f"{os.getcwd()} ({mode}; best of {args.rounds} x {args.calls}, rounds alternating)")
    for name, (wall, cpu) in best.items():
        print(f"  {name:26s} {wall * 1e6:7.1f} us per call, {cpu * 1e6:7.1f} us CPU")


async def parts(args: argparse.Namespace) -> None:
    """What all-policies' steps cost on the event loop, each called directly in a loop: the
    bearer check, the whole chain, and each policy of it alone (`Chain.run(only=...)`), for
    one `tools/call`. With objects of start-up frozen, as `tollhouse serve` does. What they
    add up to, set against what all-policies costs over auth-off under wrk, says how much of
    that difference is the policies' own work and how much is around them."""
    import gc

    from proxy.chain import CallContext
    from proxy.jsonrpc import parse

    secret = secrets.token_hex(32)
    with tempfile.TemporaryDirectory() as tmp:
        raw = every_policy(tmp, "memory", "bench:", secret)
        # dialled by address, as the wrk bench's upstream is (no resolver answer to check)
        raw["upstreams"][0].update(url="http://127.0.0.1:9/mcp", zones=["loopback", "lan"])
        token = bearer(secret)
        async with served(raw, False, secret, [(b"authorization", token.encode())]) as (app, _):
            gateway = app.extensions["tollhouse"].gateway
            chain, route = gateway.live.chain, gateway.routes["bench"]
            msg = parse(CALL)
            principal = await gateway.auth.authenticate(token, "bench", "127.0.0.1")

            def context() -> CallContext:
                return CallContext(principal, "bench", route.url_text, peer_ip="127.0.0.1",
                                   dial_key=route.dial_key)

            async def step(name: str) -> None:
                if name == "bearer check":
                    await gateway.auth.authenticate(token, "bench", "127.0.0.1")
                elif name == "chain":
                    await chain.run(msg, context())
                elif name == "call context":
                    context()
                else:
                    await chain.run(msg, context(), only=(name,))

            names = ["bearer check", "call context", "chain", *chain.names]
            best = dict.fromkeys(names, float("inf"))
            gc.collect()
            gc.freeze()
            for _ in range(args.rounds):
                for name in names:
                    began = time.perf_counter()
                    for _ in range(args.calls):
                        await step(name)
                    best[name] = min(best[name], (time.perf_counter() - began) / args.calls)
            gc.unfreeze()
    print(f"{os.getcwd()} (all-policies' steps; best of {args.rounds} x {args.calls})")
    for name in names:
        alone = " (with a call context)" if name in chain.names else ""
        print(f"  {name:14s} {best[name] * 1e6:6.2f} us{alone}")


RECEIVER = """
import http.server, sys
class Answer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


async def tracing(args: argparse.Namespace) -> None:
    """Tracing off and on, alternating rounds in one process: one app with tracing on, its
    gateway's observer swapped between rounds for the one an app without `otlp_endpoint`
    builds (no tracer; the path's trace context then stays unset, as it does when off)."""
    import subprocess

    from proxy.observability import Observers
    from proxy.traced import CURRENT

    receiver = subprocess.Popen(  # noqa: ASYNC220 - once, before anything is timed
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    prefix, secret = f"bench{secrets.token_hex(6)}:", secrets.token_hex(32)
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            raw = config(tmp, args.state, prefix, args.stateful, secret)
            raw["observability"] = {"otlp_endpoint": f"http://127.0.0.1:{port}"}
            async with served(raw, args.stateful, secret) as (app, extra):
                state = app.extensions["tollhouse"]
                gateway, tracer = state.gateway, state.tracing
                traced = gateway.observer
                untraced = Observers([o for o in traced._all if o is not tracer])
                variants = [("tracing off", untraced), ("tracing on", traced)]
                best = {name: (float("inf"), float("inf")) for name, _ in variants}
                for r in range(args.rounds * len(variants)):
                    name, observer = variants[(r + r // len(variants)) % len(variants)]
                    gateway.observer = observer
                    CURRENT.set(None)  # this task's trace context, as no traced call left it
                    await asyncio.to_thread(tracer.force_flush)  # no export of a past round
                    await settled([app])
                    began, began_cpu = time.perf_counter(), time.process_time()
                    for _ in range(args.calls):
                        await one_call(app, extra)
                    if observer is traced:  # this round's spans exported, within its CPU
                        await asyncio.to_thread(tracer.force_flush)
                    wall = (time.perf_counter() - began) / args.calls
                    cpu = (time.process_time() - began_cpu) / args.calls
                    best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    finally:
        receiver.terminate()
        receiver.wait(5)
        if args.state != "memory":
            delete_keys(args.state, prefix)
    mode = f"state {args.state.split('@')[-1]}{', stateful' if args.stateful else ''}"
    print(f"{os.getcwd()} ({mode}; best of {args.rounds} x {args.calls}, rounds alternating)")
    for name, (wall, cpu) in best.items():
        print(f"  {name:26s} {wall * 1e6:7.1f} us per call, {cpu * 1e6:7.1f} us CPU")


if __name__ == "__main__":
    asyncio.run(main())

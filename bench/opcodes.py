"""Bytecodes a call, by function: a cost figure that does not move with the machine's noise.

Timings on the shared 2-core VM move ±20 % between runs minutes apart, more than the few
percent a change to the call path is worth. This counts instead what the event loop's thread
executes for one `tools/call` in process (bench/inprocess.py's app, upstream and calls): every
bytecode of every Python function, through `sys.settrace` with opcode events, over `--calls`
calls after 200 untraced ones. The same code gives the same count on every run, so two configs
(or two checkouts) can be compared to the bytecode. Bytecodes are not equal (a C call such as
orjson's counts one), so confirm a change with a timing or with callgrind's instruction count
(`valgrind --tool=callgrind`, whose figures track these within a few percent on this path),
but what the interpreter runs is most of a call's cost in this gateway.

    .venv/bin/python bench/opcodes.py                      # auth-off against all-policies
    .venv/bin/python bench/opcodes.py auth-off all-policies:metering --top 30

A variant is `auth-off`, `all-policies`, or `all-policies:<part>` (without that part: access,
rate_limits, egress or metering). Run it from the checkout to measure (it goes first on
sys.path); the threads beside the loop (the audit writer, the outbox worker) are not traced.

`--served` counts the whole call as a server makes it instead (a variant is then any path of
bench/paths.py: auth-off, all-policies, no-metering, metered, ...): the gateway under
Hypercorn on a loopback port (paths.py's config for the path), bench/stub.py as its upstream in a child
process, and a keep-alive HTTP/1.1 client on a thread of its own (not traced) sending the
path's request one after another. That adds what the in-process figure leaves out (h11, the
ASGI server, the sockets of both legs), which every path pays alike. `path@N` (say
`auth-off@16 auth-off@64`) has N client threads on N connections keep N calls in flight (the
traced loop is the slow side, so they do): what a call costs more when more are in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, os.getcwd())  # the checkout to measure
sys.path.insert(1, str(Path(__file__).resolve().parent))

import httpx
import inprocess
import paths
from procs import Processes, free_port

from proxy.config import from_dict
from proxy.runtime.app import create_app

Where = tuple[str, int, str]  # a function: file, first line, name


class Counts:
    """Bytecodes and calls by function, of the traced thread."""

    def __init__(self) -> None:
        self.ops: Counter[Where] = Counter()
        self.calls: Counter[Where] = Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        where = (code.co_filename, code.co_firstlineno, code.co_name)
        if event == "opcode":
            self.ops[where] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            self.calls[where] += 1
        return self.trace


async def measure(variant: str, calls: int) -> Counts:
    name, _, without = variant.partition(":")
    if name not in ("auth-off", "all-policies"):
        raise SystemExit(f"a variant is auth-off or all-policies[:part], not {variant!r}")
    secret = "s" * 64  # the same bearer every run: the same bytecodes
    counts = Counts()
    with tempfile.TemporaryDirectory() as tmp:
        if name == "all-policies":
            raw = inprocess.every_policy(tmp, "memory", "opcodes:", secret)
            if without:
                inprocess.leave_out(raw, without)
            extra = [(b"authorization", inprocess.bearer(secret).encode())]
        else:
            raw = inprocess.config(tmp, "memory", "opcodes:", False, secret)
            extra = []
        app = create_app(from_dict(raw, env={}),
                         upstream_transport=httpx.MockTransport(inprocess.upstream),
                         resolver=inprocess.Resolver())
        async with app.test_app():
            await inprocess.answered(app, extra)
            for _ in range(200):  # caches filled, first-call paths behind
                await inprocess.one_call(app, extra)
            sys.settrace(counts.trace)
            try:
                for _ in range(calls):
                    await inprocess.one_call(app, extra)
            finally:
                sys.settrace(None)
    return counts


async def measure_served(variant: str, calls: int, stub_port: int) -> Counts:
    """`variant`'s path served by Hypercorn in this process in front of the stub on
    `stub_port`, called over loopback by client threads (`path@N`: N of them, each on its own
    keep-alive connection, so that N calls are in flight; 1 without `@`); the loop's thread
    traced over `calls` calls after 200."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HyperConfig

    name, _, clients_text = variant.partition("@")
    clients = int(clients_text or 1)
    path = paths.PATHS.get(name)
    if path is None or clients < 1:
        raise SystemExit(f"--served: a path of bench/paths.py ({', '.join(paths.PATHS)}), "
                         f"optionally @N for N concurrent clients, not {variant!r}")
    port = free_port()
    traced = Counts()
    with tempfile.TemporaryDirectory() as tmp:
        secret = "s" * 64
        text = paths.config_text(path, port, stub_port, Path(tmp), secret)
        app = create_app(from_dict(tomllib.loads(text), env={}))
        hc = HyperConfig()
        hc.bind = [f"127.0.0.1:{port}"]
        hc.accesslog = None
        hc.backlog = max(hc.backlog, clients)
        stop = asyncio.Event()
        server = asyncio.get_running_loop().create_task(
            serve(app, hc, shutdown_trigger=stop.wait))
        headers = {"content-type": "application/json",
                   "accept": "application/json, text/event-stream", **path.headers()}
        if path.policies:
            headers["authorization"] = paths.bearer(secret)
        loop = asyncio.get_running_loop()
        warm, done = asyncio.Event(), asyncio.Event()
        begin = threading.Event()
        failure: list[str] = []
        # every client warms up, then waits at `warmed` (nothing in flight) until tracing
        # starts; then they share `calls` tickets, and `finished` is passed once all are answered
        warmed = threading.Barrier(clients, action=lambda: loop.call_soon_threadsafe(warm.set))
        finished = threading.Barrier(clients, action=lambda: loop.call_soon_threadsafe(done.set))
        tickets = iter(range(calls))
        lock = threading.Lock()

        def give_up(why: str) -> None:
            failure.append(why)
            warmed.abort()
            finished.abort()
            loop.call_soon_threadsafe(warm.set)
            loop.call_soon_threadsafe(done.set)

        def connect() -> http.client.HTTPConnection | None:
            deadline = time.monotonic() + 30
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    conn.connect()
                    return conn
                except OSError:
                    if time.monotonic() > deadline:
                        give_up("the gateway did not listen")
                        return None
                    time.sleep(0.05)  # (a thread polling a port to a deadline)

        def call(conn: http.client.HTTPConnection) -> bool:
            conn.request("POST", "/mcp/bench", path.body(), headers)
            answer = conn.getresponse()
            body = answer.read()
            if answer.status != 200 or b'"result"' not in body:
                give_up(f"answered {answer.status}: {body[:200]!r}")
                return False
            return True

        def client() -> None:
            conn = connect()
            if conn is None:
                return
            try:
                for _ in range(-(-200 // clients)):
                    if not call(conn):
                        return
                warmed.wait()
                begin.wait()
                while True:
                    with lock:
                        ticket = next(tickets, None)
                    if ticket is None or not call(conn):
                        break
                finished.wait()
            except threading.BrokenBarrierError:
                pass
            except Exception as exc:  # noqa: BLE001 - reported as the run's failure
                give_up(f"client: {exc!r}")
            finally:
                conn.close()

        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        await warm.wait()
        sys.settrace(traced.trace)
        begin.set()
        try:
            await done.wait()
        finally:
            sys.settrace(None)
            begin.set()
            stop.set()
            await server
            for thread in threads:
                thread.join()
        if failure:
            raise SystemExit(f"{variant} (served): {failure[0]}")
    return traced


def short(where: Where) -> str:
    path = where[0].split("site-packages/")[-1].replace(os.getcwd() + "/", "")
    return f"{path}:{where[1]} {where[2]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", default=["auth-off", "all-policies"],
                        help="one variant, or two to set side by side (B against A)")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--served", action="store_true",
                        help="under Hypercorn, over loopback, with bench/stub.py upstream")
    args = parser.parse_args()
    if not 1 <= len(args.variants) <= 2:
        parser.error("one or two variants")
    if args.served:
        with tempfile.TemporaryDirectory() as logdir:
            procs = Processes(Path(logdir))
            try:
                stub = procs.start_stub()
                measured = [asyncio.run(measure_served(v, args.calls, stub.port))
                            for v in args.variants]
            finally:
                procs.stop_all()
    else:
        measured = [asyncio.run(measure(v, args.calls)) for v in args.variants]
    n = args.calls
    for variant, counts in zip(args.variants, measured, strict=True):
        print(f"{variant}: {sum(counts.ops.values()) / n:,.0f} bytecodes a call, "
              f"{sum(counts.calls.values()) / n:,.1f} Python calls")
    if len(measured) == 1:
        print("\n  bytecodes  calls  function")
        for where, ops in measured[0].ops.most_common(args.top):
            print(f"  {ops / n:9.1f} {measured[0].calls[where] / n:6.1f}  {short(where)}")
        return
    a, b = measured
    total_a, total_b = sum(a.ops.values()), sum(b.ops.values())
    print(f"{args.variants[1]} against {args.variants[0]}: {(total_b - total_a) / n:+,.0f} "
          f"bytecodes a call ({total_b / total_a:.3f} x)")
    by_file: Counter[str] = Counter()
    for where in a.ops.keys() | b.ops.keys():
        by_file[short(where).split(":")[0]] += b.ops[where] - a.ops[where]
    print("\n  difference by file")
    for path, ops in by_file.most_common(args.top):
        if ops:
            print(f"  {ops / n:+9.1f}  {path}")
    rows = sorted(a.ops.keys() | b.ops.keys(), key=lambda w: b.ops[w] - a.ops[w], reverse=True)
    print(f"\n  difference by function ({args.variants[0]} -> {args.variants[1]}, a call)")
    for where in rows[:args.top]:
        diff = b.ops[where] - a.ops[where]
        if diff:
            print(f"  {diff / n:+9.1f}  {a.ops[where] / n:7.1f} -> {b.ops[where] / n:7.1f}  "
                  f"calls {(b.calls[where] - a.calls[where]) / n:+5.1f}  {short(where)}")


if __name__ == "__main__":
    main()

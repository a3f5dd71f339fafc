"""Behaviour checks for candidate httpx transports (no load, 127.0.0.1 only).

(a) SSE is relayed incrementally: the client sees event 1 before the upstream sends event 2
    (the upstream waits on an asyncio.Event that the client sets, at most 1 s);
(b) closing a streamed response early (aclose) gives its connection back: a pool of 1
    serves several early-closed streams in a row, then a normal request;
(c) failures surface as httpx exception types: ConnectError, ReadTimeout, RemoteProtocolError;
(d) a request that finds the pool full and held fails with PoolTimeout;
(e) a cookie set by the upstream is not sent again on the client's next request.

Usage: ``.venv/bin/python bench/check_transport.py [--clients httpx,httpx-aiohttp,httpx-aiohttp-mapped,...]``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

from aiohttp_transport import MappedAiohttpTransport, no_cookie_jar
from faulty_upstream import FaultyUpstream
from procs import free_port

Check = Callable[[Any, ModuleType, FaultyUpstream], Awaitable[str]]


def make_client(kind: str, max_connections: int = 10) -> tuple[Any, ModuleType]:
    """An AsyncClient of the given kind, and the module whose exception classes it should raise."""
    mod: ModuleType
    if kind.startswith("httpx2"):
        import httpx2 as mod
    else:
        import httpx as mod
    limits = mod.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    timeout = mod.Timeout(5.0, read=0.5, pool=2.0)
    transport: Any = None  # an httpx or httpx2 AsyncBaseTransport
    if kind == "tollhouse":  # the gateway's own transport, as proxy/upstream/client.py sets it up
        from proxy.upstream.transport import AiohttpTransport as TollhouseTransport

        transport = TollhouseTransport(max_connections=max_connections)
    elif kind == "httpx-aiohttp-mapped":
        transport = MappedAiohttpTransport(max_connections)
    elif kind.endswith("-aiohttp"):
        if mod.__name__ == "httpx2":
            from httpx_aiohttp.httpx2 import AiohttpTransport as Httpx2AiohttpTransport

            transport = Httpx2AiohttpTransport(limits=limits)
        else:
            from httpx_aiohttp import AiohttpTransport

            transport = AiohttpTransport(limits=limits)
    cookies = no_cookie_jar() if kind == "httpx-aiohttp-mapped" else None
    client = mod.AsyncClient(limits=limits, timeout=timeout, transport=transport, trust_env=False, cookies=cookies)
    return client, mod


async def check_sse(client: Any, mod: ModuleType, up: FaultyUpstream) -> str:
    up.reset_sse()
    seen: list[tuple[float, bytes]] = []
    async with client.stream("GET", up.url("/sse")) as r:
        async for chunk in r.aiter_raw():
            seen.append((time.monotonic(), chunk))
            up.release.set()
    first_at = next((t for t, c in seen if b'"n":1' in c), None)
    if first_at is None or up.second_sent_at is None:
        return f"FAIL: event 1 never seen ({len(seen)} chunks)"
    lead_ms = (up.second_sent_at - first_at) * 1000
    if first_at <= up.second_sent_at:
        return f"PASS: event 1 seen {lead_ms:.1f} ms before event 2 was sent ({len(seen)} chunks)"
    return f"FAIL: event 1 only seen {-lead_ms:.1f} ms after event 2 was sent (buffered)"


async def check_aclose(client: Any, mod: ModuleType, up: FaultyUpstream) -> str:
    """client must have a pool of 1 connection."""
    rounds = 5
    opened_before = up.total_connections
    for _ in range(rounds):
        r = await client.send(client.build_request("GET", up.url("/sse-hold")), stream=True)
        chunks = r.aiter_raw()  # kept referenced: only aclose() may free the connection
        await chunks.__anext__()
        await r.aclose()
        del chunks
    ok = await client.get(up.url("/ok"))
    deadline = time.monotonic() + 2.0
    while up.open_connections > 1 and time.monotonic() < deadline:  # the /ok one may stay pooled
        await asyncio.sleep(0.02)
    opened = up.total_connections - opened_before
    detail = (f"{rounds} early-closed streams + 1 request on a pool of 1: status {ok.status_code}; "
              f"{opened} upstream connections opened, {up.open_connections} still open")
    return ("PASS: " if ok.status_code == 200 and up.open_connections <= 1 else "FAIL: ") + detail


async def _expect(client: Any, mod: ModuleType, url: str, expected: str, stream: bool = False) -> str:
    want = getattr(mod, expected)
    try:
        if stream:
            async with client.stream("GET", url) as r:
                await r.aread()
        else:
            await client.get(url)
    except Exception as exc:  # noqa: BLE001 - the point is to see what comes out
        name = f"{type(exc).__module__}.{type(exc).__qualname__}"
        if isinstance(exc, want):
            return f"PASS ({name})"
        verdict = "FAIL, still an httpx error" if isinstance(exc, mod.HTTPError) else "FAIL, not an httpx error"
        return f"{verdict}: {name}: {str(exc)[:80]}"
    return "FAIL: no exception"


async def check_errors(client: Any, mod: ModuleType, up: FaultyUpstream) -> str:
    cases = [
        ("refused port", f"http://127.0.0.1:{free_port()}/x", "ConnectError"),
        ("no answer", up.url("/hang"), "ReadTimeout"),
        ("closed before answer", up.url("/close"), "RemoteProtocolError"),
        ("not HTTP", up.url("/garbage"), "RemoteProtocolError"),
        ("body cut short", up.url("/short"), "RemoteProtocolError"),
    ]
    results = [f"{label} → {expected}: {await _expect(client, mod, url, expected)}"
               for label, url, expected in cases]
    return "; ".join(results)


async def check_pool_timeout(client: Any, mod: ModuleType, up: FaultyUpstream) -> str:
    """client must have a pool of 1 connection."""
    async with client.stream("GET", up.url("/sse-hold")) as held:
        chunks = held.aiter_raw()  # kept referenced so the connection stays in use
        await chunks.__anext__()
        started = time.monotonic()
        result = await _expect(client, mod, up.url("/ok"), "PoolTimeout")
        del chunks
    return f"{result} after {time.monotonic() - started:.1f} s"


async def check_cookies(client: Any, mod: ModuleType, up: FaultyUpstream) -> str:
    await client.get(up.url("/set-cookie"))
    sent = (await client.get(up.url("/cookie"))).content
    return f"FAIL: next request carried Cookie: {sent.decode()}" if sent else "PASS: no cookie carried over"


CHECKS: dict[str, tuple[Check, int]] = {
    "(a) SSE incremental": (check_sse, 10),
    "(b) aclose releases connection": (check_aclose, 1),
    "(c) exception types": (check_errors, 10),
    "(d) pool exhausted": (check_pool_timeout, 1),
    "(e) cookie carry-over": (check_cookies, 10),
}


async def run_checks(kinds: list[str]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    async with FaultyUpstream() as up:
        for kind in kinds:
            for label, (check, pool) in CHECKS.items():
                client, mod = make_client(kind, pool)
                try:
                    result = await asyncio.wait_for(check(client, mod, up), 30)
                except Exception as exc:  # noqa: BLE001 - report, go on with the next check
                    result = f"FAIL: {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
                finally:
                    await client.aclose()
                rows.append((kind, label, result))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", default="httpx,httpx-aiohttp,httpx-aiohttp-mapped,httpx2,httpx2-aiohttp")
    kinds = [k.strip() for k in parser.parse_args().clients.split(",") if k.strip()]
    rows = asyncio.run(run_checks(kinds))
    print("| client | check | result |\n|---|---|---|")
    for kind, label, result in rows:
        print(f"| {kind} | {label} | {result} |")


if __name__ == "__main__":
    main()

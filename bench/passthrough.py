"""Bare pass-through: the floor of what the Quart + Hypercorn + HTTP-client stack costs.

One route, ``POST /mcp/<name>``: read the body, forward it to the upstream,
return the upstream's status, body and content type. No policy, no parsing.

Usage: ``python bench/passthrough.py --port 8000 --upstream http://127.0.0.1:9000/mcp --transport tuned``
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from asgi_passthrough import create_asgi_app
from hypercorn.asyncio import serve
from hypercorn.config import Config
from quart import Quart, Response, request
from transports import FORWARD_HEADERS, TRANSPORTS, Forwarder, make_forwarder


def create_app(upstream: str, transport: str, stream: bool) -> Quart:
    app = Quart(__name__)
    app.config.update(RESPONSE_TIMEOUT=None, BODY_TIMEOUT=None)
    state: dict[str, Forwarder] = {}

    @app.before_serving
    async def open_client() -> None:
        state["client"] = make_forwarder(transport)

    @app.after_serving
    async def close_client() -> None:
        await state["client"].aclose()

    @app.post("/mcp/<name>")
    async def mcp(name: str) -> Response:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        headers = {k: v for k in FORWARD_HEADERS if (v := request.headers.get(k)) is not None}
        up = await state["client"].forward(upstream, body, headers, stream)
        return Response(up.body, status=up.status, content_type=up.content_type)

    return app


def hypercorn_config(port: int, keep_alive_max_requests: int) -> Config:
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.backlog = 1024
    config.keep_alive_max_requests = keep_alive_max_requests
    return config


def shutdown_on_signal() -> Callable[[], Awaitable[None]]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def wait() -> None:
        await stop.wait()

    return wait


async def main_async(args: argparse.Namespace) -> None:
    app: Any
    if args.app == "asgi":
        app = create_asgi_app(args.upstream, args.transport, args.stream)
    else:
        app = create_app(args.upstream, args.transport, args.stream)
    config = hypercorn_config(args.port, args.keep_alive_max_requests)
    await serve(app, config, shutdown_trigger=shutdown_on_signal())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:9000/mcp")
    parser.add_argument("--transport", default="tuned", choices=sorted(TRANSPORTS))
    parser.add_argument("--stream", action="store_true", help="relay the upstream body as a stream")
    parser.add_argument("--app", default="quart", choices=["quart", "asgi"],
                        help="a Quart route (default) or a raw ASGI app without Quart")
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    parser.add_argument("--keep-alive-max-requests", type=int, default=1000,
                        help="Hypercorn closes a client connection after this many requests (its default: 1000)")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main_async(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

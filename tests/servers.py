"""Hypercorn on a loopback socket that is listening before the server starts: connections
queue in the backlog from the first moment, and Hypercorn accepts them once the app's lifespan
startup is done, so no test polls for readiness or sleeps."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HyperConfig


@asynccontextmanager
async def serve(app: Any, *, graceful_timeout: float = 5.0,
                sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Run an ASGI app on Hypercorn at a free loopback port (or on `sock`, from
    `bound_socket()`, when the app must know its URL before it exists); yield its base URL."""
    if sock is None:
        sock, _ = bound_socket()
    port = sock.getsockname()[1]
    cfg = HyperConfig()
    cfg.bind = [f"fd://{sock.detach()}"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = graceful_timeout
    stop = asyncio.Event()
    task = asyncio.create_task(hypercorn_serve(app, cfg, shutdown_trigger=stop.wait))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)




def bound_socket(host: str = "127.0.0.1") -> tuple[socket.socket, str]:
    """A loopback socket, bound and listening, and the base URL it will serve. Another
    loopback `host` (127.0.0.2) is another site to a browser: cookies are per host, not port."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(128)
    return sock, f"http://{host}:{sock.getsockname()[1]}"

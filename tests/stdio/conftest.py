"""A gateway in front of a stdio upstream `local` that runs tests/stdio/server.py (the
official Python SDK's stdio server) as its child process."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from proxy.config import from_dict
from proxy.upstream.stdio import StdioTransport
from tests import db_backends, state_backends
from tests.conftest import RunningGateway, running_gateway

SERVER = str(Path(__file__).with_name("server.py"))
TINY = str(Path(__file__).with_name("tiny.py"))


def stdio_upstream(**settings: Any) -> dict[str, Any]:
    return {"name": "local", "transport": "stdio", "command": sys.executable,
            "args": [SERVER], "env": {"STDIO_TEST": "configured"}, **settings}


@asynccontextmanager
async def stdio_gateway(config: dict[str, Any] | None = None, **settings: Any
                        ) -> AsyncIterator[RunningGateway]:
    raw = {"database": {"url": db_backends.url()}, "state": state_backends.state(),
           "upstreams": [stdio_upstream(**settings)], **(config or {})}
    async with running_gateway(from_dict(raw, env={})) as gw:
        yield gw


def transport_of(gw: RunningGateway, name: str = "local") -> StdioTransport:
    route = gw.gateway.routes[name]
    assert isinstance(route.transport, StdioTransport)
    return route.transport


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children() -> set[int]:
    """This process's children (every state, zombies too)."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == me:
                out.add(int(entry))
    return out


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))

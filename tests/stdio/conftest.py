"""A gateway in front of a stdio upstream `local` that runs tests/stdio/server.py (the
official Python SDK's stdio server) as its child process."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or before the read
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return _state(pid) not in (None, "Z")


def described(pids: set[int]) -> list[str]:
    """Each process's pid, state and command line (for a failure's message)."""
    out = []
    for pid in sorted(pids):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (FileNotFoundError, ProcessLookupError):
            cmd = ""
        out.append(f"{pid} {_state(pid) or 'gone'} {cmd[:120]}")
    return out


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


def descriptors(*service_urls: str | None) -> int:
    """The process's open descriptors, less its TCP connections to each service named (the
    Redis state store's pool and the PostgreSQL database's connections, which open as
    concurrency first needs them: how many depends on the machine's timing, and none of them
    is a leak)."""
    fds = os.listdir("/proc/self/fd")
    urls = [u for u in service_urls if u]
    if not urls:
        return len(fds)
    inodes = _socket_inodes(fds)
    return len(fds) - len(set().union(*(_sockets_to(u) for u in urls)) & inodes)


def open_files() -> list[str]:
    """What each open descriptor is (a path, `socket:[inode]`, `pipe:[inode]`...), sorted:
    what a leak assertion shows beside its count."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return sorted(out)


def _socket_inodes(fds: list[str]) -> set[str]:
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _sockets_to(url: str) -> set[str]:
    """Inodes of this process's TCP sockets whose remote port is the service's."""
    port = urlsplit(url).port or (5432 if url.startswith("postgres") else 6379)
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    return inodes

"""What a stdio server cannot do to the gateway that runs it, with `tollhouse serve` as a process
of its own (as deployed): read the gateway's environment (its secrets) through /proc, find the
gateway's files in its working directory, or outlive the gateway, even a kill -9 of it, with a
process in its group or one that left the group with setsid.

When the tests run as root the gateway is started with no capabilities (each dropped from the
bounding set before exec, so neither it nor its children have any): root with them reads any
process's environment whatever the gateway does. Root without them is an ordinary user that
owns the files, as the issue's reproduction had it by running the gateway as `nobody`."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import types

from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S, serving_port, until
from tests.replicas.harness import toml
from tests.stdio.conftest import SERVER, alive

SECRET = "tollhouse-test-secret-6f1c9a"  # in the gateway's environment only
PR_CAPBSET_DROP = 24
REPO = Path(__file__).resolve().parents[2]


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


def _unprivileged() -> None:
    """Before exec: every capability out of the bounding set (root's capabilities after exec)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        for cap in range(last + 1):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


@asynccontextmanager
async def gateway_process(tmp_path: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process,
                                                                  str]]:
    """`tollhouse serve` in `tmp_path` (its working directory, with its database there),
    TOLLHOUSE_SECRET_KEY in its environment, one stdio upstream `local`; (process, endpoint)."""
    config = tmp_path / "c.toml"
    config.write_text(toml({
        "server": {"listen": "127.0.0.1:0"}, "auth": {"mode": "none"},
        "database": {"url": "sqlite:///tollhouse.db"},
        "upstreams": [{"name": "local", "transport": "stdio", "command": sys.executable,
                       "args": [SERVER]}]}))
    env = {**os.environ, "TOLLHOUSE_SECRET_KEY": SECRET,
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                       os.environ.get("PYTHONPATH"))))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--config", str(config), cwd=tmp_path, env=env,
        stderr=asyncio.subprocess.PIPE, preexec_fn=_unprivileged)
    assert proc.stderr is not None
    port = None
    try:
        port = await serving_port(proc, [])
        drain = asyncio.create_task(proc.stderr.read())  # never a full pipe
        yield proc, f"http://127.0.0.1:{port}/mcp/local"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), DEADLINE_S * 3)
        if port is not None:
            await drain


async def test_a_child_reads_neither_the_gateways_environment_nor_its_directory(
        tmp_path: Path) -> None:
    async with gateway_process(tmp_path) as (proc, endpoint), connect(endpoint) as client:
        peeked: Any = (await client.call_tool("peek", {"marker": SECRET})).structured_content
        assert (tmp_path / "tollhouse.db").exists()
    assert peeked["read"] == [], (proc.pid, peeked)  # the gateway (and the keeper) are not dumpable
    assert any(f"/proc/{proc.pid}/environ" in r for r in peeked["refused"]), peeked
    assert "tollhouse.db" not in peeked["here"] and "c.toml" not in peeked["here"]


async def test_nothing_a_child_started_outlives_a_kill_9_of_the_gateway(tmp_path: Path) -> None:
    async with gateway_process(tmp_path) as (proc, endpoint), \
            connect(endpoint, terminate_on_close=False) as client:
        server = int(text(await client.call_tool("pid", {})))
        in_group = int(text(await client.call_tool("spawn_child", {})))
        detached = int(text(await client.call_tool("spawn_detached", {})))
        facts: Any = (await client.call_tool("confinement", {})).structured_content
        keeper = facts["ppid"]
        started = (keeper, server, in_group, detached)
        assert all(alive(pid) for pid in started)
        proc.kill()  # SIGKILL: the gateway stops nothing itself
        await proc.wait()
        await until(lambda: not any(alive(pid) for pid in started))

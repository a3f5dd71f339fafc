"""`server.event_loop = "uvloop"`: `tollhouse serve` on libuv's loop, driven by the SDK client
through a real upstream: a plain call, progress notifications on an SSE answer, a
server-to-client request (sampling) and a cancellation, the paths that use the loop's
sockets, timers and tasks differently."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import DEADLINE_S, serving_port
from tests.servers import serve

pytest.importorskip("uvloop")



def _config(path: Path, upstream: str, event_loop: str) -> Path:
    config = path / "c.toml"
    config.write_text(f"""
[server]
listen = "127.0.0.1:0"
event_loop = "{event_loop}"
[auth]
mode = "none"
[database]
url = "sqlite:///{path / 'g.db'}"
[[upstreams]]
name = "up"
url = "{upstream}/mcp"
""")
    return config


async def test_the_gateway_serves_on_uvloop(tmp_path: Path) -> None:
    app, probe = stateful_sse_app()
    async with serve(app) as upstream:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config",
            str(_config(tmp_path, upstream, "uvloop")), "--log-level", "debug",
            stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        seen: list[str] = []
        try:
            port = await serving_port(proc, seen)
            assert any("event loop: uvloop.Loop" in line for line in seen), seen
            progress: list[float] = []

            async def on_progress(value: float, total: float | None, message: str | None
                                  ) -> None:
                progress.append(value)

            async def on_sampling(context: Any, params: types.CreateMessageRequestParams
                                  ) -> types.CreateMessageResult:
                return types.CreateMessageResult(
                    role="assistant", model="m",
                    content=types.TextContent(type="text", text="sampled on uvloop"))

            async with connect(f"http://127.0.0.1:{port}/mcp/up",
                               sampling_callback=on_sampling) as client:
                echoed = await client.call_tool("echo", {"text": "hi"})
                assert echoed.content[0].text == "hi"
                stepped = await client.call_tool("slow_progress", {"steps": 3},
                                                 progress_callback=on_progress)
                assert not stepped.is_error
                sampled = await client.call_tool("ask_sampling", {"prompt": "p"})
                assert "sampled on uvloop" in sampled.content[0].text
                waiting = asyncio.create_task(client.call_tool("wait_forever", {}))
                async with asyncio.timeout(DEADLINE_S):
                    await probe.started.wait()
                waiting.cancel()
                async with asyncio.timeout(DEADLINE_S):
                    await probe.cancelled.wait()  # the cancellation reached the upstream
            assert progress == [1, 2, 3]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), DEADLINE_S * 3)
            rest = (await proc.stderr.read()).decode()
    assert code == 0, "".join(seen) + rest
    assert "Traceback" not in "".join(seen) + rest

"""`tollhouse demo`: the embedded default a newcomer starts first, driven by the SDK client."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

from tests.e2e.sdk_client import connect


async def test_demo_serves_a_working_mcp_url(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "demo", "--port", "0", "--db", str(tmp_path / "d.db"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        match = re.search(r"(http://127\.0\.0\.1:\d+/mcp/demo)", line)
        assert match, line
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async with connect(match.group(1)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["echo", "add", "count"]
            assert (await client.call_tool("add", {"a": 2, "b": 3})).content[0].text == "5.0"
            counted = await client.call_tool("count", {"to": 3}, progress_callback=on_progress)
            assert counted.content[0].text == "counted to 3"
        assert progress == [1, 2, 3]
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 20)
        stderr = await proc.stderr.read() if proc.stderr else b""
    assert code == 0, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr

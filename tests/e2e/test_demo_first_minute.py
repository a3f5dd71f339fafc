"""`tollhouse demo`'s first minute (issue 46): what a newcomer needs first on stdout (the MCP URL
to paste, the console's address and one-time password, the audit command), and the start-up
details only at debug level: each migration of the fresh database, the event loop once."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

from proxy.storage import migrations
from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S

_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$")


async def test_the_demo_says_what_a_newcomer_needs_and_keeps_start_up_at_debug(
        tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "demo", "--port", "0", "--db", str(db),
        "--log-level", "debug", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        banner = [(await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S * 3)).decode()
                  for _ in range(3)]
        url = re.search(r"MCP URL +(http://127\.0\.0\.1:(\d+)/mcp/demo)$", banner[0].strip())
        assert url, banner
        assert re.search(rf"web console: http://127\.0\.0\.1:{url.group(2)}/console/ .*"
                         r"one-time password \S+\)", banner[1]), banner
        assert f"tollhouse audit --db {db}" in banner[2], banner
        async with connect(url.group(1)) as client:  # up and serving: start-up is over
            assert (await client.call_tool("echo", {"text": "hi"})).content[0].text == "hi"
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), DEADLINE_S * 3)
    assert code == 0
    lines = [m.groups() for m in map(_LINE.match, (await proc.stderr.read()).decode()
                                     .splitlines()) if m]
    said = [(level, text) for level, logger, text in lines
            if logger in ("tollhouse", "tollhouse.migrations")]
    assert [t for lvl, t in said if "event loop:" in t and lvl == "DEBUG"] != []
    assert len([t for _, t in said if "event loop:" in t]) == 1, said
    assert ("INFO", f"database schema created at version {migrations.LATEST}") in said
    # one "Running on" line a newcomer may take for the URL: the gateway's (the demo's own
    # MCP server's goes to a logger of its own, shown at debug only)
    running = [logger for _, logger, text in lines if text.startswith("Running on")]
    assert sorted(running) == ["hypercorn.error", "tollhouse.demo.upstream"], lines
    applied = [lvl for lvl, t in said if "applied migration" in t]
    assert applied == ["DEBUG"] * len(migrations.MIGRATIONS), said

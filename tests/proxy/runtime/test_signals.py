"""Signals to a real `tollhouse serve` (one process; tests/proxy/runtime/test_workers.py has the
same with workers): SIGTERM drains (issue 15, item 5), SIGHUP reloads the config file
(item 7). Each test sends the signal itself and watches the process's log lines and answers;
the upstream's `hold` tool answers when the test says, so a call is in flight for as long as
the test needs and no test sleeps."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import orjson

from proxy.audit import query
from tests.e2e.upstreams import holding_app
from tests.helpers import DEADLINE_S, until
from tests.proxy.runtime.test_workers import Serve, _config, running
from tests.servers import serve

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "t", "version": "1"}}}
REFUSED = {"code": -32000, "message": "Resident runtime unavailable"}


def _call(request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}


async def _session(gw: Serve) -> dict[str, str]:
    init = await gw.request("POST", "/mcp/up", INIT)
    assert init.status == 200, init.body
    headers = {"MCP-Protocol-Version": "2025-11-25"}
    if "mcp-session-id" in init.headers:
        headers["Mcp-Session-Id"] = init.headers["mcp-session-id"]
    return headers


def _single(tmp_path: Path, upstream: str, extra: str = "", listen: str = "127.0.0.1:0"
            ) -> Path:
    """One process (workers = 1, live state in memory), endpoint `up`; `extra` is TOML that
    follows the [[upstreams]] table (so `[upstreams.access]` belongs to it)."""
    config = _config(tmp_path, upstream=upstream, workers=1, listen=listen)
    config.write_text(config.read_text() + extra)
    return config


async def test_sigterm_refuses_what_is_new_finishes_what_runs_and_exits_0(
        tmp_path: Path) -> None:
    app, started, release = holding_app()
    async with serve(app, graceful_timeout=1) as upstream:
        config = _single(tmp_path, f"{upstream}/mcp")
        async with running(config, None) as gw:
            session = await _session(gw)
            call = asyncio.create_task(gw.request("POST", "/mcp/up", _call(1, "hold"),
                                                  session))
            await asyncio.wait_for(started.wait(), DEADLINE_S)

            gw.proc.send_signal(signal.SIGTERM)
            await until(lambda: "draining: new sessions and calls are refused" in gw.text,
                        what="the drain to begin")
            refused = await gw.request("POST", "/mcp/up", _call(2, "echo", text="x"), session)
            assert refused.status == 503, refused.body
            assert refused.headers["retry-after"] == "1"
            assert orjson.loads(refused.body) == {"jsonrpc": "2.0", "id": 2, "error": REFUSED}
            fresh = await gw.request("POST", "/mcp/up", INIT)  # a new session: refused too
            assert fresh.status == 503 and "mcp-session-id" not in fresh.headers
            assert (await gw.healthy()).status == 200  # alive while it drains

            assert not call.done()  # still waiting on the upstream
            release.set()
            reply = await asyncio.wait_for(call, DEADLINE_S)
            assert reply.status == 200, reply.body
            assert reply.rpc()["result"]["content"][0]["text"] == "released"
            assert await gw.exited() == 0, gw.text
    records = query(f"sqlite:///{tmp_path / 't.db'}", limit=100)
    by_id = {r["request_id"]: r for r in records if r["method"] == "tools/call"}
    assert by_id["1"]["status"] == "ok" and by_id["1"]["tool"] == "hold"
    assert by_id["2"]["status"] == "error" and by_id["2"]["error_message"] == "draining"


def _reload_lines(gw: Serve) -> list[str]:
    return [line for line in gw.lines if "config reload" in line]


async def _reload(gw: Serve, config: Path, text: str) -> str:
    """Write `text` to the config file, SIGHUP, and return the reload's one log line."""
    before = len(_reload_lines(gw))
    config.write_text(text)
    gw.proc.send_signal(signal.SIGHUP)
    await until(lambda: len(_reload_lines(gw)) > before, what="the reload's log line")
    lines = _reload_lines(gw)
    assert len(lines) == before + 1, lines
    return lines[-1]


async def test_sighup_applies_rules_to_the_next_call_and_refuses_a_broken_file(
        tmp_path: Path) -> None:
    app, started, release = holding_app()
    async with serve(app, graceful_timeout=1) as upstream:
        config = _single(tmp_path, f"{upstream}/mcp")
        original = config.read_text()
        async with running(config, None) as gw:
            session = await _session(gw)
            # server.gc_freeze is on by default: start-up froze, each reload below freezes again
            assert "objects of start-up frozen (server.gc_freeze)" in gw.text, gw.text
            # and the collector's threshold and timed collections, server.gc_threshold and
            # server.gc_sweep_s at their defaults
            assert ("gc: young threshold 10000 (server.gc_threshold), timed collections every "
                    "1 s (server.gc_sweep_s)") in gw.text, gw.text
            ok = await gw.request("POST", "/mcp/up", _call(1, "echo", text="before"), session)
            assert ok.rpc()["result"]["content"][0]["text"] == "before"
            held = asyncio.create_task(gw.request("POST", "/mcp/up", _call(2, "hold"),
                                                  session))
            await asyncio.wait_for(started.wait(), DEADLINE_S)

            # echo hidden, and tools/list at most once an hour, from the next call on
            tightened = original + (
                '[upstreams.access]\ntools_deny = ["echo", "hold"]\n'
                '[[rate_limits]]\nname = "tight"\nmethods = ["tools/list"]\nrate = "1/h"\n')
            line = await _reload(gw, config, tightened)
            assert "config reloaded from" in line and "restart" not in line, line
            denied = await gw.request("POST", "/mcp/up", _call(3, "echo", text="after"),
                                      session)
            assert denied.status == 400 and denied.rpc()["error"]["code"] == -32602
            listed = await gw.request("POST", "/mcp/up", {"jsonrpc": "2.0", "id": 4,
                                                          "method": "tools/list"}, session)
            assert listed.status == 200, listed.body
            assert listed.rpc()["result"]["tools"] == []  # the profile hides both
            limited = await gw.request("POST", "/mcp/up", {"jsonrpc": "2.0", "id": 5,
                                                           "method": "tools/list"}, session)
            assert limited.status == 429 and "retry-after" in limited.headers
            # the call that began before the reload finishes on the rules it began with
            release.set()
            finished = await asyncio.wait_for(held, DEADLINE_S)
            assert finished.rpc()["result"]["content"][0]["text"] == "released"

            # a file that fails validation: one line naming the key, nothing changes
            line = await _reload(gw, config, tightened + "[server.extra]\nbogus = 1\n")
            assert "refused, nothing changed" in line and "server.extra" in line, line
            still = await gw.request("POST", "/mcp/up", _call(6, "echo", text="x"), session)
            assert still.status == 400 and still.rpc()["error"]["code"] == -32602

            # the rules loosened again, and a new listen address: that one waits a restart
            moved = original.replace('listen = "127.0.0.1:0"', 'listen = "127.0.0.1:1"')
            line = await _reload(gw, config, moved)
            assert "keep their running values until a restart: server.listen" in line, line
            again = await gw.request("POST", "/mcp/up", _call(7, "echo", text="again"),
                                     session)  # on the port it listened on all along
            assert again.rpc()["result"]["content"][0]["text"] == "again"
            gw.proc.send_signal(signal.SIGTERM)
            assert await gw.exited() == 0, gw.text

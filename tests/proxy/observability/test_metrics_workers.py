"""`[server] workers` = 2: a scrape lands on one worker and still reports the whole gateway
(prometheus-client's multiprocess mode on the run's own directory). Real `tollhouse serve`
processes, the harness of tests/proxy/runtime/test_workers.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import until
from tests.proxy.runtime.test_workers import _config, _redis_state, prefix, running
from tests.servers import serve

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc to see which process answered")
__all__ = ["prefix"]  # the fixture, shared with test_workers


def _calls(text: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "mcp_server_operation_duration_seconds_count"
               and s.labels.get("mcp_method_name") == "tools/call")


async def test_a_scrape_on_either_worker_counts_both_workers_calls(tmp_path: Path,
                                                                   prefix: str) -> None:
    app, _ = stateful_sse_app()
    async with serve(app, graceful_timeout=1) as upstream:
        config = _config(tmp_path, upstream=f"{upstream}/mcp", state=_redis_state(prefix))
        async with running(config, prefix) as gw:
            init = await gw.request("POST", "/mcp/up", {
                "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}})
            assert init.status == 200, init.body
            session = {"Mcp-Session-Id": init.headers["mcp-session-id"],
                       "MCP-Protocol-Version": "2025-11-25"}
            answered: set[int | None] = set()
            calls = 0

            async def call() -> bool:
                nonlocal calls
                calls += 1
                reply = await gw.request("POST", "/mcp/up", {
                    "jsonrpc": "2.0", "id": calls, "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": "hi"}}}, session)
                assert reply.status == 200, reply.body
                answered.add(reply.worker)
                return answered - {None} == gw.workers()

            await until(call, what="calls answered by both workers")
            scraped: dict[int | None, float] = {}

            async def scrape() -> bool:
                reply = await gw.request("GET", "/metrics")
                assert reply.status == 200, reply.body
                scraped[reply.worker] = _calls(reply.body.decode())
                return scraped.keys() - {None} == gw.workers()

            await until(scrape, what="a scrape answered by each worker")
            assert set(scraped.values()) == {calls}, (scraped, calls)

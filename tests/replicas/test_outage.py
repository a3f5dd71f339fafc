"""Item 6 through the load balancer: the Redis both replicas share goes away. Every request
that needs live state is answered 503 with Retry-After in the JSON-RPC shape, by whichever
replica the load balancer picks (its log shows both), nothing is forwarded, and once Redis is
back both replicas serve again without a restart. The Redis is the test's own redis-server."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson

from tests.conftest import MCP_HEADERS
from tests.e2e.upstreams import stateless_json_app
from tests.helpers import until
from tests.redis_server import private_redis
from tests.replicas.harness import open_cluster
from tests.replicas.test_limits import call, open_session
from tests.servers import serve


async def test_redis_away_is_503_on_every_replica_and_both_recover(tmp_path: Path) -> None:
    app, probe = stateless_json_app()
    with private_redis() as redis_server:
        async with serve(app, graceful_timeout=1) as upstream_url, \
                open_cluster(tmp_path, upstream_url, config={"state": {
                    "url": redis_server.url, "timeout_s": 0.25}}) as cluster, \
                httpx.AsyncClient(timeout=10) as client:
            headers = await open_session(client, cluster.endpoint)
            assert (await client.post(cluster.endpoint, headers=headers,
                                      content=call(1))).status_code == 200
            forwarded = len(probe.exchanges)

            redis_server.kill()
            mark = len(cluster.requests())
            for i in range(4):  # round robin: two on each replica
                answer = await client.post(cluster.endpoint, headers=headers,
                                           content=call(10 + i))
                assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
                assert orjson.loads(answer.content)["error"] == {
                    "code": -32000, "message": "Resident runtime unavailable"}
            refused = cluster.requests()[mark:]
            assert {s.server for s in refused if s.status == 503} == {"r0", "r1"}
            assert len(probe.exchanges) == forwarded  # nothing reached the upstream

            redis_server.start()  # the same address, empty: each replica reconnects itself
            served: set[str] = set()

            async def both_serve() -> bool:
                mark = len(cluster.requests())
                fresh = await client.post(cluster.endpoint, headers=MCP_HEADERS,
                                          content=orjson.dumps({
                                              "jsonrpc": "2.0", "id": 0,
                                              "method": "initialize", "params": {
                                                  "protocolVersion": "2025-11-25",
                                                  "capabilities": {}, "clientInfo": {
                                                      "name": "t", "version": "1"}}}))
                if fresh.status_code == 200:
                    served.update(s.server for s in cluster.requests()[mark:]
                                  if s.status == 200)
                return served == {"r0", "r1"}

            await until(both_serve, what="both replicas serving again")

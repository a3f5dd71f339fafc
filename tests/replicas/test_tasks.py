"""Issue 38 item 1 across replicas: a task's binding lives in the shared state (Redis), so a
task created through one gateway process is served by the other. Two `tollhouse serve`
processes on one database and one Redis (`tests/replicas/harness.py`) in front of an
official-SDK upstream with one task store for every caller (`tests/e2e/task_upstream.py`);
each official SDK client (declaring task support) speaks to one replica's own address, so
which replica served each request is the address it went to."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import MCPError

from proxy.audit import query
from tests.e2e.sdk_client import SdkClient, connect
from tests.e2e.task_upstream import TaskUpstream
from tests.e2e.test_tasks import DECLARED, UNKNOWN, create, raw
from tests.helpers import jwt_auth, token, until
from tests.replicas.harness import Cluster, Replica, open_cluster
from tests.servers import serve


@asynccontextmanager
async def on(cluster: Cluster, replica: Replica, sub: str) -> Any:
    """`sub`'s official SDK client on `replica`'s own address."""
    headers = {"Authorization": f"Bearer {token(sub=sub, aud=cluster.endpoint)}"}
    async with connect(replica.endpoint, headers=headers, tasks=DECLARED) as client:
        yield client


async def listed(client: SdkClient) -> list[str]:
    return [t["taskId"] for t in (await raw(client, "tasks/list", {}))["tasks"]]


async def test_a_task_created_on_one_replica_is_served_by_the_other(tmp_path: Path) -> None:
    upstream = TaskUpstream(held=True)
    async with serve(upstream.app(json=True), graceful_timeout=1) as url, \
            open_cluster(tmp_path, url, era="legacy", config={"auth": jwt_auth()}) as cluster:
        a, b = cluster.replicas
        async with on(cluster, a, "alice") as alice_a, on(cluster, b, "alice") as alice_b, \
                on(cluster, b, "bob") as bob_b, on(cluster, a, "bob") as bob_a:
            task_id = await create(alice_a, "alice's merger")
            got = await raw(alice_b, "tasks/get", {"taskId": task_id})
            assert (got["taskId"], got["status"]) == (task_id, "working")
            for method in ("tasks/get", "tasks/result", "tasks/cancel"):
                with pytest.raises(MCPError) as caught:
                    await raw(bob_b, method, {"taskId": task_id})
                assert (caught.value.error.code, caught.value.error.message) == (
                    -32602, UNKNOWN), method
            bobs = await create(bob_a, "bob's holiday")
            assert await listed(alice_b) == [task_id]
            assert await listed(bob_b) == [bobs]
            assert upstream.runs[task_id].task.status == "working"  # bob's cancel never got there
            upstream.release.set()
            result = await raw(alice_b, "tasks/result", {"taskId": task_id})
            assert result["content"][0]["text"] == "report on alice's merger"
            # both replicas see the end: one completion record between them
            assert (await raw(alice_a, "tasks/get", {"taskId": task_id}))["status"] == "completed"
            assert (await raw(alice_b, "tasks/get", {"taskId": task_id}))["status"] == "completed"
            assert "report on bob's holiday" in str(
                await raw(bob_b, "tasks/result", {"taskId": bobs}))

            def audited() -> list[dict[str, Any]]:
                return query(cluster.database_url, limit=200)

            def complete() -> bool:
                rows = audited()
                return sum(r["method"] == "notifications/tasks/status" for r in rows) >= 2 and \
                    sum(r["method"] == "tasks/get" for r in rows) >= 4

            await until(complete, what="the tasks' records")
    rows = audited()
    ended = sorted((r["principal"], r["note"]) for r in rows
                   if r["method"] == "notifications/tasks/status")
    assert ended == [("alice", f"task {task_id} completed"), ("bob", f"task {bobs} completed")]
    refused = [r for r in rows if r["principal"] == "bob" and r["method"] in (
        "tasks/get", "tasks/result", "tasks/cancel") and r["status"] != "ok"]
    assert sorted(r["method"] for r in refused) == ["tasks/cancel", "tasks/get", "tasks/result"]
    assert all(r["status"] == "error" and r["tool"] is None for r in refused), refused

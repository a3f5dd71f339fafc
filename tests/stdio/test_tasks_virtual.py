"""MCP tasks (2025-11-25) through a virtual endpoint, end to end: the reference Node server
(`@modelcontextprotocol/server-everything`, pinned, from npm) as member `everything` of
/mcp/team beside the official Python SDK's stdio server (`py`, no tasks), reached by the
official SDK client (tasks exist in the 2025-11-25 era only: the 2026-07-28 tasks extension
has no SDK here). Issue 38: the task was created on the member, then tasks/get, tasks/result
and tasks/list answered -32601 and initialize advertised no tasks. The member is one stdio
process, so one task store for every caller: only the gateway's binding keeps a task its
creator's."""

from __future__ import annotations

import shutil
import sys
from typing import Any

import httpx
import pytest
from mcp import MCPError

from proxy.auth import keys as api_keys
from tests import db_backends
from tests.e2e.sdk_client import connect
from tests.e2e.test_tasks import Wire, statuses
from tests.helpers import jwt_auth, token, until
from tests.stdio import everything
from tests.stdio.conftest import SERVER, stdio_gateway, stdio_upstream
from tests.stdio.test_tasks import DECLARED, EMAIL, REDACT, TOOL, raw

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed: no Node stdio server to run")

EXPOSED = f"everything__{TOOL}"


@pytest.fixture(scope="module")
def installed() -> None:
    reason = everything.ensure()
    if reason is not None:
        pytest.skip(reason)


def _headers(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='team', sub=sub)}"}


def _gateway(config: dict[str, Any] | None = None, *, signed: bool = True, **endpoint: Any
             ) -> Any:
    members = [
        {"name": "everything", "transport": "stdio", "command": "npx",
         "args": ["--no-install", "mcp-server-everything", "stdio"],
         "cwd": str(everything.DIRECTORY), "env": {}, "start_timeout_s": 60},
        {**stdio_upstream(), "name": "py", "command": sys.executable, "args": [SERVER]},
    ]
    return stdio_gateway({**({"auth": jwt_auth()} if signed else {}), "upstreams": members,
                          "endpoints": [{"name": "team", "members": ["everything", "py"],
                                         **endpoint}], **(config or {})})


async def call_as_task(client: Any, topic: str) -> str:
    answer = await raw(client, "tools/call", {"name": EXPOSED, "arguments": {"topic": topic},
                                              "task": {"ttl": 60000}})
    return str(answer["task"]["taskId"])


async def finished(client: Any, task_id: str) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    async def done() -> bool:
        seen.append(await raw(client, "tasks/get", {"taskId": task_id}))
        return seen[-1]["status"] in ("completed", "failed", "cancelled")

    await until(done, 30, "the task to end")
    return seen[-1]


async def test_a_task_runs_through_the_endpoint_and_stays_its_creators(installed: None
                                                                       ) -> None:
    async with _gateway({"guardrails": REDACT}) as gw, \
            connect(gw.endpoint("team"), headers=_headers("alice"), tasks=DECLARED) as alice, \
            connect(gw.endpoint("team"), headers=_headers("mallory"),
                    tasks=DECLARED) as mallory:
        # the endpoint advertises the tasks its member offers, and the tool's task support
        caps = alice.initialize_result.capabilities
        assert caps.tasks is not None and caps.tasks.requests is not None
        assert caps.tasks.requests.tools is not None and caps.tasks.list is not None
        tools = {t.name: t for t in (await alice.list_tools()).tools}
        assert tools[EXPOSED].execution is not None
        assert tools[EXPOSED].execution.task_support == "required"

        task_id = await call_as_task(alice, f"mail {EMAIL}")
        member, _, own = task_id.partition("/")
        assert member == "everything" and own  # the member's id, prefixed with the member
        state = await finished(alice, task_id)
        assert state["taskId"] == task_id and state["status"] == "completed"
        result = await raw(alice, "tasks/result", {"taskId": task_id})
        text = result["content"][0]["text"]
        assert "Research Report" in text
        assert EMAIL not in text, "the task's result passed the result rule unread"
        related = (result.get("_meta") or {}).get("io.modelcontextprotocol/related-task")
        assert related is None or related["taskId"] == task_id

        listed = await raw(alice, "tasks/list", {})
        assert [t["taskId"] for t in listed["tasks"]] == [task_id]
        # mallory: alice's id, the member's own id, and one that does not exist, all alike
        errors = {}
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            for named in (task_id, own, "everything/no-such-task"):
                with pytest.raises(Exception) as caught:
                    await raw(mallory, method, {"taskId": named})
                errors[(method, named)] = str(caught.value)
        assert len(set(errors.values())) == 1 and "Task not found" in errors[
            ("tasks/get", task_id)]
        assert (await raw(mallory, "tasks/list", {}))["tasks"] == []

        async def ended() -> bool:
            return any(r.method == "notifications/tasks/status" for r in gw.audit.records)

        await until(ended, 10, "the task's completion record")
    records = gw.audit.records
    created = next(r for r in records if r.method == "tools/call")
    assert (created.endpoint, created.tool, created.task) == ("team", EXPOSED, task_id)
    # a task's later records name the tool as the member's policies decide it
    completion = [r for r in records if r.method == "notifications/tasks/status"]
    assert [(r.endpoint, r.tool, r.status, r.principal) for r in completion] == [
        ("team", TOOL, "ok", "alice")]
    fetched = next(r for r in records if r.method == "tasks/result" and r.status == "ok")
    assert "guardrail no-email: redact email in result" in (fetched.note or "")
    assert f"virtual: member everything, task {own}" in (fetched.note or "")


async def test_a_task_is_cancelled_on_its_member(installed: None) -> None:
    async with _gateway() as gw, \
            connect(gw.endpoint("team"), headers=_headers("alice"), tasks=DECLARED) as alice:
        task_id = await call_as_task(alice, "tides")
        cancelled = await raw(alice, "tasks/cancel", {"taskId": task_id})
        assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
        assert (await finished(alice, task_id))["status"] == "cancelled"
    completion = [r for r in gw.audit.records if r.method == "notifications/tasks/status"]
    assert [(r.status, r.note) for r in completion] == [
        ("cancelled", f"task {task_id} cancelled")]


async def test_the_tool_rules_of_the_endpoint_decide_a_tasks_requests(installed: None
                                                                      ) -> None:
    """A task created while the tool was allowed: once the endpoint's rules refuse the tool
    (here: for a caller outside the group), its tasks/* answer as a hidden tool, by the name
    the caller knows it by, and the merged tasks/list leaves it out (its status message
    would say what it researches)."""
    access = {"tools_allow": ["py__*"], "group_tools": {"research": {
        "tools_allow": ["everything__simulate-*"]}}}
    async with _gateway(access=access) as gw:
        claims = {"Authorization": "Bearer " + token(endpoint="team", sub="alice",
                                                     groups=["research"])}
        async with connect(gw.endpoint("team"), headers=claims, tasks=DECLARED) as member:
            task_id = await call_as_task(member, "tides")
            assert (await raw(member, "tasks/get", {"taskId": task_id}))["taskId"] == task_id
            assert listed(await raw(member, "tasks/list", {})) == [task_id]
        async with connect(gw.endpoint("team"), headers=_headers("alice"),
                           tasks=DECLARED) as left:
            with pytest.raises(Exception, match="Unknown tool") as caught:
                await raw(left, "tasks/get", {"taskId": task_id})
            assert EXPOSED in str(caught.value)
            assert listed(await raw(left, "tasks/list", {})) == []
    denied = [r for r in gw.audit.records if r.method == "tasks/get" and r.status == "denied"]
    assert len(denied) == 1 and (denied[0].denied_reason or "").startswith("access: tool")


def listed(answer: dict[str, Any]) -> list[str]:
    return [t["taskId"] for t in answer["tasks"]]


OPEN = 'permit(principal, action, resource);'
NO_RESEARCH = f'''forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"everything/{TOOL}");'''


async def test_a_cedar_policy_added_through_the_api_hides_a_task_from_the_merged_list(
        installed: None) -> None:
    """A Cedar policy added through /api/v1/policies after a task was created, forbidding
    every call of its tool (by the member's own name, as Cedar decides a virtual endpoint's
    call): the task's tasks/get answers as an unknown tool and the endpoint's merged tasks/list
    leaves it out; the policy deleted, the task is listed again."""
    _, secret = api_keys.create(db_backends.url(), "ops", [], role="admin")
    async with _gateway() as gw, \
            connect(gw.endpoint("team"), headers=_headers("alice"), tasks=DECLARED) as alice:
        api = {"Authorization": f"Bearer {secret}"}
        made = await gw.client.post(f"{gw.url}/api/v1/policies", headers=api,
                                    json={"id": "open", "text": OPEN})
        assert made.status_code == 201, made.text

        async def created() -> str | None:
            try:
                return await call_as_task(alice, "tides")
            except MCPError:  # the open policy not yet served
                return None

        found: list[str] = []
        await until(lambda: _kept(found, created()), what="a task created under the policy")
        task_id = found[0]
        assert listed(await raw(alice, "tasks/list", {})) == [task_id]
        made = await gw.client.post(f"{gw.url}/api/v1/policies", headers=api,
                                    json={"id": "no-research", "text": NO_RESEARCH})
        assert made.status_code == 201, made.text

        async def hidden() -> bool:
            return listed(await raw(alice, "tasks/list", {})) == []

        await until(hidden, what="the task left out of tasks/list once its tool is forbidden")
        with pytest.raises(MCPError, match="Unknown tool") as caught:
            await raw(alice, "tasks/get", {"taskId": task_id})
        assert EXPOSED in str(caught.value)
        deleted = await gw.client.delete(f"{gw.url}/api/v1/policies/no-research", headers=api)
        assert deleted.status_code == 204, deleted.text

        async def shown() -> bool:
            return listed(await raw(alice, "tasks/list", {})) == [task_id]

        await until(shown, what="the task listed again once the policy is gone")


async def _kept(found: list[str], made: Any) -> bool:
    task_id = await made
    if task_id is not None:
        found.append(task_id)
    return task_id is not None


async def test_a_client_that_declared_no_tasks_gets_no_task(installed: None) -> None:
    async with _gateway() as gw, \
            connect(gw.endpoint("team"), headers=_headers("alice")) as client:
        try:
            answer: dict[str, Any] = await raw(client, "tools/call", {
                "name": EXPOSED, "arguments": {"topic": "tides"}, "task": {"ttl": 60000}})
        except MCPError as exc:  # the member refuses a direct call of it
            answer = {"error": str(exc)}
        assert "task" not in answer
        assert (await raw(client, "tasks/list", {}))["tasks"] == []
    assert all(r.task is None for r in gw.audit.records)


async def test_discover_advertises_no_2025_tasks(installed: None) -> None:
    """A 2026-07-28 client is not offered the 2025-11-25 tasks capability (the era has
    none: tasks are an extension there)."""
    from mcp import Client

    async with _gateway(signed=False) as gw, \
            Client(gw.endpoint("team"), mode="2026-07-28") as client:
        discovered = await client.session.discover()
        assert discovered.capabilities.tasks is None
        assert (await client.list_tools()).tools  # the members answered


async def test_a_members_task_status_notifications_reach_its_creator_under_the_endpoints_id(
        installed: None) -> None:
    """The member's `notifications/tasks/status` on alice's tasks/result stream (the member
    session's call in flight): relayed under the endpoint's task id, its end recorded once;
    mallory's long call on the same member process hears none of them."""
    async with _gateway({"guardrails": REDACT}) as gw, httpx.AsyncClient(timeout=30) as http:
        alice = Wire(http, gw.endpoint("team"), _headers("alice"))
        mallory = Wire(http, gw.endpoint("team"), _headers("mallory"))
        await alice.start()
        await mallory.start()
        created = await alice.call("tools/call", {
            "name": EXPOSED, "arguments": {"topic": f"mail {EMAIL}"}, "task": {"ttl": 60000}})
        task_id = created[-1]["result"]["task"]["taskId"]
        assert task_id.startswith("everything/")
        answered = await alice.call("tasks/result", {"taskId": task_id})
        heard = statuses(answered)
        assert heard and {s["taskId"] for s in heard} == {task_id}
        assert heard[-1]["status"] == "completed"
        assert EMAIL not in str(answered)
        created = await alice.call("tools/call", {
            "name": EXPOSED, "arguments": {"topic": "merger"}, "task": {"ttl": 60000}})
        second = created[-1]["result"]["task"]["taskId"]
        answered = await mallory.call("tools/call", {
            "name": "everything__trigger-long-running-operation",
            "arguments": {"duration": 6, "steps": 3}})
        assert "result" in answered[-1], answered[-1]
        assert statuses(answered) == [] and "merger" not in str(answered)
        got = await alice.call("tasks/get", {"taskId": second})
        assert got[-1]["result"]["status"] == "completed"
    completion = [r for r in gw.audit.records if r.method == "notifications/tasks/status"]
    assert sorted((r.principal, r.note) for r in completion) == sorted([
        ("alice", f"task {task_id} completed"), ("alice", f"task {second} completed")])

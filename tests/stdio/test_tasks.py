"""MCP tasks (2025-11-25, SEP-1686) through a plain endpoint, with the reference Node server
(`@modelcontextprotocol/server-everything`, pinned, from npm), whose `simulate-research-query`
runs only as a task and writes its topic into its report. Each test is a bypass the gateway
closed (issue 38): a result rule that holds for a tool's direct answer holds for its task's
`tasks/result`; another caller's task id answers as an unknown task; `tasks/list` shows a
caller only its own; the task's creation and completion are audited, its usage event says
it was a task."""

from __future__ import annotations

import shutil
from typing import Any

import httpx
import pytest
from mcp import MCPError, types

from tests.e2e.sdk_client import SdkClient, connect
from tests.e2e.test_tasks import Wire, statuses
from tests.helpers import jwt_auth, token, until
from tests.stdio import everything
from tests.stdio.conftest import stdio_gateway

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed: no Node stdio server to run")

TOOL = "simulate-research-query"
EMAIL = "bob.smith@example.com"
# what a client that runs tools as tasks declares at initialize (2025-11-25)
DECLARED = types.ClientTasksCapability(list=types.TasksListCapability(),
                                       cancel=types.TasksCancelCapability())


@pytest.fixture(scope="module")
def installed() -> None:
    reason = everything.ensure()
    if reason is not None:
        pytest.skip(reason)


def _headers(sub: str, **claims: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='local', sub=sub, **claims)}"}


async def raw(client: SdkClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The answer as it came: the SDK's typed send checks a tools/call answer against
    CallToolResult, which a CreateTaskResult is not."""
    return await client.session._dispatcher.send_raw_request(method, params, {})


async def call_as_task(client: SdkClient, topic: str) -> str:
    params = types.CallToolRequestParams(name=TOOL, arguments={"topic": topic},
                                         task=types.TaskMetadata(ttl=60000))
    answer = await raw(client, "tools/call",
                       params.model_dump(by_alias=True, mode="json", exclude_none=True))
    return str(answer["task"]["taskId"])


async def finished(client: SdkClient, task_id: str) -> str:
    seen: list[str] = []

    async def done() -> bool:
        got = await raw(client, "tasks/get", {"taskId": task_id})
        seen.append(got["status"])
        return seen[-1] in ("completed", "failed", "cancelled")

    await until(done, 30, "the task to end")
    return seen[-1]


def _gateway(config: dict[str, Any], **upstream: Any) -> Any:
    return stdio_gateway({"auth": jwt_auth(), **config}, command="npx",
                         args=["--no-install", "mcp-server-everything", "stdio"],
                         cwd=str(everything.DIRECTORY), start_timeout_s=60, **upstream)


REDACT = [{"name": "no-email", "tools": ["simulate-*"], "on": ["results"],
           "detect": ["email"], "action": "redact"}]


async def test_a_result_rule_reads_tasks_result(installed: None) -> None:
    async with _gateway({"guardrails": REDACT}) as gw, \
            connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("alice")) as client:
        task_id = await call_as_task(client, f"mail {EMAIL}")
        assert await finished(client, task_id) == "completed"
        result = await raw(client, "tasks/result", {"taskId": task_id})
        text = result["content"][0]["text"]
        assert "Research Report" in text
        assert EMAIL not in text, "the task's result passed the result rule unread"
    records = gw.audit.records
    fetched = next(r for r in records if r.method == "tasks/result")
    assert fetched.tool == TOOL and "guardrail no-email: redact email in result" in (
        fetched.note or "")


async def test_a_deny_rule_refuses_tasks_result_as_the_tools_answer(installed: None) -> None:
    deny = [{**REDACT[0], "name": "no-email-at-all", "action": "deny"}]
    async with _gateway({"guardrails": deny}) as gw, \
            connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("alice")) as client:
        task_id = await call_as_task(client, f"mail {EMAIL}")
        await finished(client, task_id)
        result = await raw(client, "tasks/result", {"taskId": task_id})
        assert result["isError"] is True
        assert result["structuredContent"]["code"] == "gateway.guardrail.blocked"
        assert EMAIL not in str(result)


async def test_another_callers_task_answers_as_an_unknown_one(installed: None) -> None:
    async with _gateway({}) as gw, \
            connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("alice")) as alice, \
            connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("mallory")) as mallory:
        task_id = await call_as_task(alice, "alice's secret topic")
        errors = []
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            for named in (task_id, "no-such-task"):
                with pytest.raises(Exception) as caught:  # the SDK raises the JSON-RPC error
                    await raw(mallory, method, {"taskId": named})
                errors.append((method, str(caught.value)))
        # the same answer for alice's task as for one that does not exist
        assert errors[0][1] == errors[1][1] and errors[2][1] == errors[3][1]
        assert "Task not found" in errors[0][1]
        listed = await raw(mallory, "tasks/list", {})
        assert [t["taskId"] for t in listed["tasks"]] == []
        mine = await raw(alice, "tasks/list", {})
        assert [t["taskId"] for t in mine["tasks"]] == [task_id]
        assert await finished(alice, task_id) == "completed"


class Hook:
    """Allows every call; keeps each authorization asked for."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(request)
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        pass


HOOK = Hook()


async def test_creation_and_completion_are_audited_and_metered_once(installed: None) -> None:
    HOOK.__init__()  # type: ignore[misc]
    metering = {"hook": f"{__name__}:HOOK", "timeout_ms": 5000}
    async with _gateway({"metering": metering}) as gw, \
            connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("alice")) as client:
        task_id = await call_as_task(client, "tides")
        assert await finished(client, task_id) == "completed"
        await raw(client, "tasks/result", {"taskId": task_id})
        await raw(client, "tasks/list", {})

        def ended() -> bool:
            return any(r.method == "notifications/tasks/status" for r in gw.audit.records)

        await until(ended, 10, "the task's completion record")
    records = gw.audit.records
    created = next(r for r in records if r.method == "tools/call")
    assert created.tool == TOOL and created.status == "ok"
    assert f"task {task_id} created" in (created.note or "")
    completion = [r for r in records if r.method == "notifications/tasks/status"]
    assert len(completion) == 1  # one, though tasks/get, tasks/result and tasks/list saw it
    assert (completion[0].tool, completion[0].status, completion[0].principal) == (
        TOOL, "ok", created.principal)
    assert completion[0].note == f"task {task_id} completed"
    assert completion[0].duration_ms >= 3000  # the task ran through its four stages
    # metered once: the task's creation; its tasks/* requests are not calls of the tool
    assert [a["tool"] for a in HOOK.asked] == [TOOL]
    metered = [r for r in records if r.call_id is not None]
    assert metered == [created]
    assert created.usage_event()["task"] == task_id  # the usage event says it ran as a task
    assert {r.tool for r in records if r.method and r.method.startswith("tasks/")
            and r.method != "tasks/list"} == {TOOL}


async def test_the_tool_profile_decides_each_request_of_a_task(installed: None) -> None:
    """A caller whose profile no longer lets it use the tool (a group it has left) cannot
    read the task it created with it: tasks/* are decided by the task's tool."""
    access = {"tools_allow": ["echo"], "group_tools": {"research": {
        "tools_allow": ["simulate-*"]}}}
    async with _gateway({}, access=access) as gw:
        async with connect(gw.endpoint("local"), tasks=DECLARED,
                           headers=_headers("alice", groups=["research"])) as member:
            task_id = await call_as_task(member, "tides")
            assert (await raw(member, "tasks/get", {"taskId": task_id}))["taskId"] == task_id
        async with connect(gw.endpoint("local"), tasks=DECLARED, headers=_headers("alice")) as left:
            for method in ("tasks/get", "tasks/result"):
                with pytest.raises(Exception, match="Unknown tool") as caught:
                    await raw(left, method, {"taskId": task_id})
                assert "Research" not in str(caught.value)
            # nor listed: its status message would say what it researches
            assert (await raw(left, "tasks/list", {}))["tasks"] == []
    denied = [r for r in gw.audit.records if r.method in ("tasks/get", "tasks/result")
              and r.status == "denied"]
    assert [(r.method, r.tool) for r in denied] == [("tasks/get", TOOL), ("tasks/result", TOOL)]
    assert all(r.denied_reason and r.denied_reason.startswith("access: tool") for r in denied)


async def test_a_client_that_declared_no_tasks_is_handed_none(installed: None) -> None:
    """A task-run call of a client whose initialize declared no task support runs directly
    (its params.task taken out): this tool runs only as a task, so the server refuses it,
    and no task is created, bound or handed to the client."""
    async with _gateway({}) as gw, \
            connect(gw.endpoint("local"), headers=_headers("alice")) as client:
        params = {"name": TOOL, "arguments": {"topic": "tides"}, "task": {"ttl": 60000}}
        try:
            answer: dict[str, Any] = await raw(client, "tools/call", params)
        except MCPError as exc:  # the server refuses a direct call of it
            answer = {"error": str(exc)}
        assert "task" not in answer
        assert "requires task" in str(answer).lower() or answer.get("isError") is True, answer
        assert (await raw(client, "tasks/list", {}))["tasks"] == []
    called = next(r for r in gw.audit.records if r.method == "tools/call")
    assert "task support not declared by the client: run directly" in (called.note or "")
    assert called.task is None


async def test_a_tasks_status_notifications_are_its_creators_read_by_its_rules(
        installed: None) -> None:
    """The reference server sends `notifications/tasks/status` as a task changes, tied to no
    request: on stdio it goes to the session with a call in flight, here alice's tasks/result
    (waiting for the end). She hears her task's end, its status message read by the tool's
    result rule (the topic, an email address, redacted), and its end is recorded once."""
    async with _gateway({"guardrails": REDACT}) as gw, httpx.AsyncClient(timeout=30) as http:
        alice = Wire(http, gw.endpoint("local"), _headers("alice"))
        await alice.start()
        created = await alice.call("tools/call", {
            "name": TOOL, "arguments": {"topic": f"mail {EMAIL}"}, "task": {"ttl": 60000}})
        task_id = created[-1]["result"]["task"]["taskId"]
        answered = await alice.call("tasks/result", {"taskId": task_id})
    heard = statuses(answered)
    assert heard and {s["taskId"] for s in heard} == {task_id}
    assert EMAIL not in str(answered)
    completion = [r for r in gw.audit.records if r.method == "notifications/tasks/status"]
    assert [(r.principal, r.status) for r in completion] == [("alice", "ok")]


async def test_another_callers_task_status_never_reaches_a_call_in_flight(installed: None
                                                                          ) -> None:
    """While alice's task runs, mallory's long call is the one in flight on the process, so
    the stdio upstream routes the task's status notifications (tied to no request) to her
    call's stream: they are left out there (a task's status is relayed only on its own
    creator's task requests), and alice's task still ends, its end recorded once when she
    asks."""
    async with _gateway({}) as gw, httpx.AsyncClient(timeout=30) as http:
        alice = Wire(http, gw.endpoint("local"), _headers("alice"))
        mallory = Wire(http, gw.endpoint("local"), _headers("mallory"))
        await alice.start()
        await mallory.start()
        created = await alice.call("tools/call", {
            "name": TOOL, "arguments": {"topic": "alice's merger"}, "task": {"ttl": 60000}})
        task_id = created[-1]["result"]["task"]["taskId"]
        answered = await mallory.call("tools/call", {
            "name": "trigger-long-running-operation", "arguments": {"duration": 6, "steps": 3}})
        assert "result" in answered[-1], answered[-1]
        assert statuses(answered) == [], "alice's task's status reached mallory's call"
        assert "merger" not in str(answered)
        got = await alice.call("tasks/get", {"taskId": task_id})
        assert got[-1]["result"]["status"] == "completed"  # it ran while mallory's call did
    completion = [r for r in gw.audit.records if r.method == "notifications/tasks/status"]
    assert [(r.principal, r.status) for r in completion] == [("alice", "ok")]

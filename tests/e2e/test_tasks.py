"""MCP tasks (2025-11-25) through a plain endpoint in front of an official-SDK upstream with
ONE task store for every caller (`tests/e2e/task_upstream.py`: stateless, reached with the
gateway's one credential, answering any task id whoever asks), reached by the official SDK
client declaring task support, in both of the upstream's answer modes (JSON and SSE).

Issue 38 item 1: another caller cannot get, read the result of, cancel or list a task through
the gateway (the upstream would hand it over); a Cedar policy refuses a task's creation as it
refuses the direct call, and a task whose tool a policy changed through the API no longer
permits is refused on every later request; a task's creation counts against the caller's
tool rate limit as a call does, and polling it does not; the task-run call is metered once,
its delivered usage event naming the task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from mcp import MCPError, types

from proxy.audit import MemoryAuditSink, query
from proxy.auth import keys as api_keys
from tests.e2e.conftest import Stack, open_stack
from tests.e2e.sdk_client import SdkClient, connect
from tests.e2e.task_upstream import TOOL, TaskUpstream
from tests.helpers import jwt_auth, token, until

DECLARED = types.ClientTasksCapability(list=types.TasksListCapability(),
                                       cancel=types.TasksCancelCapability())
UNKNOWN = "Failed to retrieve task: Task not found"


def bearer(sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint='up', sub=sub)}"}


@asynccontextmanager
async def gateway(tmp_path: Path, upstream: TaskUpstream, *, json: bool = True,
                  config: dict[str, Any] | None = None, database_audit: bool = False
                  ) -> AsyncIterator[tuple[Stack, MemoryAuditSink]]:
    """The gateway in front of `upstream`, its audit records kept in memory (or, with
    `database_audit`, in the database, through the usage outbox: metering's path)."""
    audit = MemoryAuditSink()
    async with open_stack(tmp_path, lambda: (upstream.app(json=json), None),
                          audit=None if database_audit else audit,
                          config={"auth": jwt_auth(), **(config or {})}) as stack:
        yield stack, audit


@asynccontextmanager
async def caller(stack: Stack, sub: str) -> AsyncIterator[SdkClient]:
    async with connect(stack.endpoint, headers=bearer(sub), tasks=DECLARED) as client:
        yield client


async def raw(client: SdkClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The answer as it came (the SDK's typed call_tool checks a CallToolResult, which a
    CreateTaskResult is not)."""
    return await client.session._dispatcher.send_raw_request(method, params, {})


async def create(client: SdkClient, topic: str) -> str:
    answer = await raw(client, "tools/call", {"name": TOOL, "arguments": {"topic": topic},
                                              "task": {"ttl": 60_000}})
    assert answer["task"]["status"] == "working", answer
    return str(answer["task"]["taskId"])


async def upstream_request(stack: Stack, method: str, params: dict[str, Any]
                           ) -> dict[str, Any]:
    """`method` sent straight to the upstream (no gateway), as any client of it could."""
    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(f"{stack.upstream_url}/mcp", json={
            "jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers={
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"})
    text = answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    return dict(orjson.loads(text))


def same_refusal(answer: dict[str, Any]) -> dict[str, Any]:
    """A refusal without what each has of its own (its error and trace ids, its time)."""
    own = ("error_id", "trace_id", "created_at")
    return {**answer, "structuredContent": {k: v for k, v in answer["structuredContent"].items()
                                            if k not in own}}


async def refused(client: SdkClient, method: str, params: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await raw(client, method, params)
    return caught.value


@pytest.mark.parametrize("answers", ["json", "sse"])
async def test_another_caller_cannot_reach_a_task_in_a_shared_store(tmp_path: Path,
                                                                    answers: str) -> None:
    upstream = TaskUpstream(held=True)
    async with gateway(tmp_path, upstream, json=answers == "json") as (stack, audit), \
            caller(stack, "alice") as alice, caller(stack, "bob") as bob:
        assert alice.initialize_result.capabilities.tasks is not None
        task_id = await create(alice, "alice's merger")
        assert set(upstream.runs) == {task_id}
        # one store: asked directly, the upstream hands alice's task to anyone
        direct = await upstream_request(stack, "tasks/get", {"taskId": task_id})
        assert direct["result"]["taskId"] == task_id, direct
        served_before = dict(upstream.calls)
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            for named in (task_id, "no-such-task"):
                error = await refused(bob, method, {"taskId": named})
                assert (error.error.code, error.error.message) == (-32602, UNKNOWN), method
        assert (await raw(bob, "tasks/list", {}))["tasks"] == []
        # none of bob's named requests reached the upstream; his list did, and was filtered
        assert {m: n - served_before.get(m, 0) for m, n in upstream.calls.items()
                if n != served_before.get(m, 0)} == {"tasks/list": 1}
        assert upstream.runs[task_id].task.status == "working"  # bob's cancel never got there
        # alice still has it all
        got = await raw(alice, "tasks/get", {"taskId": task_id})
        assert (got["taskId"], got["status"]) == (task_id, "working")
        assert [t["taskId"] for t in (await raw(alice, "tasks/list", {}))["tasks"]] == [task_id]
        upstream.release.set()
        result = await raw(alice, "tasks/result", {"taskId": task_id})
        assert result["content"][0]["text"] == "report on alice's merger"
        # bob's own task is his, and alice's list does not show it
        bobs = await create(bob, "bob's holiday")
        assert [t["taskId"] for t in (await raw(bob, "tasks/list", {}))["tasks"]] == [bobs]
        assert [t["taskId"] for t in (await raw(alice, "tasks/list", {}))["tasks"]] == [task_id]
        error = await refused(alice, "tasks/result", {"taskId": bobs})
        assert error.error.message == UNKNOWN
    named = [r for r in audit.records if r.method in ("tasks/get", "tasks/result",
                                                      "tasks/cancel") and r.principal == "bob"]
    assert len(named) == 6 and all(r.status != "ok" for r in named)
    assert all(r.tool is None for r in named)  # an unknown task names no tool, even to the log


POLICIES = """
@id("up-open")
permit(principal, action, resource in Tollhouse::Endpoint::"up");

@id("no-secret-research")
@reason("research on secrets is not allowed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/research")
when { context.input.topic == "secrets" };
"""
NO_RESEARCH = """@reason("research is closed")
forbid(principal, action == Tollhouse::Action::"tools/call",
       resource == Tollhouse::Tool::"up/research");"""


async def test_cedar_refuses_a_task_as_it_refuses_the_call(tmp_path: Path) -> None:
    """A policy refusing a call of the tool with these arguments refuses its task-run call
    with the same tool result (seed 001's gateway.policy.denied), no task created; a policy
    added through the API after a task was created that forbids its tool refuses each later
    request of the task, as a call of a tool no policy could permit (an unknown tool)."""
    (tmp_path / "up.cedar").write_text(POLICIES)
    upstream = TaskUpstream(held=True)
    config = {"policy": {"files": [str(tmp_path / "*.cedar")]}}
    async with gateway(tmp_path, upstream, config=config) as (stack, audit), \
            caller(stack, "alice") as alice:
        secrets = {"name": TOOL, "arguments": {"topic": "secrets"}}
        direct = await raw(alice, "tools/call", secrets)
        as_task = await raw(alice, "tools/call", {**secrets, "task": {"ttl": 60_000}})
        assert direct["isError"] is True
        assert direct["structuredContent"]["code"] == "gateway.policy.denied"
        assert direct["structuredContent"]["message"] == "research on secrets is not allowed"
        assert same_refusal(as_task) == same_refusal(direct)  # and no task
        assert upstream.calls["tools/call"] == 0 and upstream.runs == {}
        assert (await raw(alice, "tasks/list", {}))["tasks"] == []

        task_id = await create(alice, "tides")
        assert (await raw(alice, "tasks/get", {"taskId": task_id}))["status"] == "working"
        _, key = api_keys.create(stack.db_path, "ops", [], role="admin")
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10,
                                     headers={"Authorization": f"Bearer {key}"}) as api:
            made = await api.post("/api/v1/policies", json={"id": "no-research",
                                                             "text": NO_RESEARCH})
            assert made.status_code == 201, made.text
            upstream.release.set()  # the task ends upstream: only the policy stands between

            async def closed() -> bool:
                try:
                    await raw(alice, "tasks/get", {"taskId": task_id})
                except MCPError as exc:
                    assert exc.error.code == -32602 and exc.error.message == (
                        f"Unknown tool: {TOOL}"), exc.error
                    return True
                return False

            await until(closed, what="the added policy refusing the task's requests")
            served = dict(upstream.calls)
            for method in ("tasks/result", "tasks/cancel", "tasks/get"):
                error = await refused(alice, method, {"taskId": task_id})
                assert (error.error.code, error.error.message) == (-32602, f"Unknown tool: {TOOL}")
            assert dict(upstream.calls) == served  # none reached the upstream
            listed = await raw(alice, "tasks/list", {})
            assert listed["tasks"] == [], "a task of a tool no longer permitted is listed"
            # the policy deleted: the task is its creator's again
            assert (await api.delete("/api/v1/policies/no-research")).status_code == 204

            async def reopened() -> bool:
                try:
                    return "report on tides" in str(
                        await raw(alice, "tasks/result", {"taskId": task_id}))
                except MCPError:
                    return False

            await until(reopened, what="the task's result once the policy is gone")
    denied = [r for r in audit.records if r.status == "denied"]
    assert {(r.method, r.tool) for r in denied} >= {
        ("tools/call", TOOL), ("tasks/get", TOOL), ("tasks/result", TOOL),
        ("tasks/cancel", TOOL)}
    creation = [r for r in denied if r.method == "tools/call"]
    assert len(creation) == 2 and all(r.task is None for r in creation)


async def test_a_task_counts_against_the_tools_rate_limit_and_polling_does_not(
        tmp_path: Path) -> None:
    """A task's creation is a call of its tool: it takes one of the caller's calls of the tool
    (a `principal_tool` rule on tools/call). Its tasks/get polls, its tasks/result and
    tasks/list are not calls of the tool and take none; a rule listing tasks/get in its
    `methods` counts the polls, by the task's tool."""
    rules = [{"name": "research-calls", "key": "principal_tool", "methods": ["tools/call"],
              "rate": "2/min"},
             {"name": "polls", "key": "principal_tool", "methods": ["tasks/get"],
              "rate": "8/min"}]
    upstream = TaskUpstream(held=True)
    async with gateway(tmp_path, upstream, config={"rate_limits": rules}) as (stack, audit), \
            caller(stack, "alice") as alice, caller(stack, "bob") as bob:
        task_id = await create(alice, "tides")  # alice's first call of research
        for _ in range(8):  # polls: none is a call of the tool
            assert (await raw(alice, "tasks/get", {"taskId": task_id}))["status"] == "working"
        await raw(alice, "tasks/list", {})
        error = await refused(alice, "tasks/get", {"taskId": task_id})  # the 9th poll
        assert (error.error.code, error.error.message) == (-32000, "Too many requests")
        upstream.release.set()
        assert "report on tides" in str(await raw(alice, "tasks/result", {"taskId": task_id}))
        # the second call of research passes: the polls took none of the two
        second = await raw(alice, "tools/call", {"name": TOOL, "arguments": {"topic": "x"}})
        assert second["content"][0]["text"] == "report on x"
        # the third, as a task or not, is refused: the creation counted as a call
        for params in ({"name": TOOL, "arguments": {"topic": "y"}, "task": {"ttl": 60_000}},
                       {"name": TOOL, "arguments": {"topic": "y"}}):
            error = await refused(alice, "tools/call", params)
            assert (error.error.code, error.error.message) == (-32000, "Too many requests")
        assert await create(bob, "bob's") != task_id  # another caller's bucket
        assert upstream.calls["tools/call"] == 3 and len(upstream.runs) == 2
    limited = [(r.method, r.tool, r.denied_reason) for r in audit.records
               if r.status == "denied"]
    assert limited == [("tasks/get", TOOL, "rate_limit: polls"),
                       ("tools/call", TOOL, "rate_limit: research-calls"),
                       ("tools/call", TOOL, "rate_limit: research-calls")]


class Hook:
    """The metering hook: allows every call, keeps what it is asked and each usage event."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(request)
        return {"allow": True}

    async def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)


HOOK = Hook()


async def test_a_task_run_call_is_metered_once_and_its_event_names_the_task(
        tmp_path: Path) -> None:
    HOOK.__init__()  # type: ignore[misc]
    metering = {"hook": f"{__name__}:HOOK", "timeout_ms": 5000}
    upstream = TaskUpstream()
    async with gateway(tmp_path, upstream, config={"metering": metering},
                       database_audit=True) as (stack, _), caller(stack, "alice") as alice:
        task_id = await create(alice, "tides")
        for _ in range(3):
            await raw(alice, "tasks/get", {"taskId": task_id})
        assert "report on tides" in str(await raw(alice, "tasks/result", {"taskId": task_id}))
        await raw(alice, "tasks/list", {})
        direct = await raw(alice, "tools/call", {"name": "echo", "arguments": {"text": "hi"}})
        assert direct["content"][0]["text"] == "hi"
        await until(lambda: len(HOOK.events) >= 2, what="the usage events")
    assert [a["tool"] for a in HOOK.asked] == [TOOL, "echo"]  # the polls are not calls
    task_event, echo_event = HOOK.events
    assert (task_event["tool"], task_event["task"]) == (TOOL, task_id)
    assert echo_event["tool"] == "echo" and echo_event.get("task") is None
    assert task_event["call_id"] != echo_event["call_id"]
    records = query(stack.db_path, limit=100)[::-1]
    metered = [(r["method"], r["tool"]) for r in records if r["call_id"] is not None]
    assert metered == [("tools/call", TOOL), ("tools/call", "echo")]
    created = next(r for r in records if r["method"] == "tools/call")
    assert created["call_id"] == task_event["call_id"]
    assert f"task {task_id} created" in (created["note"] or "")


EMAIL = "jane.doe@example.com"
REDACT_EMAIL = [{"name": "no-email", "tools": [TOOL], "on": ["results"], "detect": ["email"],
                 "action": "redact"}]
DENY_EMAIL = [{**REDACT_EMAIL[0], "action": "deny"}]
HTTP_HEADERS = {"Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25"}


class Wire:
    """One caller speaking HTTP to the gateway itself (to see each event of a stream as it
    comes): its session, its GET stream's messages."""

    def __init__(self, http: httpx.AsyncClient, endpoint: str, auth: dict[str, str]) -> None:
        self.http = http
        self.endpoint = endpoint
        self.headers = {**HTTP_HEADERS, **auth}
        self.heard: list[dict[str, Any]] = []  # the GET stream's messages, in order

    async def start(self) -> None:
        answer = await self.http.post(self.endpoint, headers=self.headers, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "clientInfo": {"name": "wire", "version": "1"},
                "capabilities": {"tasks": {"list": {}, "cancel": {}}}}})
        assert answer.status_code == 200, answer.text
        self.headers["Mcp-Session-Id"] = answer.headers["mcp-session-id"]
        sent = await self.http.post(self.endpoint, headers=self.headers, json={
            "jsonrpc": "2.0", "method": "notifications/initialized"})
        assert sent.status_code == 202, sent.text

    async def call(self, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every message of the answer, in order (one, for a JSON answer)."""
        answer = await self.http.post(self.endpoint, headers=self.headers, json={
            "jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        assert answer.status_code == 200, answer.text
        if not answer.headers["content-type"].startswith("text/event-stream"):
            return [orjson.loads(answer.content)]
        return [orjson.loads(line[5:]) for line in answer.text.splitlines()
                if line.startswith("data:")]

    async def listen(self, opened: asyncio.Event) -> None:
        async with self.http.stream("GET", self.endpoint, headers=self.headers) as stream:
            assert stream.status_code == 200
            opened.set()
            async for line in stream.aiter_lines():
                if line.startswith("data:"):
                    self.heard.append(orjson.loads(line[5:]))


def ended(audit: MemoryAuditSink) -> list[Any]:
    """The completion records of tasks."""
    return [r for r in audit.records if r.method == "notifications/tasks/status"]


def statuses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"] for m in messages if m.get("method") == "notifications/tasks/status"]


@pytest.mark.parametrize("action", ["redact", "deny"])
async def test_task_status_notifications_are_read_by_the_tools_result_rules(
        tmp_path: Path, action: str) -> None:
    """A `notifications/tasks/status` carrying an email address in its status message, on a
    tasks/result's stream and on the session's GET stream: the result rule of the task's tool
    redacts it (or, a deny rule, replaces the message with what a person reads of the
    refusal; the status still reaches the client); a status notification of a task that is
    not the caller's is left out of its GET stream; the end it shows is recorded once."""
    upstream = TaskUpstream(held=True, notify=f"report on {{topic}} sent to {EMAIL}")
    rules = REDACT_EMAIL if action == "redact" else DENY_EMAIL
    async with gateway(tmp_path, upstream, json=False, config={"guardrails": rules}) as (
            stack, audit), httpx.AsyncClient(timeout=10) as http:
        alice = Wire(http, stack.endpoint, bearer("alice"))
        await alice.start()
        opened = asyncio.Event()
        listening = asyncio.create_task(alice.listen(opened))
        try:
            await asyncio.wait_for(opened.wait(), 10)
            created = await alice.call("tools/call", {
                "name": TOOL, "arguments": {"topic": "tides"}, "task": {"ttl": 60_000}})
            task_id = created[-1]["result"]["task"]["taskId"]
            # another caller's task's status (the upstream's one store): not alice's to hear
            upstream.pushed.put_nowait({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                                        "params": {"taskId": "someone-elses",
                                                   "status": "working",
                                                   "statusMessage": "for someone else",
                                                   "createdAt": "2026-01-01T00:00:00Z",
                                                   "lastUpdatedAt": "2026-01-01T00:00:00Z",
                                                   "ttl": 60_000}})
            upstream.release.set()
            await until(lambda: statuses(alice.heard), what="the status on the GET stream")
            # the end it shows is recorded (nothing else has shown it yet)
            await until(lambda: ended(audit), what="the task's completion record")
            answered = await alice.call("tasks/result", {"taskId": task_id})
        finally:
            listening.cancel()
    on_call = statuses(answered)
    assert answered[-1]["result"]["content"][0]["text"] == "report on tides"
    assert [(s["taskId"], s["status"]) for s in on_call] == [(task_id, "completed")]
    on_get = statuses(alice.heard)
    assert [(s["taskId"], s["status"]) for s in on_get] == [(task_id, "completed")]
    for status in on_call + on_get:
        message = status["statusMessage"]
        assert EMAIL not in message and "example.com" not in message, message
        if action == "redact":
            assert message.startswith("report on tides sent to "), message
        else:
            assert message == ("Blocked by guardrail 'no-email': the result carries email."
                               ), message
    assert [(r.tool, r.status, r.principal, r.note) for r in ended(audit)] == [
        (TOOL, "ok", "alice", f"task {task_id} completed")]

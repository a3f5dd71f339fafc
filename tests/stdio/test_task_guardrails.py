"""A task-run tool call whose result a guardrail reads (security review finding 5): the result of
a task comes back through `tasks/result`, which no rule reads yet, so such a call is refused as a
task, and a task-run call no result rule covers still runs. The upstream is the reference Node
server (`@modelcontextprotocol/server-everything`, pinned, from npm), whose
`simulate-research-query` runs only as a task and writes its topic into its report."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
from mcp import types

from tests.e2e.sdk_client import SdkClient, connect
from tests.helpers import until
from tests.stdio import everything
from tests.stdio.conftest import stdio_gateway

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed: no Node stdio server to run")

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
TOOL = "simulate-research-query"


@pytest.fixture(scope="module")
def installed() -> None:
    reason = everything.ensure()
    if reason is not None:
        pytest.skip(reason)


async def _call_as_task(client: SdkClient) -> dict[str, Any]:
    """The answer to a task-run call as it came: the SDK's typed send checks a tools/call
    answer against CallToolResult, which a CreateTaskResult is not, so the raw send."""
    params = types.CallToolRequestParams(
        name=TOOL, arguments={"topic": f"keys like {AWS_KEY}"}, task=types.TaskMetadata(ttl=60000))
    return await client.session._dispatcher.send_raw_request(
        "tools/call", params.model_dump(by_alias=True, mode="json", exclude_none=True), {})


def _gateway(rules: list[dict[str, Any]]) -> Any:
    return stdio_gateway({"guardrails": rules}, command="npx",
                         args=["--no-install", "mcp-server-everything", "stdio"],
                         cwd=str(everything.DIRECTORY), start_timeout_s=60)


async def test_a_task_run_call_a_result_rule_covers_is_refused(installed: None) -> None:
    rules = [{"name": "no-secrets", "tools": ["simulate-*"], "on": ["results"],
              "detect": ["secrets"], "action": "redact"}]
    async with _gateway(rules) as gw, connect(gw.endpoint("local")) as client:
        answer = await _call_as_task(client)
        assert "task" not in answer, "the task's result would pass the result rule unread"
        assert answer["isError"] is True
        assert answer["structuredContent"]["code"] == "gateway.guardrail.blocked"
        assert "no-secrets" in answer["structuredContent"]["message"]
    record = next(r for r in gw.audit.records if r.method == "tools/call")
    assert (record.status, record.tool) == ("denied", TOOL)
    assert record.denied_reason == "guardrail no-secrets: result rule covers a task-run call"


async def test_a_task_run_call_no_result_rule_covers_runs(installed: None) -> None:
    rules = [{"name": "args-only", "tools": ["simulate-*"], "on": ["arguments"],
              "detect": ["email"], "action": "deny"},
             {"name": "elsewhere", "tools": ["echo"], "on": ["results"], "detect": ["secrets"]}]
    async with _gateway(rules) as gw, connect(gw.endpoint("local")) as client:
        answer = await _call_as_task(client)
        task_id = answer["task"]["taskId"]

        seen: list[str] = []

        async def done() -> bool:
            got = await client.session.send_request(
                types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)),
                types.GetTaskResult)
            seen.append(got.status)
            return seen[-1] in ("completed", "failed")

        await until(done, 30, "the task to end")
        assert seen[-1] == "completed"
    assert {r.status for r in gw.audit.records if r.method == "tools/call"} == {"ok"}

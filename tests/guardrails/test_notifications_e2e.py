"""Guardrails on the notifications of a call's stream, end to end: an official-SDK upstream
whose tool logs (`ctx.log`) and reports progress (`ctx.report_progress(..., message=...)`) with
a secret in them before it answers, behind the gateway, reached by the official SDK client in
both eras (SSE; a JSON answer carries no notification, and its result is still redacted). The
rule that reads the tool's result reads those notifications too: redacted, dropped (deny: the
call goes on), never in the audit log; a tool no rule matches is relayed untouched. The tool
answers only once the client has heard its last notification, so a stream held until the
answer would never finish: the notifications reach the client before it."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPDeprecationWarning, types
from mcp.server.mcpserver import Context, MCPServer

from proxy.audit import query
from tests.e2e.conftest import open_stack
from tests.helpers import DEADLINE_S

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
LOGGED = {"step": "auth", "data": {"key": AWS_KEY}, "uri": f"s3://keys/{AWS_KEY}"}
LAST = "almost done"  # the clean last progress message the tool waits for the client to hear


class Chatty:
    """An upstream whose tools talk on the call's stream before they answer."""

    def __init__(self, json_response: bool) -> None:
        self.json_response = json_response  # JSON answers: no stream carries notifications
        self.heard = asyncio.Event()  # the client heard the last notification
        self.server = MCPServer("chatty", version="1.0.0")
        server = self.server

        async def talk(ctx: Context) -> None:
            with warnings.catch_warnings():  # logging is deprecated in 2026-07-28, still sent
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                # under `data`, `uri`: keys like any other in a notification's data
                await ctx.log("info", LOGGED, logger_name="chatty")
            await ctx.report_progress(1, 2, f"signing with {AWS_KEY}")
            await ctx.report_progress(2, 2, LAST)
            if self.json_response:
                return
            with anyio.fail_after(DEADLINE_S):  # the answer waits for the client to hear
                await self.heard.wait()
            self.heard.clear()

        @server.tool()
        async def chatty(ctx: Context) -> str:
            """Log and report progress, then answer."""
            await talk(ctx)
            return f"done with {AWS_KEY}"

        @server.tool()
        async def quiet(ctx: Context) -> str:
            """The same talk; no rule reads this tool."""
            await talk(ctx)
            return "done"

    def app(self) -> Any:
        return self.server.streamable_http_app(streamable_http_path="/mcp",
                                               json_response=self.json_response,
                                               stateless_http=self.json_response)


class Heard:
    """What the client's callbacks received."""

    def __init__(self, chatty: Chatty) -> None:
        self.chatty = chatty
        self.logged: list[Any] = []
        self.progress: list[str | None] = []

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logged.append(params.data)

    async def on_progress(self, value: float, total: float | None, message: str | None
                          ) -> None:
        self.progress.append(message)
        if message == LAST:
            self.chatty.heard.set()

    def clear(self) -> None:
        self.logged.clear()
        self.progress.clear()


def stack_of(chatty: Chatty) -> Callable[[], tuple[Any, Chatty]]:
    return lambda: (chatty.app(), chatty)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("action", ["redact", "deny"])
async def test_a_call_s_notifications_are_inspected_by_its_result_rules(
        tmp_path: Path, mode: str, action: str) -> None:
    chatty = Chatty(json_response=False)
    heard = Heard(chatty)
    rules = {"guardrails": [{"name": "no-secrets", "tools": ["chatty"], "on": ["results"],
                             "detect": ["secrets"], "action": action}]}
    async with open_stack(tmp_path, stack_of(chatty), config=rules,
                          screening={"mode": "off"}) as stack, \
            Client(stack.endpoint, mode=mode, logging_callback=heard.on_log,
                   log_level="info") as client:
        result = await client.call_tool("chatty", {}, progress_callback=heard.on_progress)
        if action == "redact":
            assert result.content[0].text == "done with [REDACTED:secret]"
            assert heard.logged == [{"step": "auth", "data": {"key": "[REDACTED:secret]"},
                                     "uri": "s3://keys/[REDACTED:secret]"}]
            assert heard.progress == ["signing with [REDACTED:secret]", LAST]
        else:  # the notifications carrying it dropped, the call went on to its answer
            assert result.is_error and heard.logged == []
            assert heard.progress == [LAST]
        assert AWS_KEY not in repr(result)
        heard.clear()
        untouched = await client.call_tool("quiet", {}, progress_callback=heard.on_progress)
        assert untouched.content[0].text == "done"
        assert heard.logged == [LOGGED]
        assert heard.progress == [f"signing with {AWS_KEY}", LAST]
    records = {r["tool"]: r for r in query(stack.db_path, limit=100)
               if r["method"] == "tools/call"}
    assert records["chatty"]["note"] == (
        f"guardrail no-secrets: {action} secret in notifications/message; "
        f"guardrail no-secrets: {action} secret in notifications/progress; "
        f"guardrail no-secrets: {action} secret in result")
    assert records["quiet"]["note"] is None and records["quiet"]["status"] == "ok"
    assert AWS_KEY not in repr(records)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_json_answer_carries_no_notification_and_its_result_is_redacted(
        tmp_path: Path, mode: str) -> None:
    chatty = Chatty(json_response=True)
    heard = Heard(chatty)
    rules = {"guardrails": [{"name": "no-secrets", "tools": ["chatty"], "on": ["results"],
                             "detect": ["secrets"], "action": "redact"}]}
    async with open_stack(tmp_path, stack_of(chatty), config=rules,
                          screening={"mode": "off"}) as stack, \
            Client(stack.endpoint, mode=mode, logging_callback=heard.on_log,
                   log_level="info") as client:
        result = await client.call_tool("chatty", {}, progress_callback=heard.on_progress)
        assert result.content[0].text == "done with [REDACTED:secret]"
        assert AWS_KEY not in repr(heard.logged) + repr(heard.progress)
    records = [r for r in query(stack.db_path, limit=100) if r["tool"] == "chatty"]
    assert [r["note"] for r in records] == ["guardrail no-secrets: redact secret in result"]

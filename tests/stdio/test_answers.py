"""A server-to-client request from a stdio process is answered only by the caller it was sent
to: a second caller who posts an answer under its id (seen, or guessed) is dropped, and the
caller asked still answers it; on a shared process, per person, and through a virtual
endpoint whose member is a stdio process."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from mcp import types

from tests.e2e.sdk_client import connect
from tests.helpers import DEADLINE_S, jwt_auth, token
from tests.stdio.conftest import SERVER, stdio_gateway


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


def bearer(sub: str, endpoint: str = "local") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(endpoint=endpoint, sub=sub)}"}


def forged(rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid,
            "result": {"action": "accept", "content": {"answer": "forged"}}}


@pytest.mark.parametrize("process", ["shared", "per_user"])
async def test_another_caller_cannot_answer_a_callers_elicitation(process: str) -> None:
    asked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    forgery_done = asyncio.Event()

    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        asked.set_result(ctx.request_id)
        await forgery_done.wait()  # the thief's answer first: it must not be the one taken
        return types.ElicitResult(action="accept", content={"answer": "mine"})

    config = {"auth": jwt_auth()} if process == "per_user" else None
    async with stdio_gateway(config, process=process) as gw, \
            connect(gw.endpoint("local"), elicitation_callback=on_elicit,
                    headers=bearer("victim")) as victim, \
            connect(gw.endpoint("local"), headers=bearer("thief")) as thief:
        assert text(await thief.call_tool("echo", {"text": "x"})) == "x"
        call = asyncio.create_task(victim.call_tool("ask_elicitation",
                                                    {"message": "approve transfer"}))
        rid = await asyncio.wait_for(asked, DEADLINE_S)
        assert isinstance(rid, str) and len(rid) >= 22  # 128 random bits: nothing to guess
        for session_id in (thief.session_id, None):  # on the thief's session, or on none
            headers = {**bearer("thief"), **({"Mcp-Session-Id": session_id}
                                             if session_id else {})}
            answer = await gw.post(forged(rid), name="local", headers=headers)
            assert answer.status_code == 202, answer.text
        forgery_done.set()
        assert text(await asyncio.wait_for(call, DEADLINE_S)) == "accept:mine"


async def test_an_answer_through_a_virtual_endpoint_reaches_its_stdio_member() -> None:
    """The endpoint seals the id to the caller's session; the member's process takes the
    answer from the person it asked (the person is sent on with it)."""
    async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"answer": "via team"})

    member = {"name": "local", "transport": "stdio", "command": sys.executable,
              "args": [SERVER]}
    config = {"upstreams": [member], "endpoints": [{"name": "team", "members": ["local"]}]}
    async with stdio_gateway(config) as gw, \
            connect(gw.endpoint("team"), elicitation_callback=on_elicit) as client:
        result = await client.call_tool("local__ask_elicitation", {"message": "ok?"})
        assert text(result) == "accept:via team"

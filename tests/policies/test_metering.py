"""The metering policy with plain objects and a fake backend."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from policies.metering import Metering, new_call_id
from proxy.chain import CallContext
from proxy.config import MeteringConfig
from proxy.errors import MeteringDenied, ToolResultDenial
from tests.builders import bare, context, principal, tool_call

CALL = tool_call()
LIST = bare("tools/list", id=2)


class Backend:
    def __init__(self, answer: Any = None, hang: bool = False) -> None:
        self.answer = answer if answer is not None else {"allow": True}
        self.hang = hang
        self.requests: list[dict[str, Any]] = []

    async def authorize(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def record(self, event: dict[str, Any]) -> None:
        return None


def ctx() -> CallContext:
    return context(principal("alice", ""), arguments_size=42)


def policy(backend: Backend, **cfg: Any) -> Metering:
    return Metering(MeteringConfig(hook="x:y", timeout_ms=cfg.pop("timeout_ms", 50), **cfg),
                    backend)


async def test_allowed_call_gets_a_call_id_and_the_hook_sees_the_call() -> None:
    backend, c = Backend(), ctx()
    await policy(backend).check(CALL, c)
    (request,) = backend.requests
    assert request["call_id"] == c.call_id and len(request["call_id"]) == 24
    assert (request["principal"], request["endpoint"], request["tool"],
            request["arguments_bytes"]) == ("alice", "e", "t", 42)


def test_call_ids_sort_by_time_and_differ_within_a_millisecond() -> None:
    made = [new_call_id() for _ in range(2000)]  # many share a millisecond
    assert len(set(made)) == len(made)
    assert all(len(c) == 24 and int(c, 16) >= 0 for c in made)
    heads = [c[:12] for c in made]
    assert heads == sorted(heads)  # the time part never goes back
    assert int(heads[-1], 16) - int(heads[0], 16) < 60_000  # and it is milliseconds
    assert abs(int(heads[0], 16) - time.time_ns() // 1_000_000) < 60_000


def test_a_forked_child_does_not_repeat_the_parents_call_ids() -> None:
    """The random part comes from a buffer of os.urandom bytes; a child forked with the
    buffer half used must not hand out the bytes its parent hands out next."""
    new_call_id()  # the buffer is filled in this process before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next random parts, to the parent, then out
        os.close(read)
        os.write(write, "".join(new_call_id()[12:] for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    mine = "".join(new_call_id()[12:] for _ in range(20))
    assert len(child) == len(mine) == 240 and child != mine


async def test_methods_not_metered_pass_without_asking() -> None:
    backend = Backend()
    await policy(backend).check(LIST, ctx())
    assert backend.requests == []


async def test_deny_without_user_message_is_32000_with_the_reason() -> None:
    with pytest.raises(MeteringDenied) as info:
        await policy(Backend({"allow": False, "reason": "insufficient_credits"})).check(CALL,
                                                                                       ctx())
    assert (info.value.code, info.value.http_status) == (-32000, 200)
    assert info.value.wire_message == "insufficient_credits"
    assert info.value.audit_reason == "insufficient_credits"


async def test_deny_with_user_message_is_a_tool_result() -> None:
    backend = Backend({"allow": False, "reason": "no_credits", "user_message": "Top up first."})
    with pytest.raises(ToolResultDenial) as info:
        await policy(backend).check(CALL, ctx())
    assert info.value.wire_message == "Top up first."
    assert info.value.tool_code == "gateway.metering.denied"
    assert info.value.audit_reason == "no_credits"


@pytest.mark.parametrize("backend", [Backend(hang=True), Backend(ValueError("boom")),
                                     Backend({"allow": "yes"})],
                         ids=["timeout", "error", "bad answer"])
async def test_a_hook_that_cannot_answer_fails_closed(backend: Backend) -> None:
    with pytest.raises(ToolResultDenial) as info:
        await policy(backend).check(CALL, ctx())
    assert info.value.tool_code == "gateway.metering.unavailable"
    assert info.value.audit_reason.startswith("metering: authorize")


async def test_on_error_allow_lets_it_through_and_says_so() -> None:
    c = ctx()
    await policy(Backend(hang=True), on_error="allow").check(CALL, c)
    assert c.audit_note == "metering: authorize timed out; allowed by on_error"
    assert c.call_id

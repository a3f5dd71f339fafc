from __future__ import annotations

import asyncio

import orjson

from proxy.oauth.server import Grant
from proxy.people.accounts import User
from proxy.state.codes import Taken
from tests.state.conftest import Backend

GRANT = {"client_id": "c", "resource": "https://gw/mcp/e", "user": {"id": "u1"}}


async def test_a_code_is_taken_once_then_known_as_used(backend: Backend) -> None:
    store = backend.codes(ttl_s=60, used_ttl_s=600)
    await store.put("code-1", GRANT, "fam-1")
    assert await store.take("code-1") == Taken(GRANT)
    assert await store.take("code-1") == Taken(None, "fam-1")  # reuse: revoke fam-1
    assert await store.take("code-2") == Taken(None)


async def test_a_code_is_taken_once_under_concurrency(backend: Backend) -> None:
    store = backend.codes(ttl_s=60, used_ttl_s=600)
    await store.put("code-1", GRANT, "fam-1")
    results = await asyncio.gather(*(store.take("code-1") for _ in range(50)))
    assert results.count(Taken(GRANT)) == 1
    assert results.count(Taken(None, "fam-1")) == 49


async def test_an_unused_code_expires_and_a_used_one_is_forgotten_later(
        backend: Backend) -> None:
    store = backend.codes(ttl_s=60, used_ttl_s=600)
    await store.put("late", GRANT, "fam-1")
    await store.put("used", GRANT, "fam-2")
    await store.take("used")
    await backend.advance(60)
    assert await store.take("late") == Taken(None)  # expired unused: nothing to revoke
    await backend.advance(540)
    assert await store.take("used") == Taken(None)


def test_the_grant_the_server_puts_is_json_and_comes_back_whole() -> None:
    user = User("u1", "alice", "tollhouse:local", "local:alice", True,
                frozenset({"dev", "ops"}), frozenset({"ops"}))
    grant = Grant("c", "http://127.0.0.1/cb", "chal", user, "https://gw/mcp/e", True, "fam")
    assert Grant.from_json(orjson.loads(orjson.dumps(grant.to_json()))) == grant


async def test_a_code_never_names_another_kind_of_key(backend: Backend) -> None:
    """`u:<code>` is a code like any other, never the marker of a used code (#36 item 12)."""
    store = backend.codes(ttl_s=60, used_ttl_s=600)
    await store.put("abc", {"a": 1}, "family")
    assert (await store.take("abc")).grant == {"a": 1}
    assert await store.take("u:abc") == Taken(None, None)
    assert await store.take("c:abc") == Taken(None, None)
    assert await store.take("abc") == Taken(None, "family")

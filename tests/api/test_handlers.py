"""The API's pieces one by one: the query parsers, and a handler called as the function it is
(with a Caller and an Api, inside a request), without a server."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from quart import Quart

from proxy.api import caller, query, roles
from proxy.api.caller import Caller
from proxy.errors import NotFound

ADMIN = Caller("key:abc", "tollhouse:api-key", "ci", True, "api_key")


def test_a_period_lists_each_problem() -> None:
    problems: query.Problems = []
    assert query.period({"since": "5", "until": "7.5"}, problems) == {"since": 5.0,
                                                                       "until": 7.5}
    assert problems == []
    query.period({"since": "1e3", "until": "nan"}, problems)
    assert [(p["loc"], p["type"]) for p in problems] == [
        (["query", "since"], "float_parsing"), (["query", "until"], "float_parsing")]
    problems.clear()
    query.period({"since": "9", "until": "1"}, problems)
    assert [p["loc"] for p in problems] == [["query", "since"]]


@pytest.mark.parametrize(("sent", "limit", "ok"), [
    (None, 50, True), ("1", 1, True), ("500", 500, True), ("050", 50, True),
    ("0", 50, False), ("501", 50, False), ("१०", 50, False), ("-1", 50, False)])
def test_a_limit(sent: str | None, limit: int, ok: bool) -> None:
    problems: query.Problems = []
    assert query.limit(sent, problems) == limit
    assert (problems == []) is ok


def test_a_cursor_round_trips_and_anything_else_is_refused() -> None:
    given = query.encode_cursor({"ts": 1700000000.5, "id": 42})
    problems: query.Problems = []
    assert query.cursor(given, problems) == (1700000000.5, 42) and problems == []
    for bad in ([1, 2], [1.0, 2**63], [1.0, -1], "x", [1.0]):
        forged = base64.urlsafe_b64encode(orjson.dumps(bad)).decode()
        assert query.cursor(forged, problems) is None
    assert query.cursor("%%%", problems) is None
    assert len(problems) == 6 and {p["msg"] for p in problems} == {"not a cursor this API gave"}


async def test_a_handler_is_a_plain_function() -> None:
    def no_query(name: str) -> None:
        raise AssertionError("the database was asked")

    app = Quart(__name__)
    api: Any = SimpleNamespace(accounts=SimpleNamespace(role=no_query))
    async with app.test_request_context("/api/v1/me"):
        answer = await caller.me(ADMIN, api)
        assert answer.status_code == 200 and await answer.get_json() == {
            "subject": "key:abc", "issuer": "tollhouse:api-key", "name": "ci", "admin": True,
            "auditor": False, "via": "api_key"}
        with pytest.raises(NotFound) as refused:  # never a role's name: no query made
            await roles.role(ADMIN, api, "no such/role")
        assert (refused.value.wire_status, refused.value.detail) == (
            404, "role 'no such/role' not found")

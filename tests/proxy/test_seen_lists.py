"""What is kept of each server's prompts/list and resources/list (proxy.seen) for the server
cards: written when changed, one page of several is not the list, a member's list told by a
virtual endpoint's fan-out is kept under the member's name, and an item whose URI is too long
to keep whole is left out."""

from __future__ import annotations

from proxy.audit.record import AuditRecord
from proxy.seen import MAX_URI, LastSeen
from proxy.storage.db import Database
from tests import db_backends
from tests.builders import message


async def test_prompts_and_resources_are_kept_beside_the_tools() -> None:
    database = Database(db_backends.url())
    seen = LastSeen(database, {"s"}.__contains__)
    await seen.start()
    try:
        record = AuditRecord(endpoint="s")
        prompts = {"prompts": [{"name": "p", "description": "d", "arguments": [{"name": "x"}]},
                               "junk", {"title": "no name"}]}
        resources = {"resources": [{"uri": "file:///a", "name": "a", "mimeType": "text/plain"},
                                   {"uri": "file:///" + "x" * MAX_URI, "name": "long"}]}
        for method, result in (("prompts/list", prompts), ("resources/list", resources),
                               ("prompts/list", prompts)):  # the same list again: no write
            rewrite = seen.results(message(method), record, None)
            assert rewrite is not None and rewrite(dict(result)) is False
        paged = seen.results(message("prompts/list", cursor="2"), record, None)
        assert paged is not None and paged({"prompts": [{"name": "later"}]}) is False
        seen.listed("member", message("resources/list"), {"resources": [{"uri": "ui://m/x"}]})
        seen.listed("member", message("tools/call"), {"content": []})  # not a list: ignored
        await seen.flush()
        stored = await seen.lists(["s", "member", "never"])
        assert seen.writes == 3
        assert stored["s"] == {
            "tools": None,
            "prompts": [{"name": "p", "title": None, "description": "d"}],
            "resources": [{"uri": "file:///a", "name": "a", "title": None, "description": None,
                           "mimeType": "text/plain"}]}
        assert stored["member"]["resources"] == [
            {"uri": "ui://m/x", "name": None, "title": None, "description": None,
             "mimeType": None}]
        assert stored["never"] == {"tools": None, "prompts": None, "resources": None}
    finally:
        await seen.aclose()
        database.close()


async def test_a_restart_writes_an_unchanged_list_again_never() -> None:
    url = db_backends.url()
    lists = {"prompts/list": {"prompts": [{"name": "p"}]},
             "resources/list": {"resources": [{"uri": "file:///a"}]}}
    for expected_writes in (2, 0):
        database = Database(url)
        seen = LastSeen(database, {"s"}.__contains__)
        await seen.start()
        try:
            for method, result in lists.items():
                rewrite = seen.results(message(method), AuditRecord(endpoint="s"), None)
                assert rewrite is not None
                rewrite(result)
            await seen.flush()
            assert seen.writes == expected_writes
        finally:
            await seen.aclose()
            database.close()

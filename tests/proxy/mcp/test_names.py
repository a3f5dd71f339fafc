"""proxy.mcp.names: when a name is unknown, and how often a miss may look again."""

from __future__ import annotations

import asyncio

from proxy.jsonrpc import McpMessage
from proxy.mcp.names import MAX_NAMES, RELIST_S, Names, Relists
from tests.builders import message
from tests.helpers import Clock

UP = Names.identity("up http://up/mcp", None, "tool")


def listing(cursor: str | None = None) -> McpMessage:
    return message("tools/list", **({"cursor": cursor} if cursor else {}))


def test_a_name_is_unknown_only_off_a_whole_list() -> None:
    names = Names()
    assert names.known(UP, "echo") is None  # nothing seen: cannot tell
    names.reader(UP, listing())({"tools": [{"name": "echo"}], "nextCursor": "2"})
    assert names.known(UP, "echo") is None  # a first page is not the list
    names.reader(UP, listing())({"tools": [{"name": "echo"}, {"name": 7}]})
    assert (names.known(UP, "echo"), names.known(UP, "other")) == (True, False)
    names.reader(UP, listing("2"))({"tools": [{"name": "paged"}]})  # a page adds
    assert names.known(UP, "paged") is True
    names.reader(UP, listing())({"tools": []})  # a whole list replaces
    assert names.known(UP, "echo") is False
    names.reader(UP, listing())({"content": []})  # not a list: nothing learned
    assert names.known(UP, "echo") is False
    names.learn(UP, (f"t{i}" for i in range(MAX_NAMES + 1)), whole=True)
    assert names.known(UP, "anything") is None  # too long to keep: cannot tell


def test_a_caller_looks_again_at_most_every_relist_s() -> None:
    clock, relists = Clock(), Relists()
    assert relists.may("alice", clock())
    assert not relists.may("alice", clock())
    assert relists.may("bob", clock())  # per caller
    clock.advance(RELIST_S)
    assert relists.may("alice", clock())


async def test_a_fresh_list_in_flight_is_waited_for_not_repeated() -> None:
    clock, names = Clock(), Names()
    started, release, runs = asyncio.Event(), asyncio.Event(), []

    async def fresh() -> None:
        runs.append(1)
        started.set()
        await release.wait()
        names.learn(UP, ["added"], whole=True)

    first = asyncio.create_task(names.look_again(UP, "alice", clock(), fresh))
    await started.wait()
    # alice again within RELIST_S, and bob: both wait for the list in flight
    later = [asyncio.create_task(names.look_again(UP, who, clock(), fresh))
             for who in ("alice", "bob")]
    release.set()
    await asyncio.gather(first, *later)
    assert runs == [1] and names.known(UP, "added") is True
    await names.look_again(UP, "alice", clock(), fresh)  # no list in flight, too soon
    assert runs == [1]

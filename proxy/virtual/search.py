"""Tool search's ranking: a BM25 index (the `bm25s` library) over the tools one caller may see
on a virtual endpoint, and the cache of those indexes.

A tool's text is its exposed name and title (counted twice: the words a caller's task names
most often), its description, and its parameters' names and descriptions; names are split
into words (`create_issue`, `createIssue`: "create issue"), words stemmed (Snowball English),
English stop words left out. An index is built once per distinct list of tools (`Indexes`: keyed
by the endpoint and a digest of the list as the caller sees it), so two callers who see the same
tools share one, a caller who sees fewer has its own, and a list that changed builds a new one
at its next search; a search is one tokenized query and one scoring pass, ties broken by the
list's order so the same query always answers the same tools.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import bm25s  # type: ignore[import-untyped]
import numpy as np
import orjson
import Stemmer  # type: ignore[import-not-found]
from bm25s.stopwords import STOPWORDS_EN  # type: ignore[import-untyped]

__all__ = ["Index", "Indexes", "digest", "said", "words"]

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP = frozenset(STOPWORDS_EN)
_STEMMER = Stemmer.Stemmer("english")
MAX_QUERY = 1000  # characters of a query read (what a task description needs)
# a task's everyday words, and the words tools name the same thing by: a query is searched by
# both (BM25 matches words, and "make a folder" shares none with create_directory)
SAYINGS = {
    "folder": "directory", "folders": "directories", "make": "create", "new": "create",
    "save": "write", "store": "write set", "show": "read get view", "view": "read get",
    "open": "read get", "see": "read get list", "remove": "delete", "erase": "delete",
    "rename": "move", "bug": "issue", "ticket": "issue", "pr": "pull request",
    "javascript": "evaluate script", "js": "evaluate script", "script": "evaluate",
    "remember": "memory observation entity", "recall": "memory search node",
    "history": "log", "height": "elevation", "altitude": "elevation", "high": "elevation",
    "sea": "elevation",
}


def words(text: str) -> list[str]:
    """Lower-case word stems of `text`, its names split (`read_file`, `readFile`), no stop
    words."""
    found = [w.lower() for w in _WORD.findall(_CAMEL.sub(" ", text))]
    stems: list[str] = _STEMMER.stemWords([w for w in found if w not in _STOP])
    return stems


def said(query: str) -> str:
    """The query, with the words tools use for its everyday ones (`SAYINGS`) added."""
    extra = [SAYINGS[w] for w in _WORD.findall(query.lower()) if w in SAYINGS]
    return f"{query} {' '.join(extra)}" if extra else query


def text_of(tool: dict[str, Any]) -> str:
    """What a tool is searched by: name and title twice, description, parameters."""
    parts = [str(tool.get("name") or ""), str(tool.get("title") or "")] * 2
    parts.append(str(tool.get("description") or ""))
    schema = tool.get("inputSchema")
    props = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(props, dict):
        for name, prop in props.items():
            parts.append(str(name))
            if isinstance(prop, dict) and isinstance(prop.get("description"), str):
                parts.append(prop["description"])
    return " ".join(parts)


def digest(tools: Sequence[dict[str, Any]]) -> bytes:
    """What identifies a list of tools as a caller sees it (names, definitions, order)."""
    return hashlib.blake2b(orjson.dumps(tools), digest_size=16).digest()


class Index:
    """The tools of one list, ranked by BM25 for a query."""

    def __init__(self, tools: Sequence[dict[str, Any]]) -> None:
        self.tools = tuple(tools)
        vocab: dict[str, int] = {}
        corpus = [[vocab.setdefault(w, len(vocab)) for w in words(text_of(t))]
                  for t in self.tools]
        self._vocab = vocab
        self._bm25 = bm25s.BM25()
        if self.tools:
            # an id list per tool and the vocabulary: bm25s's own tokenizer's output shape
            self._bm25.index(bm25s.tokenization.Tokenized(
                ids=corpus, vocab={w: i for w, i in vocab.items()}), show_progress=False)

    def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """The best `limit` tools for `query`, best first; none that shares no word with it."""
        ids = [i for w in words(said(query[:MAX_QUERY]))
               if (i := self._vocab.get(w)) is not None]
        if not ids or not self.tools:
            return []
        scores = self._bm25.get_scores(ids)
        order = np.argsort(-scores, kind="stable")[:limit]
        return [self.tools[i] for i in order if scores[i] > 0]


class Indexes:
    """The indexes in use, by endpoint and list digest; the least recently used go first."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._held: OrderedDict[tuple[str, bytes], Index] = OrderedDict()
        self.built = 0  # how many were built (tests: once per list, not per search)

    async def of(self, endpoint: str, tools: Sequence[dict[str, Any]]) -> Index:
        """The index of this list, built (off the event loop: a thousand tools take tens of
        milliseconds) only when no caller's list was this one."""
        key = (endpoint, digest(tools))
        index = self._held.get(key)
        if index is not None:
            self._held.move_to_end(key)
            return index
        index = await asyncio.to_thread(Index, tools)
        self._held[key] = index
        self.built += 1
        if len(self._held) > self.size:
            self._held.popitem(last=False)
        return index

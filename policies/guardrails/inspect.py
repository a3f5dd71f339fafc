"""Walking a call's arguments, a result or a notification's data for what a `Detector` finds,
redacting in place.

Every string is read, at any depth and under any key: in arguments, structured content and
notification data nothing is skipped, whatever a key is called. The only strings left unread
are those the protocol puts there as binary or metadata, where it puts them (`_Walk.result`):
an `image` or `audio` content block's base64 `data`, a resource's base64 `blob` (an embedded
`resource` block's, or one of a `resources/read` result's `contents`), and the result's own
`_meta`. A content block's `uri`, `mimeType`, `annotations` and `_meta`, and a text resource's
`text`, are read like any other string.

The strings are scanned together, joined by a line break, so a result of many small strings
(structured content) costs one scan, not one per string; a finding is cut to the string it lies
in. Strings next to each other in one array, and the texts of adjacent text content blocks, are
also scanned joined with nothing between them, so a secret split across two of them is found;
of that scan, only a finding across a junction counts (the rest the first scan found), cut to
each string it covers."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from policies.guardrails.detect import Detector, Finding, apply

SEPARATOR = "\n"

Leaf = tuple[dict[str, Any] | list[Any], Any, str]  # (container, key or index, the string)
Walk = Callable[[Any], None]


def scan(node: Any, detector: Detector, redact: bool, *, result: bool = False
         ) -> tuple[Any, set[str]]:
    """(`node`, its strings redacted in place when `redact`; the kinds found). A bare string
    comes back replaced. `result`: `node` is a result, whose binary content is not read."""
    if isinstance(node, str):
        if redact:
            return detector.redact(node)
        return node, {f.kind for f in detector.find(node)}
    walk = _Walk()
    (walk.result if result else walk.any)(node)
    leaves = walk.leaves
    if not leaves:
        return node, set()
    texts = [text for _, _, text in leaves]
    found = list(_cut(detector.find(SEPARATOR.join(texts)), texts, range(len(leaves)),
                      len(SEPARATOR), across=False))
    for run in walk.runs:  # adjacent strings, joined: what lies across them
        joined = [texts[j] for j in run]
        found.extend(_cut(detector.find("".join(joined)), joined, run, 0, across=True))
    if not found:
        return node, set()
    if not redact:
        return node, {f.kind for _, f in found}
    per_leaf: dict[int, list[Finding]] = {}
    for j, f in found:
        per_leaf.setdefault(j, []).append(f)
    kinds: set[str] = set()
    for j, spans in per_leaf.items():
        container, key, text = leaves[j]
        container[key], done = apply(text, spans)
        kinds |= done
    return node, kinds


def _cut(found: list[Finding], texts: list[str], ids: Iterable[int], gap: int, across: bool
         ) -> Iterator[tuple[int, Finding]]:
    """Each finding in `texts` joined (`gap` characters between two), as (the id of a text it
    covers, its span there); `across`: only those that cover more than one text."""
    if not found:
        return
    ids = list(ids)
    starts = list(itertools.accumulate((len(t) + gap for t in texts[:-1]), initial=0))
    for f in found:
        first = bisect.bisect_right(starts, f.start) - 1
        last = bisect.bisect_right(starts, f.end - 1) - 1
        if across and first == last:
            continue
        for i in range(first, last + 1):  # a span across strings (a key block) cut to each
            start = starts[i]
            cut = Finding(f.kind, max(f.start, start) - start,
                          min(f.end, start + len(texts[i])) - start)
            if cut.end > cut.start:
                yield ids[i], cut


class _Walk:
    """The strings of a node to read (`leaves`), and the runs of adjacent ones (`runs`: leaf
    indices, two or more)."""

    __slots__ = ("leaves", "runs")

    def __init__(self) -> None:
        self.leaves: list[Leaf] = []
        self.runs: list[list[int]] = []

    def any(self, node: Any) -> None:
        """Arguments, structured content, notification data: everything."""
        if isinstance(node, dict):
            self._dict(node)
        elif isinstance(node, list):
            self._list(node, self.any)

    def result(self, node: Any) -> None:
        """A tools/call, prompts/get or resources/read result: all but its `_meta` and the
        binary data of its content blocks and resources."""
        self._shaped(node, ("_meta",), {"_meta": _unread, "content": self._blocks,
                                        "contents": self._resources,
                                        "messages": self._messages})

    def _blocks(self, node: Any) -> None:  # a tool result's or a prompt message's content
        self._many(node, self._block)

    def _resources(self, node: Any) -> None:  # a resources/read result's contents
        self._many(node, self._resource)

    def _messages(self, node: Any) -> None:  # a prompts/get result's messages
        self._many(node, self._message)

    def _block(self, node: Any) -> None:
        kind = node.get("type") if isinstance(node, dict) else None
        if kind in ("image", "audio"):
            self._shaped(node, ("data",))
        elif kind == "resource":
            self._shaped(node, (), {"resource": self._resource})
        else:
            self.any(node)

    def _resource(self, node: Any) -> None:
        self._shaped(node, ("blob",))

    def _message(self, node: Any) -> None:
        self._shaped(node, (), {"content": self._blocks})

    def _many(self, node: Any, walk: Walk) -> None:
        """A list of what `walk` reads, or one."""
        if isinstance(node, list):
            self._list(node, walk)
        else:
            walk(node)

    def _shaped(self, node: Any, unread: tuple[str, ...] = (),
                walks: dict[str, Walk] | None = None) -> None:
        """An object of a known shape (`_dict`); anything else, all of it (`any`)."""
        if isinstance(node, dict):
            self._dict(node, unread, walks)
        else:
            self.any(node)

    def _dict(self, node: dict[str, Any], unread: tuple[str, ...] = (),
              walks: dict[str, Walk] | None = None) -> None:
        """Each value of `node`: a string is a leaf unless its key is `unread`; a container is
        walked by its key's walk (`walks`), else by `any`."""
        for key, value in node.items():
            if isinstance(value, str):
                if key not in unread:
                    self.leaves.append((node, key, value))
            elif isinstance(value, (dict, list)):
                (walks.get(key, self.any) if walks else self.any)(value)

    def _list(self, items: list[Any], walk: Walk) -> None:
        """Each item of `items`; its strings and text content blocks next to each other make
        a run."""
        run: list[int] = []
        for i, value in enumerate(items):
            if isinstance(value, str):
                run.append(len(self.leaves))
                self.leaves.append((items, i, value))
                continue
            if isinstance(value, dict) and value.get("type") == "text" and \
                    isinstance(value.get("text"), str):
                run.append(len(self.leaves))
                self.leaves.append((value, "text", value["text"]))
                self._dict(value, ("text",))  # its annotations and _meta
                continue
            self._end(run)
            run = []
            if isinstance(value, (dict, list)):
                walk(value)
        self._end(run)

    def _end(self, run: list[int]) -> None:
        if len(run) > 1:
            self.runs.append(run)


def _unread(_node: Any) -> None:
    """What is not read: a result's `_meta`."""
